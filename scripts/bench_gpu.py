"""Search throughput per mode and precision, against a memory-bandwidth bound (issue 14).

Runs what `fbnas train` runs: SearchTrainer.weight_step + theta_step (one "step" = both, as in
the issue's table) on one synthetic batch held on the device, for every variant of
--modes x --precisions (bf16 with channels_last, as `search.precision: bf16` +
`search.channels_last: true`), each its own trainer. Variants are timed in interleaved rounds
(forward order on even rounds, reverse on odd), so drift hits all alike. Printed per variant:

  step s       median (min-max) over rounds of one weight + one θ step
  images/s     batch / step s
  peak GiB     CUDA: max_memory_allocated during the variant's steps (CPU: -)
  saved GiB    bytes of the distinct tensors autograd saves for backward in one forward
               (parameters and buffers excluded; sampled modes: that round's paths)
  bound s      saved bytes x --passes x 2 (the weight and the θ step) / the device's measured
               copy bandwidth (a large tensor copy, read + write): the time a step would take
               if moving its activations were all it did
  x bound      step s / bound s: how far the step is from that bound
  x first      the first variant's step time / this one's (speed-up)

    python scripts/bench_gpu.py --device cuda                       # ImageNet space, batch 96
    python scripts/bench_gpu.py --config configs/quickstart.yaml --batch 32 --steps 2 \\
        --rounds 3 --device cpu                                    # a quick check on a CPU
    python scripts/bench_gpu.py --compile both                     # search.compile off / on
    python scripts/bench_gpu.py --nan-check both   # the per-step NaN read against the deferred
    python scripts/bench_gpu.py --code /tmp/base   # the same table for a baseline checkout
    python scripts/bench_gpu.py --batch 32 --modes full --profile 15   # bf16 vs fp32, op by op

With --compile, inductor caches generated code under /tmp/torchinductor_$USER (remove it
after).

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _code_root() -> Path:
    """--code DIR: time the fbnas in DIR (another checkout: a baseline) instead of this one."""
    for i, a in enumerate(sys.argv):
        if a == "--code" and i + 1 < len(sys.argv):
            return Path(sys.argv[i + 1]).resolve()
        if a.startswith("--code="):
            return Path(a.split("=", 1)[1]).resolve()
    return ROOT


CODE = _code_root()
sys.path.insert(0, str(CODE))

from fbnas.config import load_config  # noqa: E402
from fbnas.run import close_logger  # noqa: E402
from fbnas.trainer import SearchTrainer  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, gib: float = 1.0, reps: int = 10) -> float:
    """Bytes per second of a large device-to-device copy (bytes read + bytes written)."""
    n = int(gib * 2**30) // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps + 1):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t0)
    del src, dst
    return 2 * n * 4 / statistics.median(times[1:])


def saved_bytes(t: SearchTrainer, x: torch.Tensor, y: torch.Tensor) -> int:
    """Distinct storages autograd saves for backward in one training forward of `t`'s model
    (a weight step's forward: paths as the mode samples them), parameters and buffers out."""
    own = {p.untyped_storage().data_ptr() for p in t.model.parameters()}
    own |= {b.untyped_storage().data_ptr() for b in t.model.buffers()}
    seen: dict[int, int] = {}

    def pack(v: torch.Tensor) -> torch.Tensor:
        s = v.untyped_storage()
        if s.data_ptr() not in own:
            seen[s.data_ptr()] = s.nbytes()
        return v

    t.model.train()
    with torch.no_grad():
        p = t.model.sample_path(t.tau, t.cfg.search.hard)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda v: v), t.prec.autocast():
        logits, _ = t.model(t.prec.input(x), m=p.m, active=p.active, cost_m=p.cost_m)
    del logits
    t.model.zero_grad(set_to_none=True)
    return sum(seen.values())


def profile_step(t: SearchTrainer, x: torch.Tensor, y: torch.Tensor, device: torch.device,
                 top: int) -> str:
    """torch.profiler's table of one weight + θ step, sorted by self device (or CPU) time."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=acts) as prof:
        t.weight_step(x, y)
        t.theta_step(x, y)
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=40)


def trainer(args, mode: str, precision: str, compiled: bool, check: str, work: Path
            ) -> SearchTrainer:
    # keys at their defaults are left out, so that a baseline checkout without them runs too
    sets = [f"search.mode={mode}", *([f"search.precision={precision}",
                                      "search.channels_last=true"] if precision == "bf16" else
                                     [f"search.precision={precision}"] if precision != "float32"
                                     else []),
            *([f"run.nan_check={check}"] if check != "auto" else []),
            *(["search.compile=true"] if compiled else []),
            "latency.cost=flops", "data.dataset=synthetic", f"data.batch_size={args.batch}",
            f"data.synthetic_size={4 * args.batch}", "data.val_fraction=0",
            f"search.device={args.device}",
            f"run.dir={work / f'{mode}-{precision}-{int(compiled)}-{check}'}",
            "run.progress=false", "run.tensorboard=false", *args.set]
    cfg = load_config(args.config, sets)
    t = SearchTrainer(cfg, cfg.run.dir)
    t.epoch = cfg.search.warmup_epochs  # θ active: weights sampled as the mode samples them
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(CODE / "configs" / "fbnet_imagenet.yaml"))
    ap.add_argument("--code", default=str(ROOT), metavar="DIR",
                    help="the fbnas checkout to time (default: this one); e.g. a baseline made "
                         "with `git worktree add /tmp/base e4987fe` (before issue 14's changes)")
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--device", default="auto", help="auto (cuda if present), cuda or cpu")
    ap.add_argument("--modes", default="full,two_path,single_path")
    ap.add_argument("--precisions", default="float32,bf16")
    ap.add_argument("--steps", type=int, default=5, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=float, default=3.0,
                    help="times a step moves its saved activations (written in forward, read "
                         "in backward, their gradient written once: 3)")
    ap.add_argument("--compile", default="off", choices=("off", "on", "both"),
                    help="search.compile for each variant: off, on, or both side by side")
    ap.add_argument("--nan-check", default="auto",
                    choices=("auto", "step", "deferred", "both"),
                    help="run.nan_check for each variant (auto: deferred on CUDA), or step and "
                         "deferred side by side: what the per-step host read of the non-finite "
                         "check costs")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after timing, profile one step of each variant and print its N "
                         "most expensive ops (self time on the device, or the CPU): where "
                         "bf16 / channels_last win or lose, op by op")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    args = ap.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    work = Path(tempfile.mkdtemp(prefix="fbnas_bench_gpu_"))
    comp = {"off": (False,), "on": (True,), "both": (False, True)}[args.compile]
    checks = ("step", "deferred") if args.nan_check == "both" else (args.nan_check,)
    variants = [(m, p, c, k) for m in args.modes.split(",") for p in args.precisions.split(",")
                for c in comp for k in checks]
    name = {v: f"{v[0]}, {v[1]}" + (" + channels_last" if v[1] == "bf16" else "")
            + (", compiled" if v[2] else "") + (f", nan_check {v[3]}" if len(checks) > 1
                                                 else "") for v in variants}
    bw = copy_bandwidth(device)
    print(f"{args.config}: batch {args.batch}, {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", torch {torch.__version__}; copy bandwidth {bw / 1e9:.0f} GB/s; fbnas from "
          f"{CODE}", flush=True)
    trainers, batch, saved, warm = {}, {}, {}, {}
    try:
        for v in variants:
            t = trainers[v] = trainer(args, *v, work)
            x, y = next(iter(t.data.w_loader))
            batch[v] = (x.to(t.device), y.to(t.device))
            saved[v] = saved_bytes(t, *batch[v])
            t0 = time.perf_counter()
            for _ in range(3):  # warm-up: kernel selection, caches, compilation
                t.weight_step(*batch[v])
                t.theta_step(*batch[v])
            sync(device)
            warm[v] = time.perf_counter() - t0
            print(f"{name[v]}: warm-up (3 steps, compilation included) {warm[v]:.1f} s",
                  flush=True)
        times: dict[tuple[str, str, bool, str], list[float]] = {v: [] for v in variants}
        peak: dict[tuple[str, str, bool, str], float] = {}
        for r in range(args.rounds):
            for v in (variants if r % 2 == 0 else variants[::-1]):
                t = trainers[v]
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                sync(device)
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    t.weight_step(*batch[v])
                    t.theta_step(*batch[v])
                sync(device)
                times[v].append((time.perf_counter() - t0) / args.steps)
                if device.type == "cuda":
                    peak[v] = max(peak.get(v, 0.0), torch.cuda.max_memory_allocated(device))
            print(f"round {r + 1}/{args.rounds}", flush=True)
        if args.profile:
            for v in variants:
                print(f"\n{name[v]}: the {args.profile} ops with the most self time in one step")
                print(profile_step(trainers[v], *batch[v], device, args.profile))
    finally:
        for t in trainers.values():
            close_logger(t.log)
        shutil.rmtree(work, ignore_errors=True)
    first = statistics.median(times[variants[0]])
    print(f"\n{'variant':<46}{'step s':>22}{'images/s':>10}{'peak GiB':>10}{'saved GiB':>11}"
          f"{'bound s':>9}{'x bound':>9}{'x first':>9}")
    for v in variants:
        ts = times[v]
        med = statistics.median(ts)
        bound = saved[v] * args.passes * 2 / bw
        pk = f"{peak[v] / 2**30:.1f}" if v in peak else "-"
        print(f"{name[v]:<46}{med:8.3f} ({min(ts):.3f}-{max(ts):.3f}){args.batch / med:10.0f}"
              f"{pk:>10}{saved[v] / 2**30:11.2f}{bound:9.3f}{med / bound:9.1f}"
              f"{first / med:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
