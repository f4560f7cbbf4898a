"""`fbnas bench score RUN… --bench FILE`: each search run's returned network judged by the
benchmark (true accuracy, regret, percentile among networks of its latency, the supernet's
ranking of every network), beside a latency-matched random network and random search with
the same wall time. On a sampled benchmark every figure is over its reference sample, and
says so."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

from fbnas.io import write_json_atomic
from fbnas.settings import LATENCY_TOLERANCE

if TYPE_CHECKING:  # pragma: no cover
    from fbnas.bench.table import Bench


def add_parser(actions) -> None:
    p = actions.add_parser("score", help="judge search runs on the benchmark's space by "
                                         "regret, percentile and ranking")
    p.add_argument("runs", nargs="+", help="search run directories, or a sweep's folder (its "
                                           "searches: fbnas sweep --bench FILE)")
    p.add_argument("--bench", required=True, help="the benchmark file")
    p.add_argument("--near", type=float, default=LATENCY_TOLERANCE,
                   help="latency-matched: within ± this share")
    p.add_argument("--trials", type=int, default=200, help="random searches to average")
    p.add_argument("--no-rank", action="store_true",
                   help="skip the supernet's ranking of every network (faster)")
    p.add_argument("--json", help="also write the scores to this file")
    p.set_defaults(func=run)


def _f(x: float, fmt: str) -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else format(x, fmt)


def sampled_note(bench: Bench) -> str:
    """What a sampled benchmark's truth is, for the first line of a score."""
    bands = ", ".join(f"{b} ({len(ks)})" for b, ks in bench.band_keys().items())
    ref = [k for k in bench.reference() if bench.complete(k)]
    return (f"{bench.path}: the truth is SAMPLED, not every network: {len(ref)} reference "
            f"networks trained, drawn uniformly from the networks predicted in each band "
            f"(±{bench.spec.band_width:.0%}: {bands}); every figure below is over that "
            "sample (percentiles and random baselines estimate the band's; regret and the "
            "on-target figures are against the sample's best, not the space's)")


def run(args) -> int:
    from fbnas.bench.score import score_run
    from fbnas.bench.table import Bench
    from fbnas.sweep.grid import searched_runs

    bench = Bench.load(args.bench)
    if bench.sampled:
        print(sampled_note(bench))
    scores = []
    for r in searched_runs(args.runs):
        s = score_run(bench, r, args.near, args.trials, rank=not args.no_rank)
        scores.append(s)
        print(f"{r}: {' '.join(s.ops)}  {s.latency:.1f} {bench.meta['latency']['unit']}, true "
              f"acc {s.true_acc:.4f}, regret {100 * s.regret:.2f} pt, percentile "
              f"{_f(s.percentile, '.0f')} of {s.matched} matched"
              f"{' (of the reference sample)' if s.sampled else ''}; supernet tau "
              f"{_f(s.kendall_tau, '.3f')} rho {_f(s.spearman_rho, '.3f')} tau_ce "
              f"{_f(s.kendall_tau_ce, '.3f')}; search {s.search_seconds:.0f} s")
        print(f"  more accurate than a random network of its latency: P = "
              f"{_f(s.beats_random, '.2f')}; inside latency bands the supernet ranks at tau "
              f"{_f(s.tau_within, '.3f')} (one training against another: "
              f"{_f(s.yardstick_tau_within, '.3f')}); against one seed, tau "
              f"{_f(s.tau_seed, '.3f')} (yardstick {_f(s.yardstick_tau, '.3f')})"
              f"{f'; tau over the {s.reference} reference networks' if s.sampled else ''}")
        print(f"  random matched network{' (of the sample)' * s.sampled}: regret "
              f"{100 * s.random_regret:.2f} ± "
              f"{100 * s.random_regret_sd:.2f} pt; random search"
              f"{' over the sample' * s.sampled} ({s.random_search_networks:.1f}"
              f" networks in the same time): regret {100 * s.random_search_regret:.2f} pt")
        if s.on_target and s.sampled:
            print(f"  over the sample: its target {s.target:.1f} {bench.meta['latency']['unit']}"
                  f" allows {s.on_target} of the reference networks (measured within the fit's "
                  f"tolerance); the best of them: regret {100 * s.on_target_regret:.2f} pt, "
                  f"the best percentile {s.on_target_percentile:.0f}; each of those trained "
                  f"once, the best validation accuracy kept: regret "
                  f"{100 * s.exhaustive_regret:.2f} pt, percentile "
                  f"{s.exhaustive_percentile:.0f} (mean over the seeds)")
        elif s.on_target:
            print(f"  its target {s.target:.1f} {bench.meta['latency']['unit']} allows "
                  f"{s.on_target} network(s) (measured within the fit's tolerance, or its rule in "
                  f"a gap); the best of them: regret {100 * s.on_target_regret:.2f} pt, the "
                  f"best percentile {s.on_target_percentile:.0f}; each trained once, the best "
                  f"validation accuracy kept: regret {100 * s.exhaustive_regret:.2f} pt, "
                  f"percentile {s.exhaustive_percentile:.0f} (mean over the seeds)")
        if s.omitted:
            print(f"  on-target and exhaustive-training figures omitted: {s.omitted}")
    if args.json:
        write_json_atomic(args.json, [s.to_dict() for s in scores])
    if len(scores) > 1:
        med = sorted(s.regret for s in scores)[len(scores) // 2]
        share = statistics.median(s.percentile for s in scores)
        p_rand = statistics.fmean(s.beats_random for s in scores
                                  if not math.isnan(s.beats_random)) if any(
            not math.isnan(s.beats_random) for s in scores) else math.nan
        print(f"{len(scores)} runs: median regret {100 * med:.2f} pt, in the top 10% of their "
              f"latency {sum(s.percentile >= 90 for s in scores)}/{len(scores)}; the median "
              f"pick is at least as accurate as {share:.0f}% of its latency band, and more "
              f"accurate than a random network of its latency with P = {_f(p_rand, '.2f')}; "
              f"a network in the top 10% was on the target in "
              f"{sum(s.on_target_percentile >= 90 for s in scores)}/{len(scores)}"
              f"{' (all over the reference sample)' if bench.sampled else ''}")
    return 0
