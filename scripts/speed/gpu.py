"""Search throughput per mode and precision, against a memory-bandwidth bound.

Runs what `fbnas train` runs: SearchTrainer.weight_step + theta_step (one "step" = both, as in
the reported GPU table) on one synthetic batch held on the device, for every variant of
--modes x --precisions x --layouts (`search.channels_last`: `auto`, the default, is NHWC on
CUDA and NCHW on the CPU; `channels_last` and `nchw` force one; each variant's name says the
layout it ran), each its own trainer. Variants are timed in interleaved rounds
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

    python -m scripts.speed.gpu --device cuda                       # ImageNet space, batch 96
    python -m scripts.speed.gpu --device cpu --batch 2 --modes single_path --steps 1 \\
        --rounds 1 --copy-gib 0.01                   # the same config on a CPU (~1 minute)
    python -m scripts.speed.gpu --config configs/quickstart.yaml --batch 32 --steps 2 \\
        --rounds 3 --device cpu                                 # a quick check on a CPU
    python -m scripts.speed.gpu --compile both                     # search.compile off / on
    python -m scripts.speed.gpu --nan-check both   # the per-step NaN read against the deferred
    python -m scripts.speed.gpu --code /tmp/base   # the same table for a baseline checkout
    python -m scripts.speed.gpu --batch 32 --modes full --profile 15   # bf16 vs fp32, op by op
    python -m scripts.speed.gpu --modes full --precisions float32 --layouts nchw,channels_last

Warm-up: the first steps of a variant include cuDNN choosing an algorithm (a plan) for every
distinct convolution configuration (shape, stride, groups, layout, dtype) and, with
search.compile, compilation; printed per variant as `warm-up (3 steps ...)`. A space with many
distinct candidate shapes (the ImageNet space's kernels x expansions x stages) pays it once per
configuration and layout; bf16 + channels_last pays most (the figures: docs/measurements.md).
In full mode a layer's candidates computed together (fbnas.blocks.batched) make fewer distinct
configurations: on the ImageNet space, one forward, 99 instead of 125 (and 338 convolution /
184 BatchNorm calls instead of 536 / 536; counted on the CPU, 2026-11-28), so less warm-up.

The default config is configs/fbnet_imagenet.yaml, whose runs keep 100 of ImageNet's classes
(`data.classes: 100`): synthetic data refuses `data.classes`, so the table is made with the head
those runs have, 100 outputs (`space.num_classes=100`, `data.classes=null`), and says so. The
loader only gives the batch that is timed (`data.workers=0`).

With --compile, inductor caches generated code under /tmp/torchinductor_$USER (remove it
after). With --code DIR the table is made in a child process that imports DIR's fbnas
(scripts.common.run_module_with_code); configuration keys at their defaults are left out, so
that an older checkout without them runs too.

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch
import yaml

from fbnas.trainer import SearchTrainer
from scripts.common import (
    ROOT,
    SavedBytes,
    Spread,
    closing,
    configured_mode,
    fbnas_root,
    first_batch,
    interleave,
    run_config,
    run_module_with_code,
    search_step,
    search_trainer,
    sync,
    timed,
)


def copy_bandwidth(device: torch.device, gib: float = 1.0, reps: int = 10) -> float:
    """Bytes per second of a large device-to-device copy (bytes read + bytes written)."""
    n = int(gib * 2**30) // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    times = [timed(partial(dst.copy_, src), device) for _ in range(reps + 1)]
    return 2 * n * 4 / Spread.of(times[1:]).median


def saved_bytes(t: SearchTrainer, x: torch.Tensor) -> int:
    """Distinct storages autograd saves for backward in one training forward of `t`'s model
    (a weight step's forward: paths as the mode samples them), parameters and buffers out."""
    t.model.train()
    with torch.no_grad():
        p = t.net.sample_path(t.tau, t.cfg.search.hard)
    with SavedBytes(t.net) as meter, t.prec.autocast():
        logits, _ = t.model(t.prec.input(x), m=p.m, active=p.active, cost_m=p.cost_m)
    del logits
    t.model.zero_grad(set_to_none=True)
    return meter.total()


def profile_step(t: SearchTrainer, x: torch.Tensor, y: torch.Tensor, device: torch.device,
                 top: int) -> str:
    """torch.profiler's table of one weight + θ step, sorted by self device (or CPU) time."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=acts) as prof:
        search_step(t, x, y)
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=40)


def run_classes(config: str) -> int | None:
    """The config's `data.classes` (the classes its runs keep, e.g. the FBNet paper's 100 of
    ImageNet's 1000), or None."""
    with open(config) as fh:
        return ((yaml.safe_load(fh) or {}).get("data") or {}).get("classes")


def classes_sets(config: str) -> list[str]:
    """Synthetic data has the space's num_classes classes and refuses `data.classes`: a config
    that keeps N classes (configs/fbnet_imagenet.yaml: 100) is timed with the head its runs
    have, N outputs (space.num_classes=N, data.classes=null). Nothing for a config without it
    (an older checkout's, which may not know the key)."""
    n = run_classes(config)
    return [] if n is None else [f"space.num_classes={n}", "data.classes=null"]


LAYOUT_SETS = {"auto": [], "channels_last": ["search.channels_last=true"],
               "nchw": ["search.channels_last=false"]}


def trainer(args, mode: str, precision: str, layout: str, compiled: bool, check: str,
            work: Path) -> SearchTrainer:
    # keys at their defaults are left out, so that a baseline checkout without them runs too
    sets = [f"search.mode={configured_mode(mode)}",
            *([f"search.precision={precision}"] if precision != "float32" else []),
            *LAYOUT_SETS[layout],
            *([f"run.nan_check={check}"] if check != "auto" else []),
            *(["search.compile=true"] if compiled else []),
            *classes_sets(args.config),
            "latency.cost=flops", "data.dataset=synthetic", f"data.batch_size={args.batch}",
            f"data.synthetic_size={4 * args.batch}", "data.val_fraction=0",
            "data.workers=0",  # the loader gives the one batch that is timed, nothing more
            f"search.device={args.device}",
            f"run.dir={work / f'{mode}-{precision}-{layout}-{int(compiled)}-{check}'}",
            "run.progress=false", "run.tensorboard=false", *args.set]
    return search_trainer(run_config(args.config, sets), sampler=mode)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", help="default: configs/fbnet_imagenet.yaml of the --code checkout")
    ap.add_argument("--code", default=str(ROOT), metavar="DIR",
                    help="the fbnas checkout to time (default: this one); e.g. a baseline made "
                         "with `git worktree add /tmp/base e4987fe` (before the supernet's "
                         "speed-ups)")
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--device", default="auto", help="auto (cuda if present), cuda or cpu")
    ap.add_argument("--modes", default="full,two_path,single_path")
    ap.add_argument("--precisions", default="float32,bf16")
    ap.add_argument("--layouts", default="auto",
                    help="search.channels_last per variant: auto (the default: NHWC on CUDA), "
                         "channels_last, nchw; comma-separated to compare")
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
    ap.add_argument("--copy-gib", type=float, default=1.0,
                    help="size of the copy that measures the bandwidth")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    args = ap.parse_args(argv)
    code = Path(args.code).resolve()
    args.config = str(Path(args.config or code / "configs" / "fbnet_imagenet.yaml").resolve())
    if code != fbnas_root():  # time that checkout's fbnas: in a child process that imports it
        argv = list(sys.argv[1:] if argv is None else argv)
        return run_module_with_code(code, "speed.gpu", [*argv, "--config", args.config,
                                                        "--code", str(code)])
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    work = Path(tempfile.mkdtemp(prefix="fbnas_bench_gpu_"))
    comp = {"off": (False,), "on": (True,), "both": (False, True)}[args.compile]
    checks = ("step", "deferred") if args.nan_check == "both" else (args.nan_check,)
    layouts = args.layouts.split(",")
    if bad := [x for x in layouts if x not in LAYOUT_SETS]:
        ap.error(f"--layouts: {bad[0]!r} is not one of {', '.join(LAYOUT_SETS)}")
    variants = [(m, p, la, c, k) for m in args.modes.split(",")
                for p in args.precisions.split(",") for la in layouts for c in comp
                for k in checks]
    name = {v: f"{v[0]}, {v[1]}" + (", compiled" if v[3] else "")
            + (f", nan_check {v[4]}" if len(checks) > 1 else "") for v in variants}
    bw = copy_bandwidth(device, args.copy_gib)
    print(f"{args.config}: batch {args.batch}, {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", torch {torch.__version__}; copy bandwidth {bw / 1e9:.0f} GB/s; fbnas from "
          f"{code}", flush=True)
    if (n := run_classes(args.config)) is not None:
        print(f"data.classes {n}: the {n}-output head of the config's runs, on synthetic data "
              f"of {n} classes (space.num_classes={n}, data.classes=null)", flush=True)
    batch, saved, peak = {}, {}, {}

    def reset_peak(v) -> None:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def read_peak(v) -> None:
        if device.type == "cuda":
            peak[v] = max(peak.get(v, 0.0), torch.cuda.max_memory_allocated(device))

    with closing({}) as trainers:
        try:
            for v in variants:
                t = trainers[v] = trainer(args, *v, work)
                cl = getattr(getattr(t, "prec", None), "channels_last", None)
                name[v] += {True: " + channels_last", False: ", NCHW", None: ""}[cl]
                batch[v] = first_batch(t)
                saved[v] = saved_bytes(t, batch[v][0])
                # warm-up: kernel selection, caches, compilation
                warm = timed(lambda t=t, v=v: search_step(t, *batch[v], steps=3), device)
                print(f"{name[v]}: warm-up (3 steps, compilation included) {warm:.1f} s",
                      flush=True)
            jobs = {v: (lambda v=v: search_step(trainers[v], *batch[v], steps=args.steps))
                    for v in variants}
            times = interleave(jobs, args.rounds, device, before=reset_peak, after=read_peak,
                               on_round=lambda r, _: print(f"round {r + 1}/{args.rounds}",
                                                           flush=True))
            if args.profile:
                for v in variants:
                    print(f"\n{name[v]}: the {args.profile} ops with the most self time in one "
                          "step")
                    print(profile_step(trainers[v], *batch[v], device, args.profile))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    step = {v: Spread.of([x / args.steps for x in times[v]]) for v in variants}
    first = step[variants[0]].median
    print(f"\n{'variant':<46}{'step s':>22}{'images/s':>10}{'peak GiB':>10}{'saved GiB':>11}"
          f"{'bound s':>9}{'x bound':>9}{'x first':>9}")
    for v in variants:
        med = step[v].median
        bound = saved[v] * args.passes * 2 / bw
        pk = f"{peak[v] / 2**30:.1f}" if v in peak else "-"
        print(f"{name[v]:<46}{step[v].range():>22}{args.batch / med:10.0f}"
              f"{pk:>10}{saved[v] / 2**30:11.2f}{bound:9.3f}{med / bound:9.1f}"
              f"{first / med:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
