"""Child training throughput, eager vs torch.compile, measured side by side.

Trains the same child (default: the all-ir_k5_e6 network of the quickstart space, batch 64,
1x16x16 inputs) with ChildTrainer.train_step, `retrain.compile` off and on (what `fbnas
retrain` runs: SGD, label smoothing, the non-finite check), in alternating timed blocks of
steps, so a slow spell of the machine hits both alike; reports images/s of each per block and
the median ratio with its spread. Compilation time is reported separately (it is paid once
per run).

    python -m scripts.speed.compile                 # ~ 3 minutes on 2 cores
    python -m scripts.speed.compile --blocks 10 --steps 30 --threads 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from fbnas.arch import arch_from_indices
from fbnas.retrain import ChildTrainer
from scripts.common import QUIET, SPACES, Spread, closing, interleave, random_batch, run_config


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(SPACES["quickstart"]))
    ap.add_argument("--op", default="ir_k5_e6", help="uniform op of the child")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20, help="training steps per timed block")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    space = run_config(args.config).space
    arch = arch_from_indices(space, [c.index(args.op) for c in space.layer_candidates()],
                             f"all_{args.op}")
    x, y = random_batch(space, args.batch, generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory(prefix="fbnas-bench-compile-") as tmp, \
            closing({}) as trainers:

        def setup(compiled: bool):
            torch.manual_seed(0)
            name = "compiled" if compiled else "eager"
            cfg = run_config(args.config, [
                "data.dataset=synthetic", "retrain.device=cpu", "retrain.measure_latency=false",
                f"retrain.compile={str(compiled).lower()}", f"run.dir={Path(tmp) / name}",
                *QUIET])
            tr = trainers[name] = ChildTrainer(cfg, arch, cfg.run.dir)
            return lambda: [tr.train_step(x, y) for _ in range(args.steps)]

        eager = setup(False)
        t = time.perf_counter()
        try:
            comp = setup(True)
            trainers["compiled"].train_step(x, y)  # compile: forward and backward graphs
            trainers["compiled"].train_step(x, y)
        except Exception as e:  # no compiler, unsupported op, ...
            print(f"torch.compile does not work here: {type(e).__name__}: "
                  f"{str(e).strip().splitlines()[0][:200]}")
            return
        compile_s = time.perf_counter() - t
        times = interleave({"eager": eager, "compiled": comp}, args.blocks, warmup=1)
    rates = {k: [args.steps * args.batch / t for t in v] for k, v in times.items()}
    ratios = [c / e for c, e in zip(rates["compiled"], rates["eager"], strict=True)]
    print(f"child {arch.name} [{arch.short_hash}], batch {args.batch}, {args.threads} thread(s),"
          f" torch {torch.__version__}")
    for name, r in rates.items():
        s = Spread.of(r)
        print(f"{name:<9} images/s: median {s.median:8.0f}  "
              f"(min {s.lo:.0f}, max {s.hi:.0f}, {len(r)} blocks of {args.steps} steps)")
    print(f"compiled / eager throughput: median x{Spread.of(ratios).iqr('.2f')}")
    print(f"compile time (first two steps): {compile_s:.1f} s")


if __name__ == "__main__":
    main()
