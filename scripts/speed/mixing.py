"""What a full-mode supernet step launches and keeps: the mixing of candidates with m_i folded
into each candidate's last BatchNorm ("folded") and the candidates computed together
where they read the same input ("together", fbnas.blocks.batched) against multiplying the outputs
one candidate at a time.

Counted, not timed (deterministic, device-independent): per forward + backward of one full-mode step
(m with a gradient, as in a θ step, and without, as in a weight step) the aten calls of BatchNorm,
convolution and multiply over activations (4-d results), by a dispatch-mode counter; and the bytes
autograd saves for backward (scripts.common.SavedBytes: distinct storages, parameters and buffers
excluded). "unfolded" is the same supernet with every MixedOp's `folds` off and nothing computed
together: each candidate's output multiplied by m_i, as before the folding; "folded" folds m_i, one
candidate at a time (folding alone); "together" is the supernet as it is (folded and computed
together); "cheap" is it under `search.checkpoint_activations: cheap` (the convolutions' outputs
kept, BatchNorm, ReLU and the mixing recomputed in backward) and "recompute" under `true`
(everything recomputed). The ratios: together / unfolded, cheap / together. Besides SavedBytes
(which cannot see what checkpointing keeps), the resident memory the forward leaves held and the
peak over forward and backward (scripts.common.HeldBytes; run as a script, it re-executes itself
with glibc's mmap threshold fixed so that resident memory follows tensors: held matched SavedBytes
within 2% at batch 8, within 8% at batch 4, where both apply).

    python -m scripts.speed.mixing                                   # fbnet_imagenet at 56x56
    python -m scripts.speed.mixing --config configs/quickstart.yaml --input-size 16

`--time R` also times the θ step (forward + backward, one thread) of every variant in R
interleaved rounds and prints each one's median wall time, its spread and its ratio to
"unfolded" per round (median and range): at batch 2 and 16x16 (`--config
configs/fbnet_imagenet.yaml --input-size 16 --batch 2 --time 30`), where the arithmetic is
negligible, it is the CPU dispatch overhead that folding saves. Nothing else may run while
it times.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import statistics
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fbnas.config import load_config
from fbnas.search_space import SearchSpace
from fbnas.supernet import Supernet
from scripts.common import (
    MMAP_ENV,
    ROOT,
    HeldBytes,
    SavedBytes,
    exact_resident_memory,
    resident_bytes_exact,
)

KINDS = {"batch_norm": ("native_batch_norm", "_native_batch_norm_legit",
                        "_native_batch_norm_legit_no_training", "cudnn_batch_norm",
                        "miopen_batch_norm", "native_batch_norm_backward",
                        "cudnn_batch_norm_backward", "batch_norm_backward"),
         "convolution": ("convolution", "convolution_backward"),
         "mul (4-d)": ("mul",)}


class Calls(TorchDispatchMode):
    """aten calls by kind (KINDS); multiplies only where the result is 4-d (an activation)."""

    def __init__(self) -> None:
        super().__init__()
        self.n: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__.rstrip("_")
        for kind, names in KINDS.items():
            if name in names and (kind != "mul (4-d)" or (isinstance(out, torch.Tensor)
                                                         and out.dim() == 4)):
                self.n[kind] += 1
        return out


def one_by_one(net: Supernet, fold: bool = True) -> Supernet:
    """A copy that computes each candidate alone (and, without `fold`, multiplies its output
    by m_i)."""
    ref = copy.deepcopy(net)
    for op in ref.mixed:
        op.batches = None
        if not fold:
            op.folds = [False] * len(op.folds)
    return ref


def recomputing(net: Supernet, how: bool | str) -> Supernet:
    """A copy under `search.checkpoint_activations: how` (True: every activation recomputed
    in backward; "cheap": all but the convolutions' outputs)."""
    out = copy.deepcopy(net)
    out.checkpoint_activations = how
    return out


def measure(net: Supernet, x: torch.Tensor, theta_grad: bool
            ) -> tuple[Counter, int | None, int | None, int | None]:
    """(calls, bytes autograd saves (None under checkpointing, whose saves it cannot see),
    resident bytes held at the end of the forward, and the peak over forward and backward;
    both None without exact resident memory)."""
    for _ in range(2):  # first a step alike, so one-time allocations are made
        torch.manual_seed(0)
        s = net.sample_path(1.0, mode="full")
        m = s.m if theta_grad else [t.detach() for t in s.m]
        if resident_bytes_exact():  # a collection is slow with torch's heap: only when
            gc.collect()            # resident memory is read
        saved = None if net.checkpoint_activations else SavedBytes(net)
        with Calls() as c, HeldBytes() as mem:
            with saved or contextlib.nullcontext():
                logits, _ = net(x, m=m, active=s.active, cost_m=s.cost_m)
            held = mem.held()
            logits.float().logsumexp(1).sum().backward()
            peak = mem.peak()
        del logits
        net.zero_grad(set_to_none=True)
    return c.n, None if saved is None else saved.total(), held, peak


def step_seconds(net: Supernet, x: torch.Tensor, theta_grad: bool) -> float:
    """Wall time of one full-mode step's forward + backward (the path drawn outside it)."""
    s = net.sample_path(1.0, mode="full")
    m = s.m if theta_grad else [t.detach() for t in s.m]
    net.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logits, _ = net(x, m=m, active=s.active, cost_m=s.cost_m)
    logits.float().logsumexp(1).sum().backward()
    return time.perf_counter() - t0


def time_variants(nets: dict[str, Supernet], x: torch.Tensor, rounds: int) -> None:
    """Interleaved rounds (the variants in a rotating order), 3 warm-up steps each first."""
    names = list(nets)
    for n in names:
        for _ in range(3):
            step_seconds(nets[n], x, True)
    t: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t[n].append(step_seconds(nets[n], x, True))
    base = t[names[0]]
    print(f"θ step wall time, {rounds} interleaved rounds, {torch.get_num_threads()} thread(s):")
    for n in names:
        ratios = sorted(a / b for a, b in zip(t[n], base, strict=True))
        q = statistics.quantiles(t[n], n=4)
        print(f"  {n:9s} median {1e3 * statistics.median(t[n]):8.2f} ms (IQR "
              f"{1e3 * q[0]:.2f}-{1e3 * q[2]:.2f})  / {names[0]}: median "
              f"{statistics.median(ratios):.3f} [{ratios[0]:.3f}, {ratios[-1]:.3f}]")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "fbnet_imagenet.yaml"))
    ap.add_argument("--input-size", type=int, default=56)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--time", type=int, default=0, metavar="R",
                    help="also time the θ step of each variant in R interleaved rounds")
    a = ap.parse_args(argv)
    d = load_config(a.config, []).space.to_dict()
    d["input_size"] = a.input_size
    space = SearchSpace.from_dict(d)
    net = Supernet(space).train()
    x = torch.randn(a.batch, space.macro.in_channels, a.input_size, a.input_size)
    print(f"{a.config}: {space.num_layers} searchable layers, "
          f"{sum(len(op.candidates) for op in net.mixed)} candidates, input "
          f"{a.batch}x{space.macro.in_channels}x{a.input_size}x{a.input_size}, full mode, "
          f"forward + backward, CPU, torch {torch.__version__}")
    nets = {"unfolded": one_by_one(net, fold=False), "folded": one_by_one(net),
            "together": net, "cheap": recomputing(net, "cheap"),
            "recompute": recomputing(net, True)}
    print(f"{'step':12s} {'figure':16s} " + " ".join(f"{n:>10s}" for n in nets)
          + f" {'tog/unf':>7s} {'chp/tog':>7s}")
    for step, grad in (("weight step", False), ("θ step", True)):
        got = {n: measure(v, x, grad) for n, v in nets.items()}
        rows = [(kind, [got[n][0][kind] for n in nets]) for kind in KINDS]
        rows += [(label, [got[n][i] for n in nets]) for label, i in (
            ("saved MiB", 1), ("held MiB", 2), ("peak MiB", 3))]
        for label, vals in rows:
            mib = "MiB" in label
            cells = " ".join("         -" if v is None else f"{v / 2**20:10.2f}" if mib
                             else f"{v:10d}" for v in vals)
            print(f"{step:12s} {label:16s} {cells} {_ratio(vals[2], vals[0]):>7s} "
                  f"{_ratio(vals[3], vals[2]):>7s}")
    if not resident_bytes_exact():
        print(f"(held / peak: run as `python -m scripts.speed.mixing`, which sets {MMAP_ENV} "
              "so that resident memory follows tensors)")
    if a.time:
        torch.set_num_threads(1)
        time_variants(nets, x, a.time)


def _ratio(a: int | None, b: int | None) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


if __name__ == "__main__":
    exact_resident_memory()
    main()
