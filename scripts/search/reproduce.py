"""Does a fresh `fbnas retrain` land where the benchmark says?

Draws --n networks of the benchmark at random, retrains each with `fbnas retrain --config
BENCH.yaml --arch A.yaml` under a seed the benchmark did not use (--seed), and prints its test
and validation top-1 beside the benchmark's mean over its seeds, the difference in units of
the benchmark's seed-to-seed standard deviation (the mean over its networks of each network's
sd across seeds), and whether it lies within 2 of them. With --seed set to one of the
benchmark's seeds, the figures are the entry's own (bit for bit at the same thread count).

    python -m scripts.search.reproduce --n 5 --seed 7
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
from pathlib import Path

from fbnas.bench.table import Bench
from scripts.common import BENCH_CONFIG, BENCH_FILE, retrain_process


def seed_sd(bench: Bench, metric: str) -> float:
    """The mean over the networks of their sd across the benchmark's seeds (full budget)."""
    full = str(bench.budgets[-1])
    return statistics.fmean(
        statistics.stdev(float(r[full][metric]) for r in bench.networks[k]["runs"].values())
        for k in bench if bench.complete(k))


def _z(diff: float, sd: float) -> float:
    """`diff` in units of `sd` (a benchmark whose seeds agree exactly: 0 or infinite)."""
    if sd > 0:
        return diff / sd
    return 0.0 if abs(diff) < 1e-9 else math.copysign(math.inf, diff)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=str(BENCH_FILE))
    ap.add_argument("--config", default=str(BENCH_CONFIG))
    ap.add_argument("--n", type=int, default=5, help="networks to retrain")
    ap.add_argument("--seed", type=int, default=7, help="retrain.seed of the fresh runs")
    ap.add_argument("--draw", type=int, default=0, help="seed of the draw of networks")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    a = ap.parse_args(argv)
    bench = Bench.load(a.bench)
    keys = sorted(k for k in bench if bench.complete(k))
    picked = random.Random(a.draw).sample(keys, min(a.n, len(keys)))
    sd = {m: seed_sd(bench, m) for m in ("test_acc", "val_acc")}
    print(f"{a.bench}: seed-to-seed sd test {100 * sd['test_acc']:.2f} pt, val "
          f"{100 * sd['val_acc']:.2f} pt; fresh retrains with retrain.seed={a.seed}")
    print(f"{'network':36s} {'test':>6s} {'bench':>6s} {'z':>5s} {'val':>6s} {'bench':>6s} "
          f"{'z':>5s}")
    inside = 0
    with tempfile.TemporaryDirectory() as tmp:
        for k in picked:
            arch = bench.arch(k)
            f = Path(tmp) / f"{k[:12]}.yaml"
            arch.save(f)
            run = Path(tmp) / f"run-{k[:12]}"
            retrain_process(a.config, f, a.seed, a.sets, "--out", str(run))
            res = json.loads((run / "results.json").read_text())
            got = {"test_acc": res["top1"], "val_acc": res["val_top1"]}
            z = {m: _z(got[m] - bench.mean(k, m), sd[m]) for m in got}
            inside += all(abs(v) <= 2 for v in z.values())
            print(f"{' '.join(o.replace('ir_', '') for o in arch.ops):36s} "
                  f"{100 * got['test_acc']:6.2f} {100 * bench.mean(k, 'test_acc'):6.2f} "
                  f"{z['test_acc']:5.1f} {100 * got['val_acc']:6.2f} "
                  f"{100 * bench.mean(k, 'val_acc'):6.2f} {z['val_acc']:5.1f}", flush=True)
    print(f"within 2 seed-sd (test and val): {inside} of {len(picked)}")


if __name__ == "__main__":
    main()
