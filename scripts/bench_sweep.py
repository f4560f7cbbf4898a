"""The quickstart sweep, measured: does the search beat random architectures, and how long.

Runs `fbnas sweep` on configs/quickstart.yaml (or --config) as a user would (a fresh
latency-table cache, so the table build is part of the wall time) and prints, from its
sweep.json: the wall time, how many random architectures some searched one dominates (at least
as fast and as accurate within noise), and each searched point's measured latency and test
top-1 relative to the all-ir_k5_e6 reference (ratios of figures measured side by side in one
interleaved run).

    python -m scripts.bench_sweep                      # ~ 10 minutes per seed on 2 cores
    python -m scripts.bench_sweep --seeds 0,1,2        # one sweep per search seed, then a summary
    python -m scripts.bench_sweep --param beta --values 0,4   # the FBNet loss instead
    python -m scripts.bench_sweep --summarize runs/quickstart-sweep   # an existing sweep

With several seeds, each seed N is a separate sweep in OUT/seed-N (search.seed = N and random
architectures drawn with seed N), sharing one latency table; the last lines give, per seed, how
many random networks a searched one dominates.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.common import ROOT, SPACES


def summarize(out: Path, wall: float | None = None) -> None:
    s = json.loads((out / "sweep.json").read_text())
    pts = s["points"]
    ref = next((p for p in pts if p["label"] == "ref-all_k5_e6"), None)
    vals = ", ".join(format(v, "g") if isinstance(v, float) else str(v) for v in s["values"])
    print(f"== fbnas sweep {s['config']}: {s['param']} = {vals}; {s['test_images']} test images")
    print(f"{'point':<16}{'kind':<10}{'pred ms':>8}{'meas ms':>8}{'IQR':>6}{'top-1':>8}"
          f"{'x lat':>7}{'d top-1':>8}")
    for p in pts:
        x = (p["measured_ms"] / ref["measured_ms"]) if ref and p["measured_ms"] else None
        d = (100 * (p["top1"] - ref["top1"])) if ref else None
        print(f"{p['label']:<16}{p['kind']:<10}{p['predicted_ms'] or float('nan'):8.3f}"
              f"{p['measured_ms'] or float('nan'):8.3f}"
              f"{100 * (p['measured_iqr'] or 0):5.1f}%{100 * p['top1']:7.2f}%"
              + (f"{x:7.2f}" if x is not None else "      -")
              + (f"{d:+8.2f}" if d is not None else "       -")
              + ("  dominated" if p["dominated"] is True else ""))
    print(f"random architectures dominated by a searched one: {s['random_dominated']}/"
          f"{s['random']} (tolerance: latency {100 * s['latency_tolerance']:.1f}%, top-1 "
          f"{100 * s['accuracy_tolerance']:.2f} pt = 1 binomial s.e.)")
    print(f"sweep wall time: {s['wall_seconds']:.0f} s (in-process)"
          + (f", {wall:.0f} s including start-up" if wall else ""))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(SPACES["quickstart"]))
    ap.add_argument("--out", help="sweep folder (default: a temp dir)")
    ap.add_argument("--param", default="target", choices=("target", "beta", "lambda", "alpha"))
    ap.add_argument("--values", default="0.3x,0.5x,0.8x")
    ap.add_argument("--seeds", default="0", help="search seeds, one sweep each")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--also", help="seeds already swept in OUT/seed-N to count in the summary")
    ap.add_argument("--random", type=int, default=5)
    ap.add_argument("--retrain-epochs", type=int, default=15)
    ap.add_argument("--summarize", metavar="SWEEP_DIR", help="only print an existing sweep")
    args = ap.parse_args(argv)
    if args.summarize:
        summarize(Path(args.summarize))
        return
    out = Path(args.out or tempfile.mkdtemp(prefix="fbnas_sweep_"))
    seeds = [int(v) for v in args.seeds.split(",")]
    counts = []
    for seed in seeds:
        run_out = out / f"seed-{seed}" if len(seeds) > 1 else out
        extra = [a for kv in args.set for a in ("--set", kv)]
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fbnas", "sweep", "--config",
                        str(Path(args.config).resolve()), f"--{args.param}", args.values,
                        "--random", str(args.random), "--retrain-epochs",
                        str(args.retrain_epochs), "--seed", str(seed), "--out", str(run_out),
                        "--set", f"latency.cache_dir={out / 'table_cache'}",
                        "--set", "run.progress=false", "--set", f"search.seed={seed}", *extra],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        summarize(run_out, time.perf_counter() - t)
        s = json.loads((run_out / "sweep.json").read_text())
        counts.append((seed, s["random_dominated"], s["random"]))
    for seed in [int(v) for v in args.also.split(",")] if args.also else []:
        s = json.loads((out / f"seed-{seed}" / "sweep.json").read_text())
        counts.append((seed, s["random_dominated"], s["random"]))
        seeds.append(seed)
    if len(seeds) > 1:
        print("== random networks dominated by a searched one, per seed: "
              + ", ".join(f"seed {sd}: {d}/{n}" for sd, d, n in counts))


if __name__ == "__main__":
    main()
