"""The quickstart sweep, measured: does the search beat random architectures, and how long.

Runs `fbnas sweep` on configs/quickstart.yaml as a user would (a fresh latency-table cache, so
the table build is part of the wall time) and prints, from its sweep.json: the wall time, how
many random architectures some searched one dominates (at least as fast and as accurate within
noise), and each searched point's measured latency and test top-1 relative to the all-ir_k5_e6
reference (ratios of figures measured side by side in one interleaved run).

    python scripts/bench_sweep.py                      # ~ 30 minutes on 2 cores
    python scripts/bench_sweep.py --summarize runs/quickstart-sweep   # an existing sweep
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def summarize(out: Path, wall: float | None = None) -> None:
    s = json.loads((out / "sweep.json").read_text())
    pts = s["points"]
    ref = next((p for p in pts if p["label"] == "ref-all_k5_e6"), None)
    print(f"== fbnas sweep {s['config']}: {s['param']} = "
          f"{', '.join(f'{v:g}' for v in s['values'])}; {s['test_images']} test images")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="sweep folder (default: a temp dir)")
    ap.add_argument("--beta", default="0,2,4,8")
    ap.add_argument("--random", type=int, default=5)
    ap.add_argument("--retrain-epochs", type=int, default=15)
    ap.add_argument("--summarize", metavar="SWEEP_DIR", help="only print an existing sweep")
    args = ap.parse_args()
    if args.summarize:
        summarize(Path(args.summarize))
        return
    out = Path(args.out or tempfile.mkdtemp(prefix="fbnas_sweep_"))
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fbnas", "sweep", "--config",
                    str(ROOT / "configs/quickstart.yaml"), "--beta", args.beta, "--random",
                    str(args.random), "--retrain-epochs", str(args.retrain_epochs),
                    "--out", str(out), "--set", f"latency.cache_dir={out / 'table_cache'}",
                    "--set", "run.progress=false"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    summarize(out, time.perf_counter() - t)


if __name__ == "__main__":
    main()
