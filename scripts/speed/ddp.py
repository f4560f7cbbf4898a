"""Distributed search throughput: images/s of the supernet weight step, 1 process vs N processes
(gloo, CPU), with gradients averaged every step (run.ddp_sync_every 1) or every K steps.

Each setting is a real `torchrun` launch of this module in --worker mode: a SearchTrainer on
the quickstart space (synthetic data, a FLOPs cost table so nothing is measured), `--warmup`
untimed weight steps, then `--steps` timed ones through the trainer's own weight step (DDP
forward/backward, or no_sync plus averaging every K steps; both counts are rounded up to a
multiple of K, so that every average falls inside the timed or the untimed steps).
Throughput counts every rank's images (per-process batch x processes) over rank 0's wall time
for the timed steps, averaging steps included. Each setting runs `--repeats` times, the
settings interleaved; the table shows the median and the spread (min-max) over the repeats,
and the median per-step time within the runs.

    OMP_NUM_THREADS=1 python -m scripts.speed.ddp                  # 1 proc; 2 procs, K = 1, 4
    python -m scripts.speed.ddp --steps 8 --warmup 2 --repeats 1   # a quick check that it runs

Each process uses one thread (OMP_NUM_THREADS=1), so N processes use N cores: on a machine
with fewer free cores than processes the comparison says little.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fbnas.training.distributed import init_from_env
from scripts.common import (
    ROOT,
    SPACES,
    Spread,
    alternate,
    closing,
    run_config,
    search_trainer,
    synthetic_sets,
)


def up_to(n: int, k: int) -> int:
    """n rounded up to a multiple of k."""
    return -(-n // k) * k


def worker(args: argparse.Namespace) -> None:
    k = args.sync_every[0]
    warmup, steps = up_to(args.warmup, k), up_to(args.steps, k)
    cfg = run_config(SPACES["quickstart"], [
        *synthetic_sets(args.batch, args.samples, "cpu", args.run_dir), "data.augment=false",
        f"run.ddp_sync_every={k}"])
    torch.set_num_threads(1)
    ctx = init_from_env(device="cpu")
    try:
        with closing([search_trainer(cfg, theta_active=False, dist=ctx)]) as (t,):
            timed_steps(t, ctx, args, warmup, steps, k)
    finally:
        ctx.close()


def timed_steps(t, ctx, args: argparse.Namespace, warmup: int, steps: int, k: int) -> None:
    batches = []
    for x, y in t.data.w_loader:
        batches.append((x, y))
        if len(batches) >= warmup + steps:
            break
    if len(batches) < warmup + steps:
        raise SystemExit(f"only {len(batches)} batches per rank: raise --samples")
    for x, y in batches[:warmup]:
        t.weight_step(x, y)
    ctx.barrier()
    times = []
    t0 = time.perf_counter()
    for x, y in batches[warmup:]:
        s0 = time.perf_counter()
        t.weight_step(x, y)
        times.append(time.perf_counter() - s0)
    ctx.barrier()
    wall = time.perf_counter() - t0
    if ctx.is_main:
        images = steps * args.batch * ctx.world_size
        with open(args.result, "w") as f:
            json.dump({"images_per_s": images / wall, "step_ms": Spread.of(times).median * 1e3,
                       "world": ctx.world_size, "sync_every": k}, f)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nproc: int, k: int, args: argparse.Namespace, tmp: Path, i: int) -> dict:
    run_dir = tmp / f"run-{nproc}-{k}-{i}"
    result = tmp / f"result-{nproc}-{k}-{i}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "scripts.speed.ddp", "--worker",
           "--run-dir", str(run_dir), "--result", str(result), "--sync-every", str(k),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch",
           str(args.batch), "--samples", str(args.samples)]
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=args.timeout)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)}\nexit {r.returncode}\n{r.stderr[-4000:]}")
    return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sync-every", type=int, nargs="+", default=[1, 4],
                    help="run.ddp_sync_every values to compare (multi-process settings)")
    ap.add_argument("--steps", type=int, default=40, help="timed weight steps per run")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32, help="per-process batch")
    ap.add_argument("--samples", type=int, default=8192, help="synthetic training images")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return
    settings = [(p, k) for p in args.procs for k in (args.sync_every if p > 1 else [1])]
    print(f"search weight step, quickstart space, synthetic 16x16 data, batch {args.batch} per "
          f"process, {args.steps} timed steps after {args.warmup}, {args.repeats} repeat(s), "
          f"gloo on CPU, 1 thread per process")
    print(f"{'procs':>5} {'sync_every':>10} {'images/s':>10} {'spread':>17} {'step ms':>8}")
    with tempfile.TemporaryDirectory(prefix="bench_ddp-") as d:
        rows = {s: [] for s in settings}
        for i in range(args.repeats):  # interleaved, so drift hits every setting alike
            for p, k in alternate(settings, i):
                rows[(p, k)].append(launch(p, k, args, Path(d), i))
        for (p, k), rs in rows.items():
            ips = Spread.of([r["images_per_s"] for r in rs])
            ms = Spread.of([r["step_ms"] for r in rs]).median
            print(f"{p:>5} {k:>10} {ips.median:>10.1f} {ips.lo:>8.1f}-{ips.hi:<8.1f} {ms:>8.2f}")


if __name__ == "__main__":
    main()
