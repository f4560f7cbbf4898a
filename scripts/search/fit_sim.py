"""What does a measuring run return on the benchmark?

`search.regret` fits by the table alone (concurrent searches cannot time networks). This
re-runs each kept run's final pick and measured fit (`search.fit_measure: on`) with the timing
drawn from the benchmark instead of a clock: a network measures its end-to-end latency in the
benchmark times exp(N(0, --sigma)) (the VM's re-measurement sd is about 1%), under --draws
noise seeds per run. Prints per run the mean regret of what the measured fit returns (points),
the share of draws in the top 10% of its latency, its measured offset from the target and
the share whose next re-measurement falls outside ±fit_tolerance; then the median and mean
regret over the runs. No timing, so it can share the machine.

    python -m scripts.search.regret --keep runs/regret
    python -m scripts.search.fit_sim runs/regret/*
    python -m scripts.search.fit_sim --bench configs/bench_digits_b.json.gz runs/regret-b/*
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from pathlib import Path

import torch

from fbnas.arch import arch_from_indices
from fbnas.bench.score import percentile, regret, truth
from fbnas.bench.table import Bench
from fbnas.fit.search_run import SearchRun
from fbnas.fit.select import Selector, rank_paths
from fbnas.sweep.grid import searched_runs
from fbnas.training.distributed import DistContext
from fbnas.training.evaluate import validate_weights
from scripts.common import BENCH_FILE


def final_pick(run: SearchRun, cfg, target: float) -> list[list[int]]:
    """The final pick made again on this code from the run's θ and weights (as the trainer
    makes it: the band's most probable networks ranked by their paths on the supernet), so a
    change to the pick is simulated on the same θ; [] with `search.final_pick: theta`."""
    if cfg.search.final_pick != "path":
        return []
    net, data, cpu = run.supernet(), run.search_data(cfg), torch.device("cpu")
    cands = Selector(cfg, run.theta, run.costs, target).candidates()
    ranked, _ = rank_paths(cands, [validate_weights(net, data, cpu, *net.path(c),
                                                    cfg.search.bn_calib_samples, DistContext())
                                   for c in cands])
    return [cands[i] for i in ranked]


def simulate(bench: Bench, run_dir: Path, draws: int, sigma: float) -> dict[str, float]:
    t = truth(bench)
    run = SearchRun.open(run_dir)
    cfg = run.config_with(["search.fit_measure=on"])
    tol = cfg.search.fit_tolerance
    target = run.target
    prefer = final_pick(run, cfg, target)

    def key(idx):
        return bench.key(arch_from_indices(cfg.space, list(idx), "sim"))

    regs, top, offs, outside = [], [], [], []
    for d in range(draws):
        rng = random.Random(d)

        def measure(idx, rng=rng):
            return t[key(idx)]["latency"] * math.exp(rng.gauss(0, sigma)), 0.02

        sel = Selector(cfg, run.theta, run.costs, target, lambda s: None, str(run_dir),
                       fit_measure="on", measure=measure).select(recorded=prefer)
        k = key(sel.indices)
        regs.append(100 * regret(t, k))
        top.append(percentile(t, k, 0.03) >= 90)
        offs.append(t[k]["latency"] / target - 1)
        again = random.Random(10_000 + d)
        outside.append(statistics.fmean(
            abs(t[k]["latency"] * math.exp(again.gauss(0, sigma)) / target - 1) > tol
            for _ in range(200)))
    return {"regret": statistics.fmean(regs), "top10": statistics.fmean(top),
            "offset": statistics.median(offs), "outside": statistics.fmean(outside)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run directories kept by search.regret, or its "
                                            "sweep folder")
    ap.add_argument("--bench", default=str(BENCH_FILE))
    ap.add_argument("--draws", type=int, default=20, help="noise seeds per run")
    ap.add_argument("--sigma", type=float, default=0.01, help="sd of a timing's log")
    a = ap.parse_args(argv)
    bench = Bench.load(a.bench)
    rows = []
    print(f"{'run':28s} {'regret':>6s} {'top10':>5s} {'offset':>7s} {'outside':>7s}")
    for rd in searched_runs(a.runs):
        r = simulate(bench, rd, a.draws, a.sigma)
        rows.append(r)
        print(f"{rd.name:28s} {r['regret']:6.2f} {r['top10']:5.2f} {r['offset']:+7.1%} "
              f"{r['outside']:7.0%}", flush=True)
    regs = [r["regret"] for r in rows]
    print(f"{len(rows)} runs, {a.draws} draws each (sigma {a.sigma:.1%}): median regret "
          f"{statistics.median(regs):.2f} pt, mean {statistics.fmean(regs):.2f}, top 10% "
          f"{sum(r['top10'] for r in rows):.1f}/{len(rows)}, re-measured outside the "
          f"tolerance {statistics.fmean(r['outside'] for r in rows):.0%}")


if __name__ == "__main__":
    main()
