"""Search modes side by side: step time and activation memory of full, single_path and
two_path, full with and without checkpoint_activations, and the supernet overhead ratio.

What is measured (synthetic input, the space of --config, optionally cut to --layers
searchable layers, see truncated()):

  step time      one weight step + one θ step, as SearchTrainer does them (the same Supernet
                 calls: sample_path, forward, CE backward + grad clipping + SGD for the
                 weights; loss with cost term, autograd.grad to θ + Adam for θ). One network
                 is shared by all variants (mode and checkpointing switched per call). Each
                 round times every variant once, in forward order on even rounds and reverse
                 order on odd ones, so machine drift hits all alike; reported: median and
                 min-max over rounds, and ratios of medians.
  activations    bytes of the distinct tensor storages autograd saves for backward during one
                 forward (torch.autograd.graph.saved_tensors_hooks; parameters and buffers
                 excluded): deterministic and device-independent. For a plain forward every
                 saved tensor is alive at the end of it, so this is the activation peak. With
                 checkpoint_activations the layers' own saves go to the checkpoint instead and
                 are dropped: what is held is the outer saves (stem, head) plus each
                 checkpointed layer's input; during backward one layer at a time is recomputed,
                 so the reported peak is held + the largest layer's saves (excluding its input,
                 counted already). single_path / two_path depend on the sampled candidates:
                 mean [min-max] over --mem-samples draws. Gradients, optimizer state and
                 backward temporaries are not included. On CUDA the allocator's peak
                 (max_memory_allocated minus what was allocated before the step) of one
                 weight + θ step is printed as well.
  overhead ratio (supernet forward+backward, full mode, m without grad as in a weight step,
                 CE loss) / (sum over parts of each part's own forward+backward: the stem on
                 the input, every candidate block of every layer on a random input of that
                 layer's shape (requires_grad, as the supernet needs input gradients), the head
                 on a random input of its shape; backward of out.sum()). Both are timed in the
                 same rounds, parts in alternating order; the ratio is taken per round.

    python scripts/bench_modes.py                       # fbnet_cifar10, batch 32, CPU
    python scripts/bench_modes.py --repeats 2 --layers 3   # a quick check that it works
    python scripts/bench_modes.py --device cuda --batch 128
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fbnas.config import load_config
from fbnas.loss import build_loss
from fbnas.search_space import SearchSpace
from fbnas.supernet import Supernet

ROOT = Path(__file__).resolve().parents[1]
# (label, search.mode, checkpoint_activations)
VARIANTS = [("full", "full", False), ("single_path", "single_path", False),
            ("two_path", "two_path", False), ("full+ckpt", "full", True)]
TAU = 1.0
MIB = 2.0**20


def truncated(space: SearchSpace, n: int) -> tuple[SearchSpace, str]:
    """The space with n searchable layers (stem and head kept), and a note saying how.

    n >= number of stages: every stage keeps at least one layer (so every stride, and the
    head's input resolution, is as in the full space) and repeats are cut in proportion.
    n < number of stages: n stages, strided ones first, one layer each.
    """
    if n <= 0 or n >= space.num_layers:
        return space, ""
    d = space.to_dict()
    stages = d["stages"]
    if n >= len(stages):
        counts = [1] * len(stages)
        while sum(counts) < n:  # give a layer to the stage furthest below its share
            i = max((i for i, st in enumerate(stages) if counts[i] < st["repeats"]),
                    key=lambda i: (stages[i]["repeats"] - counts[i]) / stages[i]["repeats"])
            counts[i] += 1
        how = f"repeats per stage {counts} instead of {[st['repeats'] for st in stages]}"
    else:
        order = sorted(range(len(stages)), key=lambda i: (stages[i]["stride"] == 1, i))
        keep = set(order[:n])
        counts = [1 if i in keep else 0 for i in range(len(stages))]
        how = (f"one layer from each of stages {sorted(keep)} (strided first; the other "
               "stages dropped)")
    d["stages"] = [{**st, "repeats": c} for st, c in zip(stages, counts, strict=True) if c]
    d["name"] = f"{d['name']}-{n}layers"
    return SearchSpace.from_dict(d, "truncated space"), how


def spread(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


class SavedBytes:
    """Distinct storages saved for backward while active, attributed to the MixedOp layer that
    saved them (None: stem, head, loss)."""

    def __init__(self, net: Supernet):
        self.exclude = {self._key(t)[0] for t in (*net.parameters(), *net.buffers())}
        self.owner: dict[int, int | None] = {}  # storage key -> layer that saved it first
        self.by_layer: dict[int | None, int] = defaultdict(int)
        self.inputs: dict[int, tuple[int, int]] = {}  # layer -> (storage key, bytes)
        self.layer: int | None = None
        self.handles = []
        for li, op in enumerate(net.mixed):
            self.handles.append(op.register_forward_pre_hook(self._enter(li)))
            self.handles.append(op.register_forward_hook(self._leave))

    @staticmethod
    def _key(t: torch.Tensor) -> tuple[int, int]:
        try:
            st = t.untyped_storage()
            return st.data_ptr(), st.nbytes()
        except (RuntimeError, NotImplementedError):  # opaque (e.g. mkldnn) tensors
            return id(t), t.numel() * t.element_size()

    def _enter(self, li):
        def hook(_mod, args):
            self.layer = li
            self.inputs[li] = self._key(args[0])
        return hook

    def _leave(self, *_):
        self.layer = None

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key, nbytes = self._key(t)
        if key not in self.exclude and key not in self.owner:
            self.owner[key] = self.layer
            self.by_layer[self.layer] += nbytes
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def total(self) -> int:
        return sum(self.by_layer.values())

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def saved_bytes(net: Supernet, x, y, loss, p, ckpt: bool) -> tuple[int, int]:
    """(held at the end of the forward, peak during backward) in bytes, for weights `p`."""
    def forward(meter):
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
            logits, cost = net(x, m=p.m, active=p.active, cost_m=p.cost_m)
            return loss(logits, y, cost).total
    net.checkpoint_activations = False
    plain = SavedBytes(net)
    try:
        forward(plain)
    finally:
        plain.close()
    if not ckpt:
        return plain.total(), plain.total()
    net.checkpoint_activations = True
    meter = SavedBytes(net)
    try:
        forward(meter)
    finally:
        meter.close()
        net.checkpoint_activations = False
    held_inputs = {k: b for k, b in meter.inputs.values() if k not in meter.owner}
    held = meter.total() + sum(held_inputs.values())
    # recomputing layer l in backward re-creates its saves (its input is held already)
    recompute = max(plain.by_layer[li] - (b if plain.owner.get(k, -1) == li else 0)
                    for li, (k, b) in plain.inputs.items())
    return held, held + recompute


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/fbnet_cifar10.yaml"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layers", type=int, default=0,
                    help="only N searchable layers (0: all; see truncated())")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (at most)")
    ap.add_argument("--budget", type=float, default=200.0,
                    help="seconds for the whole run: fewer timed rounds (not below 3) if the "
                         "warm-up round says they won't fit")
    ap.add_argument("--mem-samples", type=int, default=3,
                    help="sampled paths averaged for single_path/two_path memory")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    full_space = load_config(args.config).space
    space, how = truncated(full_space, args.layers)
    cands = space.layer_candidates()
    costs = [[float(i + 1) for i in range(len(c))] for c in cands]  # any positive table
    net = Supernet(space, costs, fixed_cost=1.0).to(dev).train()
    loss = build_loss({"kind": "fbnet", "alpha": 0.2, "beta": 0.6})
    w_opt = torch.optim.SGD(net.weight_parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    th_opt = torch.optim.Adam(net.arch_parameters(), lr=0.01, weight_decay=5e-4)
    h, w = space.macro.input_size
    x = torch.randn(args.batch, space.macro.in_channels, h, w, device=dev)
    y = torch.randint(0, space.macro.num_classes, (args.batch,), device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn) -> float:
        sync()
        t = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t

    def search_step(mode: str, ckpt: bool) -> None:
        """SearchTrainer.weight_step + theta_step (without logging and NaN checks)."""
        net.mode, net.checkpoint_activations = mode, ckpt
        with torch.no_grad():
            p = net.sample_path(TAU)
        logits, _ = net(x, m=p.m, active=p.active, cost_m=p.cost_m)
        ce = F.cross_entropy(logits, y)
        w_opt.zero_grad(set_to_none=True)
        ce.backward()
        nn.utils.clip_grad_norm_(net.weight_parameters(), 5.0)
        w_opt.step()
        p = net.sample_path(TAU)
        logits, cost = net(x, m=p.m, active=p.active, cost_m=p.cost_m)
        theta = net.arch_parameters()
        grads = torch.autograd.grad(loss(logits, y, cost).total, theta)
        for t, g in zip(theta, grads, strict=True):
            t.grad = g
        th_opt.step()
        th_opt.zero_grad(set_to_none=True)

    def supernet_fwd_bwd() -> None:
        net.mode, net.checkpoint_activations = "full", False
        with torch.no_grad():
            m = net.sample_weights(TAU)
        logits, _ = net(x, m=m)
        F.cross_entropy(logits, y).backward()
        net.zero_grad(set_to_none=True)

    # the parts: stem, every candidate of every layer, head, each on an input of its shape
    parts = [(net.stem, x)]
    for la, mixed in zip(space.layers(), net.mixed, strict=True):
        inp = torch.randn(args.batch, la.c_in, la.h, la.w, device=dev, requires_grad=True)
        parts += [(block, inp) for block in mixed.candidates]
    c_head, _, hh, ww, _ = space.macro.head_shape()
    parts.append((net.head, torch.randn(args.batch, c_head, hh, ww, device=dev,
                                        requires_grad=True)))

    def part_step(module, inp) -> None:
        out = module(inp)
        out.float().sum().backward()
        module.zero_grad(set_to_none=True)
        inp.grad = None

    n_layers = len(cands)
    note = ("" if space is full_space else
            f" -- ONLY {n_layers} OF {full_space.num_layers} SEARCHABLE LAYERS (--layers)")
    print(f"== search modes: {space.name}, {n_layers} searchable layers x "
          f"{'/'.join(sorted({str(len(c)) for c in cands}))} candidates, batch {args.batch}, "
          f"{h}x{w}, {dev}, {args.threads} thread(s), synthetic data{note}", flush=True)
    if how:
        print(f"   --layers {args.layers}: {how}; figures are for this smaller network")

    # ---- activation memory (deterministic; forward only) ---------------------------------------
    print("\n-- activations saved for backward (MiB); θ step (m requires grad) and weight step "
          "(m without grad)")
    mem: dict[str, dict[str, tuple[float, float, float]]] = {}
    for label, mode, ckpt in VARIANTS:
        draws = 1 if mode == "full" else args.mem_samples
        row = {}
        for step in ("theta", "w"):
            held, peak = [], []
            for k in range(draws):
                torch.manual_seed(args.seed + 1000 + k)
                with torch.set_grad_enabled(step == "theta"):
                    p = net.sample_path(TAU, mode=mode)
                a, b = saved_bytes(net, x, y, loss, p, ckpt)
                held.append(a / MIB)
                peak.append(b / MIB)
            row[step] = (statistics.mean(peak), min(peak), max(peak))
            if ckpt:
                row[step + "_held"] = (statistics.mean(held), min(held), max(held))
        mem[label] = row
        extra = (f"  (held after forward: θ {row['theta_held'][0]:.1f}, w {row['w_held'][0]:.1f};"
                 " peak = held + largest recomputed layer)" if ckpt else "")
        rng = "" if draws == 1 else f" [{row['theta'][1]:.1f}-{row['theta'][2]:.1f}]"
        print(f"{label:12s} θ step {row['theta'][0]:8.1f}{rng}  w step {row['w'][0]:8.1f}"
              f"{extra}", flush=True)
    net.checkpoint_activations = False
    if dev.type == "cuda":
        print("-- CUDA allocator peak of one weight + θ step (MiB, above what was allocated)")
        for label, mode, ckpt in VARIANTS:
            search_step(mode, ckpt)  # optimizer state exists before measuring
            sync()
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
            search_step(mode, ckpt)
            sync()
            print(f"{label:12s} {(torch.cuda.max_memory_allocated(dev) - base) / MIB:8.1f}")

    # ---- time ---------------------------------------------------------------------------------
    names = [v[0] for v in VARIANTS] + ["supernet fwd+bwd", "sum of parts"]

    def one_round(order_flip: bool) -> dict[str, float]:
        jobs = [(label, (lambda mo=mo, ck=ck: search_step(mo, ck))) for label, mo, ck in VARIANTS]
        jobs.append(("supernet fwd+bwd", supernet_fwd_bwd))
        jobs.append(("sum of parts", None))
        out = {}
        for label, fn in (reversed(jobs) if order_flip else jobs):
            if fn is None:
                idx = range(len(parts))
                out[label] = sum(timed(lambda i=i: part_step(*parts[i]))
                                 for i in (reversed(idx) if order_flip else idx))
            else:
                out[label] = timed(fn)
        return out

    t_warm = time.perf_counter()
    one_round(False)  # warm-up (allocator, optimizer state, kernels)
    warm = time.perf_counter() - t_warm
    left = args.budget - (time.perf_counter() - t_start)
    rounds = args.repeats
    if warm * rounds > left:
        rounds = max(min(3, args.repeats), int(left / warm))
        if rounds < args.repeats:
            print(f"\n(note: the warm-up round took {warm:.1f}s: {rounds} of --repeats "
                  f"{args.repeats} rounds fit --budget {args.budget:.0f}s"
                  + ("; consider --layers" if warm * rounds > left else "") + ")")
    print(f"\n-- time per round (s): {rounds} rounds after one warm-up round, alternating order",
          flush=True)
    times: dict[str, list[float]] = {n: [] for n in names}
    overhead = []
    for r in range(rounds):
        res = one_round(bool(r % 2))
        for n in names:
            times[n].append(res[n])
        overhead.append(res["supernet fwd+bwd"] / res["sum of parts"])
        print(f"round {r + 1}: " + ", ".join(f"{n} {res[n]:.3f}" for n in names), flush=True)

    print("\n-- step time, weight step + θ step (s): median [min-max]")
    for n in names:
        med, lo, hi = spread(times[n])
        print(f"{n:17s} {med:8.3f} [{lo:.3f}-{hi:.3f}]")
    med = {n: statistics.median(times[n]) for n in names}
    print("\n-- ratios (of medians; memory: θ-step activations, mean over draws)")
    full_mem = mem["full"]["theta"][0]
    for n in ("single_path", "two_path"):
        print(f"{n + ' speed-up over full:':32s} {med['full'] / med[n]:6.2f}x   activation "
              f"memory {mem[n]['theta'][0] / full_mem:.3f} of full")
    print(f"checkpointing (full+ckpt / full): step time {med['full+ckpt'] / med['full']:.3f}x, "
          f"activation peak {mem['full+ckpt']['theta'][0] / full_mem:.3f} "
          f"(held after forward {mem['full+ckpt']['theta_held'][0] / full_mem:.3f}); weight "
          f"step peak {mem['full+ckpt']['w'][0] / mem['full']['w'][0]:.3f}")
    q = statistics.quantiles(overhead, n=4) if len(overhead) > 1 else [overhead[0]] * 3
    print(f"supernet overhead ratio (full fwd+bwd / sum of its parts' fwd+bwd): median "
          f"{statistics.median(overhead):.3f} (IQR {q[0]:.3f}-{q[2]:.3f}, {rounds} rounds; "
          f"{len(parts) - 2} candidate blocks + stem + head)")
    print(f"total {time.perf_counter() - t_start:.0f}s{note}")


if __name__ == "__main__":
    main()
