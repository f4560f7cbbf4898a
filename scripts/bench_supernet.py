"""Supernet step time vs the sum of its candidate blocks' own forward+backward times.

The full FBNet supernet computes every candidate of every layer, so the floor for one
training step is the sum over (layer, candidate) of that block's forward+backward time on its
input, plus stem and head. This prints the ratio (supernet step / sum of parts) measured
side by side: each round times one supernet step and every part once, in interleaved order,
so a slow spell of the machine hits both alike; the ratio is taken per round and its median
and quartiles are reported.

    python scripts/bench_supernet.py                    # fbnet_cifar10, batch 64, synthetic
    python scripts/bench_supernet.py --rounds 7 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fbnas.search_space import load_space
from fbnas.supernet import Supernet

ROOT = Path(__file__).resolve().parents[1]


def quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/fbnet_cifar10.yaml"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    space = load_space(args.config)
    net = Supernet(space).to(dev).train()
    h, w = space.macro.input_size
    x = torch.randn(args.batch, space.macro.in_channels, h, w, device=dev)
    y = torch.randint(0, space.macro.num_classes, (args.batch,), device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def supernet_step():
        with torch.no_grad():
            m = net.sample_weights(1.0)
        logits, _ = net(x, m=m)
        F.cross_entropy(logits, y).backward()
        net.zero_grad(set_to_none=True)

    # The parts: stem, every candidate of every layer, head — each on an input of its shape.
    parts = []
    _, c, s, _, _ = space.macro.stem_shape()
    parts.append(("stem", net.stem, x.clone()))
    for la, mixed in zip(space.layers(), net.mixed, strict=True):
        inp = torch.randn(args.batch, la.c_in, la.h, la.w, device=dev, requires_grad=la.index > 0)
        for name, block in zip(mixed.op_names, mixed.candidates, strict=True):
            parts.append((f"L{la.index}:{name}", block, inp))
    c_in, _, hh, ww, _ = space.macro.head_shape()
    parts.append(("head", net.head, torch.randn(args.batch, c_in, hh, ww, device=dev,
                                                requires_grad=True)))

    def part_step(module, inp):
        out = module(inp)
        if out.requires_grad:  # an identity skip on the (grad-free) first input has no graph
            out.float().sum().backward()
        module.zero_grad(set_to_none=True)
        if inp.grad is not None:
            inp.grad = None

    def timed(fn):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t

    print(f"== supernet step vs sum of parts: {space.name}, batch {args.batch}, {args.device}, "
          f"{args.threads} thread(s), {len(parts) - 2} candidate blocks + stem + head")
    # warm-up: one of each
    supernet_step()
    for _, mod, inp in parts:
        part_step(mod, inp)
    ratios, steps, sums = [], [], []
    for r in range(args.rounds):
        order = list(range(len(parts)))
        if r % 2:
            order.reverse()
        t_net = timed(supernet_step)
        t_parts = sum(timed(lambda i=i: part_step(parts[i][1], parts[i][2])) for i in order)
        ratios.append(t_net / t_parts)
        steps.append(t_net)
        sums.append(t_parts)
        print(f"round {r + 1}: supernet step {t_net * 1e3:.0f} ms, sum of parts "
              f"{t_parts * 1e3:.0f} ms, ratio {t_net / t_parts:.3f}", flush=True)
    q1, med, q3 = quartiles(ratios)
    print(f"supernet step median {statistics.median(steps) * 1e3:.0f} ms; sum of parts median "
          f"{statistics.median(sums) * 1e3:.0f} ms")
    print(f"overhead ratio (supernet / sum of parts): median {med:.3f} "
          f"(IQR {q1:.3f}-{q3:.3f}, {args.rounds} rounds)")


if __name__ == "__main__":
    main()
