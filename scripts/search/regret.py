"""Does the search return a better network than others of the same latency?

Searches on the benchmark's space for every --modes x --weights x --seeds x --targets, each
scored against the ground truth (`fbnas bench score`): the returned network's regret (the best
true accuracy among networks no slower, minus its own; points), its percentile among the
networks within ±3% of its latency, Kendall τ of the supernet's path accuracy against the
truth over every network of the space (computed on the --tau-at target's runs only: it costs a
BN re-estimation per network), the search's wall seconds; beside them the baselines: a random
network of matched latency (mean regret) and random search given the search's wall time; and
what the target allows: the returned network's measured latency against the target, and the
lowest regret among the networks a fit to that target may return (within ±3% of it, or the
fit's rule in a gap: `fbnas.bench.score.on_target`) and the best percentile one of them reaches
(`pct*`); exhaustive training of those networks (`exh`: each trained once, the best validation
accuracy kept; its regret, mean over the benchmark's seeds).
Then per (mode, weights): the median regret, how many runs landed in the top 10% of their
latency-matched networks and in how many that was possible at all (`top10*`: a network in the
top 10% lay on the target) or done by exhaustive training (`exh10`: the seeds' share, summed),
how many beat matched random, the median τ.

    python -m scripts.search.regret --modes reinforce --weights shared --seeds 0,1,2 \\
        --targets 0.3x,0.5x,0.8x --jobs 2 --keep runs/regret
    python -m scripts.search.regret --set search.shared_update=all --keep runs/regret-all

The grid is one `fbnas sweep --grid search.mode=… --grid search.weights=… --grid
loss.target=… --seeds … --no-retrain --threads 1` (on Ray with --jobs > 1): each
search with one torch thread and search.fit_measure off (networks are fitted to the target by
the table: concurrent searches must not time networks); the benchmark's latency is the one it
measured. With --keep, the sweep resumes there: a finished search is scored again, not re-run
(`fbnas bench score DIR --bench FILE` scores the same runs).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from fbnas.bench.score import score_run
from fbnas.bench.table import Bench
from fbnas.sweep.driver import Sweep
from fbnas.sweep.grid import parse_axis
from fbnas.sweep.ray_tasks import RaySweep
from scripts.common import BENCH_CONFIG, BENCH_FILE, QUIET


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=str(BENCH_FILE))
    ap.add_argument("--config", default=str(BENCH_CONFIG), help="the benchmark space's config")
    ap.add_argument("--modes", default="reinforce")
    ap.add_argument("--weights", default="shared")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--targets", default="0.3x,0.5x,0.8x")
    ap.add_argument("--tau-at", default="0.5x", help="the target whose runs τ is computed on "
                                                     "('all', or 'none')")
    ap.add_argument("--jobs", type=int, default=2, help="searches at once (one thread each; "
                                                        "more than 1: on Ray)")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--keep", metavar="DIR", help="keep the sweep in DIR (a re-run resumes it "
                                                  "and scores its runs again)")
    a = ap.parse_args(argv)
    bench = Bench.load(a.bench)
    with tempfile.TemporaryDirectory() as tmp:
        sw = Sweep(a.config, "search.mode", a.modes.split(","), out=Path(a.keep or tmp) / "sweep",
                   overrides=["search.fit_measure=off", *QUIET, *a.sets], retrain=False,
                   seeds=[int(s) for s in a.seeds.split(",")], threads=1,
                   grid=[parse_axis(f"search.weights={a.weights}"),
                         parse_axis(f"loss.target={a.targets}")])
        done = RaySweep(sw, a.jobs).run() if a.jobs > 1 else sw.run()
        if failed := [f["label"] for f in done.get("failed", []) if f["phase"] == "search"]:
            raise SystemExit(f"search.regret: searches failed: {', '.join(failed)} (re-run the "
                             "same command with --keep DIR to retry them)")
        # (mode, weights, seed, target) -> the search's run directory
        runs = {(sp.value, dict(sp.settings)["search.weights"], sp.seed,
                 dict(sp.settings)["loss.target"]): Path(sp.cfg.run.dir) for sp in sw.plan}
        grid = list(runs)
        print(f"searches of {a.config} {' '.join(a.sets)} scored on {a.bench} "
              f"({len(bench)} networks)")
        print(f"{'mode':10s} {'weights':8s} {'seed':>4s} {'target':>6s} {'regret':>6s} "
              f"{'pct':>5s} {'tau':>5s} {'rnd':>5s} {'rndS':>5s} {'lat':>6s} {'onT':>5s} "
              f"{'pct*':>4s} {'exh':>5s} {'sec':>5s}  network")
        rows = {}
        for g in grid:
            rank = a.tau_at == "all" or g[3] == a.tau_at
            s = score_run(bench, runs[g], rank=rank)
            rows[g] = s
            print(f"{g[0]:10s} {g[1]:8s} {g[2]:4d} {g[3]:>6s} {100 * s.regret:6.2f} "
                  f"{s.percentile:5.0f} {s.kendall_tau:5.2f} {100 * s.random_regret:5.2f} "
                  f"{100 * s.random_search_regret:5.2f} {s.latency / s.target - 1:+6.1%} "
                  f"{100 * s.on_target_regret:5.2f} {s.on_target_percentile:4.0f} "
                  f"{100 * s.exhaustive_regret:5.2f} {s.search_seconds:5.0f}  "
                  + " ".join(o.replace("ir_", "") for o in s.ops), flush=True)
    print("\nper mode (regret in points; top10: percentile >= 90; >rnd: regret below the "
          "matched random network's mean)")
    print(f"{'mode':10s} {'weights':8s} {'runs':>4s} {'med regret':>10s} {'top10':>5s} "
          f"{'top10*':>6s} {'exh10':>5s} {'>rnd':>4s} {'med tau':>7s} {'med rnd':>7s} "
          f"{'med rndS':>8s} {'med onT':>7s} {'med exh':>7s} {'med sec':>7s}")
    for mode, weights in dict.fromkeys((g[0], g[1]) for g in grid):
        ss = [s for g, s in rows.items() if g[:2] == (mode, weights)]
        taus = [s.kendall_tau for s in ss if s.kendall_tau == s.kendall_tau]
        print(f"{mode:10s} {weights:8s} {len(ss):4d} "
              f"{100 * statistics.median(s.regret for s in ss):10.2f} "
              f"{sum(s.percentile >= 90 for s in ss):5d} "
              f"{sum(s.on_target_percentile >= 90 for s in ss):6d} "
              f"{sum(s.exhaustive_top10 for s in ss):5.1f} "
              f"{sum(s.regret < s.random_regret for s in ss):4d} "
              f"{statistics.median(taus) if taus else float('nan'):7.2f} "
              f"{100 * statistics.median(s.random_regret for s in ss):7.2f} "
              f"{100 * statistics.median(s.random_search_regret for s in ss):8.2f} "
              f"{100 * statistics.median(s.on_target_regret for s in ss):7.2f} "
              f"{100 * statistics.median(s.exhaustive_regret for s in ss):7.2f} "
              f"{statistics.median(s.search_seconds for s in ss):7.0f}")


if __name__ == "__main__":
    main()
