"""`fbnas bench duel --config C --out DIR`: for the compute a search costs, is its network
better than random search's at that cost? (fbnas.bench.duel; docs/bench.md "The duel")

Per target × seed, interleaved: the shipped search as a user runs it (`fbnas train`, its own
process, --threads threads; cost C = its wall time) against random search that trains networks
of the target's band for C seconds on the same threads; both picks retrained under
--retrain-seeds (none of the pairs' seeds). Prints per pair and per target: the paired mean
difference in test accuracy (search − random, points) with its 95% bootstrap interval, wins,
the median cost ratio R = C / one child training, the R = 1 comparison (the search's pick
against the median of the random side's trained networks), each pick's latency offset and,
with --bench, its percentile among the file's reference networks within ±3% of its latency.
Resumable: DIR/pairs.json holds each pair's stages as they finish (a re-run skips them); the
figures go to DIR/duel.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from fbnas.errors import FbnasError

# the searches print no progress bars and write no TensorBoard files
QUIET = ["run.progress=false", "run.tensorboard=false"]


def _ints(raw: str, flag: str) -> list[int]:
    try:
        return [int(s) for s in raw.split(",") if s.strip()]
    except ValueError as e:
        raise FbnasError(f"{flag} {raw!r}: integers separated by commas") from e


def _pct(v: float | None) -> str:
    return "  -" if v is None or v != v else f"{v:3.0f}"


def add_parser(actions) -> None:
    ap = actions.add_parser("duel", help="the shipped search against random search that "
                                         "trains networks of its band for the search's wall "
                                         "time, per target x seed, both picks retrained")
    ap.add_argument("--config", required=True, help="the search's config (as a user runs it)")
    ap.add_argument("--targets", default="0.5x,0.8x", metavar="T1,T2,...",
                    help="the targets, as loss.target reads them")
    ap.add_argument("--seeds", default="0,1,2,3,4,5", metavar="S1,S2,...",
                    help="the search seeds (search.seed): one pair per target and seed")
    ap.add_argument("--retrain-seeds", default="1000,1001,1002,1003,1004", metavar="S1,S2,...",
                    help="the fresh seeds both picks are retrained under")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of both sides")
    ap.add_argument("--out", required=True, metavar="DIR",
                    help="the duel's folder (resumed when it exists)")
    ap.add_argument("--bench", metavar="FILE",
                    help="a benchmark file of the config's space: each pick's percentile among "
                         "its reference networks")
    ap.add_argument("--own-table", action="store_true",
                    help="each search measures its own latency table (its build in C, as a "
                         "user's first search); default: the machine's table cache is shared")
    ap.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                    help="an override for both sides (KEY=VALUE)")
    ap.set_defaults(func=run)


def run(a) -> int:
    from fbnas.bench.duel import PairStore, run_pair, summarize
    from fbnas.bench.table import Bench

    seeds = _ints(a.seeds, "--seeds")
    fresh = _ints(a.retrain_seeds, "--retrain-seeds")
    if not fresh or set(fresh) & set(seeds):
        raise FbnasError(f"--retrain-seeds {a.retrain_seeds}: give fresh seeds, none of "
                         f"--seeds {a.seeds}")
    targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    out = Path(a.out)
    store = PairStore(out / "pairs.json")
    bench = Bench.load(a.bench) if a.bench else None
    sets = [*QUIET, *a.sets]
    print(f"duel: {a.config} {' '.join(a.sets)}, targets {', '.join(targets)}, seeds "
          f"{a.seeds}, {a.threads} thread(s), retrained under {a.retrain_seeds}", flush=True)
    print(f"{'target':>6s} {'seed':>4s} {'C s':>7s} {'R':>5s} {'nets':>4s} {'search':>7s} "
          f"{'random':>7s} {'diff':>6s} {'s off':>6s} {'r off':>6s} {'s%':>3s} {'r%':>3s}")
    for s in seeds:  # interleaved: every target's pair at a seed, search then random
        for t in targets:
            rec = run_pair(store, a.config, t, s, out, fresh, a.threads, sets, bench,
                           log=lambda m: None, own_table=a.own_table)
            rs, rt = rec["random"], rec["retrain"]
            sa, ra = rt["search"]["mean_test_acc"], rt["random"]["mean_test_acc"]
            print(f"{t:>6s} {s:4d} {rec['search']['seconds']:7.1f} {rs['r']:5.2f} "
                  f"{rs['networks']:4d} {sa:7.4f} {ra:7.4f} {100 * (sa - ra):+6.2f} "
                  f"{rt['search']['offset']:+6.1%} {rt['random']['offset']:+6.1%} "
                  f"{_pct(rt['search'].get('percentile'))} "
                  f"{_pct(rt['random'].get('percentile'))}", flush=True)
    pairs = list(store.pairs.values())
    built = sum(bool(p.get("search", {}).get("table_built")) for p in pairs)
    print(f"searches that built their latency table (in their C): {built} of {len(pairs)}")
    skipped = {p["random"].get("skipped_measure") for p in pairs if "random" in p} - {""}
    if skipped:
        print(f"random side's networks not timed end to end: {'; '.join(sorted(skipped))}")
    summary = summarize(pairs, a.resamples)
    print("\nper target (diff: search − random, test accuracy in points, mean over pairs; "
          "R = C / one child training; R=1: the search's pick above the median of the "
          "random side's trained networks)")
    print(f"{'target':>6s} {'pairs':>5s} {'diff':>6s} {'95% interval':>16s} {'wins':>5s} "
          f"{'med R':>6s} {'own R':>6s} {'R=1 >med':>8s} {'P(>rnd)':>7s}  (own R: what the "
          "search recorded it spent, at a search.budget)")
    for t, v in summary.items():
        lo, hi = v["ci95_pt"]
        own = v.get("median_recorded_r")
        print(f"{t:>6s} {v['pairs']:5d} {v['mean_diff_pt']:+6.2f} [{lo:+6.2f}, {hi:+6.2f}] "
              f"{v['wins']:2d}/{v['pairs']:<2d} {v['median_r']:6.2f} "
              f"{'-' if own is None else f'{own:.2f}':>6s} "
              f"{v['r1_beats_median'] * v['pairs']:4.0f}/{v['pairs']:<3d} "
              f"{v['r1_beats_random']:7.2f}")
    for t, v in summary.items():
        if v["with_percentile"]:
            print(f"{t:>6s} percentile in the reference sample ({v['with_percentile']} pairs): "
                  f"search median {v['search_percentile_median']:.0f}, "
                  f"{v['search_top10']} at or above the 90th; random median "
                  f"{_pct(v['random_percentile_median']).strip()}, {v['random_top10']} at or "
                  "above the 90th")
    report = {"config": a.config, "sets": a.sets, "targets": targets, "seeds": seeds,
              "retrain_seeds": fresh, "threads": a.threads, "bench": a.bench,
              "summary": summary, "pairs": pairs}
    (out / "duel.json").write_text(json.dumps(report, indent=1))
    print(f"written: {out / 'duel.json'}")
    return 0

