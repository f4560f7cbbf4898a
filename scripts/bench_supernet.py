"""Supernet step time vs the sum of its candidate blocks' own forward+backward times.

The full FBNet supernet computes every candidate of every layer, so the floor for one
training step is the sum over (layer, candidate) of that block's forward+backward time on its
input, plus stem and head. This prints the ratio (supernet step / sum of parts) measured
side by side: each round times one supernet step and every part once, in interleaved order,
so a slow spell of the machine hits both alike; the ratio is taken per round and its median
and quartiles are reported (scripts/bench_modes.py prints the same ratio beside the modes).

    python -m scripts.bench_supernet                    # fbnet_cifar10, batch 64, synthetic
    python -m scripts.bench_supernet --rounds 7 --threads 2
"""

from __future__ import annotations

import argparse
import statistics

import torch

from fbnas.search_space import load_space
from fbnas.supernet import Supernet
from scripts.common import SPACES, Parts, Spread, interleave, random_batch, supernet_fwd_bwd


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(SPACES["fbnet_cifar10"]))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    space = load_space(args.config)
    net = Supernet(space).to(dev).train()
    x, y = random_batch(space, args.batch, dev)
    parts = Parts(net, space, x)
    print(f"== supernet step vs sum of parts: {space.name}, batch {args.batch}, {args.device}, "
          f"{args.threads} thread(s), {parts.blocks} candidate blocks + stem + head")

    def show(r: int, got: dict[str, float]) -> None:
        print(f"round {r + 1}: supernet step {got['net'] * 1e3:.0f} ms, sum of parts "
              f"{got['parts'] * 1e3:.0f} ms, ratio {got['net'] / got['parts']:.3f}", flush=True)

    times = interleave({"net": lambda: supernet_fwd_bwd(net, x, y), "parts": parts},
                       args.rounds, dev, warmup=1, on_round=show)
    ratios = [a / b for a, b in zip(times["net"], times["parts"], strict=True)]
    s = Spread.of(ratios)
    print(f"supernet step median {statistics.median(times['net']) * 1e3:.0f} ms; sum of parts "
          f"median {statistics.median(times['parts']) * 1e3:.0f} ms")
    print(f"overhead ratio (supernet / sum of parts): median {s.median:.3f} "
          f"(IQR {s.q1:.3f}-{s.q3:.3f}, {args.rounds} rounds)")


if __name__ == "__main__":
    main()
