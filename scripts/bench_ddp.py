"""Distributed search throughput: images/s of the supernet weight step, 1 process vs N processes
(gloo, CPU), with gradients averaged every step (run.ddp_sync_every 1) or every K steps.

Each setting is a real `torchrun` launch of this script in --worker mode: a SearchTrainer on
the quickstart space (synthetic data, a FLOPs cost table so nothing is measured), `--warmup`
untimed weight steps, then `--steps` timed ones through the trainer's own distributed step
(DDP forward/backward, or no_sync plus periodic averaging). Throughput counts every rank's
images (per-process batch x processes) over rank 0's wall time for the timed steps, averaging
steps included. Each setting runs `--repeats` times; the table shows the median and the spread
(min-max) over the repeats, and the median per-step time within the runs.

    OMP_NUM_THREADS=1 python scripts/bench_ddp.py                  # 1 proc; 2 procs, K = 1, 4
    python scripts/bench_ddp.py --steps 8 --warmup 2 --repeats 1   # a quick check that it runs

Each process uses one thread (OMP_NUM_THREADS=1), so N processes use N cores: on a machine
with fewer free cores than processes the comparison says little.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> None:
    import torch

    k = args.sync_every[0]
    from fbnas.config import load_config
    from fbnas.distributed import init_from_env
    from fbnas.run import close_logger
    from fbnas.trainer import SearchTrainer

    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [
        "data.dataset=synthetic", f"data.synthetic_size={args.samples}",
        f"data.batch_size={args.batch}", "data.augment=false", "latency.cost=flops",
        "search.device=cpu", "run.progress=false", "run.tensorboard=false",
        f"run.ddp_sync_every={k}", f"run.dir={args.run_dir}"])
    torch.set_num_threads(1)
    ctx = init_from_env(device="cpu")
    t = SearchTrainer(cfg, args.run_dir, dist=ctx)
    try:
        batches = []
        for x, y in t.data.w_loader:
            batches.append((x, y))
            if len(batches) >= args.warmup + args.steps:
                break
        if len(batches) < args.warmup + args.steps:
            raise SystemExit(f"only {len(batches)} batches per rank: raise --samples")

        def step(x, y):
            if t.dist.distributed:
                return t._dist_step("w", t.weight_step, x, y)
            return t.weight_step(x, y)

        for x, y in batches[:args.warmup]:
            step(x, y)
        if t.dist.distributed:
            t._averager.sync()
        ctx.barrier()
        times = []
        t0 = time.perf_counter()
        for x, y in batches[args.warmup:]:
            s0 = time.perf_counter()
            step(x, y)
            times.append(time.perf_counter() - s0)
        if t.dist.distributed:
            t._averager.sync()
        ctx.barrier()
        wall = time.perf_counter() - t0
        if ctx.is_main:
            images = args.steps * args.batch * ctx.world_size
            with open(args.result, "w") as f:
                json.dump({"images_per_s": images / wall, "step_ms": statistics.median(times)
                           * 1e3, "world": ctx.world_size, "sync_every": k}, f)
    finally:
        close_logger(t.log)
        ctx.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nproc: int, k: int, args: argparse.Namespace, tmp: Path, i: int) -> dict:
    run_dir = tmp / f"run-{nproc}-{k}-{i}"
    result = tmp / f"result-{nproc}-{k}-{i}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(Path(__file__).resolve()), "--worker",
           "--run-dir", str(run_dir), "--result", str(result), "--sync-every", str(k),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch",
           str(args.batch), "--samples", str(args.samples)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)}\nexit {r.returncode}\n{r.stderr[-4000:]}")
    return json.loads(result.read_text())


def main() -> None:
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
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    settings = [(p, k) for p in args.procs for k in (args.sync_every if p > 1 else [1])]
    print(f"search weight step, quickstart space, synthetic 16x16 data, batch {args.batch} per "
          f"process, {args.steps} timed steps after {args.warmup}, {args.repeats} repeat(s), "
          f"gloo on CPU, 1 thread per process")
    print(f"{'procs':>5} {'sync_every':>10} {'images/s':>10} {'spread':>17} {'step ms':>8}")
    with tempfile.TemporaryDirectory(prefix="bench_ddp-") as d:
        tmp = Path(d)
        rows = {s: [] for s in settings}
        for i in range(args.repeats):  # interleaved, so drift hits every setting alike
            for p, k in settings:
                rows[(p, k)].append(launch(p, k, args, tmp, i))
        for (p, k), rs in rows.items():
            ips = [r["images_per_s"] for r in rs]
            ms = statistics.median(r["step_ms"] for r in rs)
            print(f"{p:>5} {k:>10} {statistics.median(ips):>10.1f} "
                  f"{min(ips):>8.1f}-{max(ips):<8.1f} {ms:>8.2f}")


if __name__ == "__main__":
    main()
