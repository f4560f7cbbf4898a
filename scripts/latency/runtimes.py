"""Latency tables per runtime: PyTorch eager, ExecuTorch (XNNPACK) and ONNX Runtime.

For a space: build one table per runtime (batch 1, 1 thread, fp32; exported programs cached
under a temporary directory, so lowering is part of the build time), then measure the same
`-n` spanning networks end to end in each runtime (2 passes) and print, per runtime, the
table's Spearman / Kendall / MAPE / within ±10% against that runtime's own measurement, the
eager table's and FLOPs' rank correlation against it, the runtime/eager speed ratio, the share
of ops XNNPACK delegated, and how many ordered op pairs per layer (ops of one layer ranked by
their table entry) each runtime orders differently from eager.

    python -m scripts.latency.runtimes [--space fbnet_cifar10] [-n 20] \\
        [--runtimes cpu,executorch,ort]

`--baselines` instead times the published FBNet-A/B/C (configs/archs, 224x224) in eager and in
each runtime side by side, in one interleaved measurement per repeat, and prints each network's
time per runtime and its ratio to eager (median and range over `--repeats`):

    python -m scripts.latency.runtimes --baselines [--repeats 3]

Run it alone on the machine: the timings share the cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from fbnas.arch import Architecture, build_child
from fbnas.latency import Protocol, build_table, make_timer, sample_spanning
from fbnas.latency.timed_models import measure_runtimes
from fbnas.latency.validate import validate
from fbnas.search_space import load_space
from fbnas.settings import CONTEXT_PROBES
from scripts.common import ROOT, SPACES, space_config


def pair_flips(space, base, other) -> tuple[int, int]:
    """(ordered op pairs of a layer that `other` orders differently from `base`, all pairs)."""
    rb, _ = base.costs_for(space, "raw")
    ro, _ = other.costs_for(space, "raw")
    flips = total = 0
    for row_b, row_o in zip(rb, ro, strict=True):
        ops = sorted(row_b)
        for i, a in enumerate(ops):
            for b in ops[i + 1:]:
                total += 1
                flips += (row_b[a] - row_b[b]) * (row_o[a] - row_o[b]) < 0
    return flips, total


def baselines(runtimes: list[str], repeats: int, rounds: int) -> int:
    """FBNet-A/B/C in eager and each runtime, side by side (see the module docstring)."""
    names = ("fbnet_a", "fbnet_b", "fbnet_c")
    modules = {}
    for n in names:
        a = Architecture.load(ROOT / "configs" / "archs" / f"{n}.yaml")
        torch.manual_seed(0)
        modules[n] = (build_child(a), (a.macro.in_channels, *a.macro.input_size))
    work = Path(tempfile.mkdtemp(prefix="fbnas_baselines_"))
    os.environ["FBNAS_EXPORT_CACHE"] = str(work / "exported")
    print(f"load average {os.getloadavg()[0]:.2f}; FBNet-A/B/C, batch 1, 1 thread, fp32; "
          f"runtimes {', '.join(runtimes)}; {repeats} repeats", flush=True)
    ms: dict[str, list[float]] = {}
    try:
        for r in range(repeats):
            t0 = time.perf_counter()
            m = measure_runtimes(make_timer("cpu"), modules, [make_timer(x) for x in runtimes],
                                 Protocol(seed=r, rounds=rounds))
            for k, st in m.entries.items():
                ms.setdefault(k, []).append(st.summary(m.ref_scale_s)["median_us"] / 1e3)
            print(f"repeat {r + 1}: {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    head = f"{'network':<9}{'eager ms':>14}"
    for x in runtimes:
        head += f"{x + ' ms':>18}{'x eager':>18}"
    print("\n" + head)
    for n in names:
        eager = np.array(ms[f"cpu:{n}"])
        line = f"{n:<9}{np.median(eager):7.2f} ({eager.min():.1f}-{eager.max():.1f})"
        for x in runtimes:
            t = np.array(ms[f"{x}:{n}"])
            q = t / eager  # per repeat: measured side by side
            line += (f"{np.median(t):9.2f} ({t.min():.1f}-{t.max():.1f})"
                     f"{np.median(q):10.3f} ({q.min():.2f}-{q.max():.2f})")
        print(line)
    print("\nmedian over repeats (range); x eager: the runtime's time / eager's, per repeat.")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baselines", action="store_true",
                    help="FBNet-A/B/C in eager and each runtime, side by side")
    ap.add_argument("--repeats", type=int, default=3, help="--baselines: measurements")
    ap.add_argument("--space", default="fbnet_cifar10",
                    help=f"one of {', '.join(SPACES)}, or a config file")
    ap.add_argument("--runtimes", default="cpu,executorch,ort")
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val-rounds", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=Protocol.rounds, help="table build rounds")
    ap.add_argument("--probes", type=int, default=CONTEXT_PROBES,
                    help="context probes in each build (whole networks, each lowered per runtime)")
    args = ap.parse_args(argv)
    if args.baselines:
        rts = [x for x in args.runtimes.split(",") if x != "cpu"]
        return baselines(rts, args.repeats, args.val_rounds)
    space = load_space(space_config(args.space))
    work = Path(tempfile.mkdtemp(prefix="fbnas_runtimes_"))
    os.environ["FBNAS_EXPORT_CACHE"] = str(work / "exported")
    print(f"load average {os.getloadavg()[0]:.2f}; space {args.space}; batch 1, 1 thread, fp32")
    tables, reports, built = {}, {}, {}
    try:
        for rt in args.runtimes.split(","):
            t0 = time.perf_counter()
            tables[rt] = build_table(space, make_timer(rt), Protocol(rounds=args.rounds, seed=0),
                                     out=work / f"{rt}.json", context_probes=args.probes)
            built[rt] = time.perf_counter() - t0
            print(f"{rt}: table built in {built[rt]:.0f} s ({len(tables[rt].entries)} entries)",
                  flush=True)
        eager = tables.get("cpu")
        # the same networks for every runtime: spanning the eager table's range if there is one
        rows, _ = (eager or next(iter(tables.values()))).costs_for(space, "raw")
        archs = sample_spanning(space, args.n, rows, seed=args.seed)
        for rt, table in tables.items():
            t0 = time.perf_counter()
            reports[rt] = validate(space, table, make_timer(rt), archs=archs, repeats=2,
                                   protocol=Protocol(rounds=args.val_rounds))
            print(f"{rt}: {len(archs)} networks validated in {time.perf_counter() - t0:.0f} s",
                  flush=True)
        print(f"\n{'runtime':<11}{'build s':>8}{'net us':>14}{'S':>7}{'K':>7}{'MAPE':>7}"
              f"{'±10%':>6}{'eager S':>9}{'FLOPs S':>9}{'x eager':>9}{'deleg.':>8}{'flips':>16}")
        eager_us = (np.array([a["measured_us"] for a in reports["cpu"]["archs"]])
                    if "cpu" in reports else None)
        for rt, rep in reports.items():
            meas = np.array([a["measured_us"] for a in rep["archs"]])
            t = rep["table"]
            es = (stats.spearmanr([eager.predict(a, "raw") for a in archs], meas)[0]
                  if eager is not None else float("nan"))
            speed = float(np.median(meas / eager_us)) if eager_us is not None else float("nan")
            deleg = [e.stats.get("delegated") for e in tables[rt].entries.values()
                     if e.stats and "delegated" in e.stats]
            dtxt = f"{100 * np.mean([d == 1.0 for d in deleg]):.0f}%" if deleg else "-"
            if eager is not None and rt != "cpu":
                f, tot = pair_flips(space, eager, tables[rt])
                ftxt = f"{f}/{tot} ({100 * f / tot:.0f}%)"
            else:
                ftxt = "-"
            print(f"{rt:<11}{built[rt]:8.0f}{meas.min():7.0f}-{meas.max():<6.0f}"
                  f"{t['spearman']:7.3f}{t['kendall']:7.3f}{100 * t['mape']:6.1f}%"
                  f"{100 * t['within_10pct']:5.0f}%{es:9.3f}{rep['flops_proxy']['spearman']:9.3f}"
                  f"{speed:9.2f}{dtxt:>8}{ftxt:>16}")
        print("\nS/K/MAPE/±10%: the runtime's table against its own end-to-end measurement; "
              "eager S: the eager table's prediction against it; x eager: median network time "
              "relative to eager; deleg.: entries fully delegated to XNNPACK; flips: ordered op "
              "pairs per layer ranked differently from the eager table.")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
