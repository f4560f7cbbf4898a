"""Does a search hit the latency it was asked for? Mode × target × seed on the quickstart.

For each search mode, each target (positions in the quickstart space's latency range, or
times) and each seed, runs the quickstart search with `loss.target` set, then times every found
architecture end to end, together with `--random` uniformly random ones, in one interleaved
measurement (batch 1, 1 thread, as the table), in the table's units as the measured fit
reports them (anchored to the table's probe networks where its context model records them,
else through its reference op; the end run's count through the reference op is printed too).
Per target it first prints how many architectures of the space the table predicts within ±3%
and ±1%, and the nearest predicted below and above (a target in a gap of the space cannot be
measured on, whatever the fit does; a space of more than a million architectures, as the
ImageNet one, is estimated from a million drawn at random). With `--keep DIR` the searches
stay in DIR, and a run with the same DIR re-fits their θ instead of searching again (a search
cut short resumes).

Prints per search the target, the table's prediction of the found architecture, the measured
fit's own measurement of it (`search.fit_measure`; "-" when off) and the networks it
timed, its latency re-measured right after its search (a separate interleaved run with the
random ones) and again at the end in one interleaved run of every network, each with its miss
(re-measured / target - 1), whether the end run's is within 3% and 10%, both counts, and the
median end-run / right-after ratio (the machine's drift between them, shared by every
network); the extra wall time of the measured fit per
search; then, per mode and target, the spread of measured latency across seeds (max / min - 1,
the stability figure); then the random architectures' measured range. The table is the
config's (the quickstart's cached one by default; `--set latency.device=executorch` for an
ExecuTorch table, timed in ExecuTorch).

    python -m scripts.search.target                                  # 3 modes × 3 targets × 3 seeds
    python -m scripts.search.target --modes full --targets 0.5x --seeds 0 --epochs 10  # a look
    python -m scripts.search.target --set search.fit_measure=off     # the table's fit alone
    python -m scripts.search.target --keep /tmp/bt   # keep the searches; run it again with the
                                                    # same --keep to re-fit them (no search)

Never run it beside tests or other benchmarks: the timings share the 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import tempfile
import time

import numpy as np

from fbnas.arch import Architecture, random_archs
from fbnas.fit.onto_target import every_cost
from fbnas.fit.search_run import SearchRun
from fbnas.fit.select import refit
from fbnas.latency.cost_model import cost_lists, cost_range
from fbnas.latency.end_to_end import FIT_ROUNDS, panel, time_archs, timer_for_table
from fbnas.latency.resolve import run_target
from fbnas.loss import resolve_target
from fbnas.runs.files import RunFiles
from scripts.common import QUIET, SPACES, closing, run_config, search_trainer

ENUMERATE = 1_000_000  # spaces up to this size are counted exactly; beyond, estimated
DRAWN = 1_000_000  # from this many random architectures


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(SPACES["quickstart"]))
    ap.add_argument("--modes", default="full,two_path,reinforce")
    ap.add_argument("--targets", default="0.25x,0.5x,0.75x")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, help="search.epochs (default: the config's)")
    ap.add_argument("--random", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--keep", metavar="DIR",
                    help="search runs kept in DIR; a search already finished there is not run "
                         "again: its θ is fitted anew (`fit.select.refit`, as `fbnas sample "
                         "--hard`), so a change to the final fit is measured on the same θ")
    ap.add_argument("--rounds", type=int, default=FIT_ROUNDS,
                    help="rounds of the re-measurements (default: the measured fit's)")
    args = ap.parse_args(argv)
    modes, targets = args.modes.split(","), args.targets.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    found: list[tuple[str, str, int, Architecture, float, float]] = []
    fits: list[dict] = []
    soon: list[float] = []  # each network re-measured right after its search
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="fbnas-bench-target-"))
        for mode in modes:
            for target in targets:
                for seed in seeds:
                    sets = [f"run.dir={tmp}/{mode}-{target}-{seed}", f"search.mode={mode}",
                            f"search.seed={seed}", f"loss.target={target}", *QUIET, *args.set]
                    if args.epochs:
                        sets.append(f"search.epochs={args.epochs}")
                    cfg = run_config(args.config, sets)
                    files = RunFiles(cfg.run.dir)
                    if files.arch.is_file():  # searched before (--keep): re-fit
                        sr = SearchRun.open(files.dir)
                        cfg, costs = sr.config, sr.costs
                        arch = refit(sr, log=lambda _: None)
                    else:
                        resume = files.checkpoint.is_file()  # a search cut short
                        with closing([search_trainer(cfg, theta_active=False,
                                                     resume=resume)]) as (tr,):
                            tr.train()
                        costs = tr.costs
                        arch = Architecture.load(files.arch)
                    t_us = run_target(cfg.space, cfg.loss, costs)
                    found.append((mode, target, seed, arch, t_us, arch.meta["predicted"]))
                    fits.append(arch.meta)
                    soon.append(_right_after(cfg, costs.table, arch, args))
        search_s = time.perf_counter() - t0
        # under the table's protocol (its allocator), as the measured fit and the sweep time
        table = costs.table
        timer = timer_for_table(cfg.latency, table)
        rand = random_archs(cfg.space, args.random, 12345, {f[3].hash() for f in found})
        named = {}
        for _, _, _, a, _, _ in found:
            named.setdefault(a.hash()[:16], a)
        for a in rand:
            named.setdefault(a.hash()[:16], a)
        # in the table's units, as the measured fit, fbnas sweep and retrain report
        pan = panel(cfg.space, table)
        s = time_archs(timer, named, table, pan, args.rounds)
        meas = {k: v["median_us"] for k, v in s.items()}
        via_ref = {k: v["ref_median_us"] for k, v in s.items()}
    print(f"== {len(found)} searches in {search_s:.0f} s; {len(named)} networks timed together "
          f"({timer.describe()['backend']}, batch 1, {timer.threads} thread), {pan.label}")
    rows = cost_lists(costs.rows, cfg.space.layer_candidates())
    for target in targets:
        t_us = resolve_target(target, cost_range(rows, costs.fixed))
        print(f"  {target}: {_space_near(rows, costs.fixed, t_us)}")
    print(f"{'mode':<12}{'target':>8}{'T us':>8}{'seed':>5}{'pred us':>9}{'fit us':>8}"
          f"{'nets':>6}{'soon us':>9}{'miss':>8}{'meas us':>9}{'miss':>8}  ±3%  ±10%  ops")
    hits3 = hits10 = soon3 = soon10 = ref3 = 0
    for (mode, target, seed, a, t_us, pred), fm, su in zip(found, fits, soon, strict=True):
        mu = meas[a.hash()[:16]]
        miss, smiss = mu / t_us - 1, su / t_us - 1
        hits3 += abs(miss) <= 0.03
        hits10 += abs(miss) <= 0.10
        soon3 += abs(smiss) <= 0.03
        soon10 += abs(smiss) <= 0.10
        ref3 += abs(via_ref[a.hash()[:16]] / t_us - 1) <= 0.03
        fit_us = f"{fm['measured']:8.0f}" if "measured" in fm else f"{'-':>8}"
        print(f"{mode:<12}{target:>8}{t_us:8.0f}{seed:5d}{pred:9.0f}{fit_us}"
              f"{_timed(fm):>6}{su:9.0f}{100 * smiss:7.1f}%"
              f"{mu:9.0f}{100 * miss:7.1f}%"
              f"  {_yes(abs(miss) <= 0.03)} {_yes(abs(miss) <= 0.10)} {' '.join(a.ops)}")
    print(f"re-measured right after its search (a separate interleaved run with the random "
          f"ones): within ±3%: {soon3}/{len(found)}; within ±10%: {soon10}/{len(found)}")
    print(f"re-measured at the end, all together: within ±3%: {hits3}/{len(found)}; within "
          f"±10%: {hits10}/{len(found)}")
    print(f"the end run through the reference op instead ({pan.label} above): within ±3%: "
          f"{ref3}/{len(found)}")
    shift = statistics.median(meas[a.hash()[:16]] / su for (*_, a, _, _), su
                              in zip(found, soon, strict=True))
    print(f"end run / right after, median over the networks: {shift:.3f} (the machine's state "
          "over the minutes between them, shared by every network of the end run)")
    secs = [fm["fit_seconds"] for fm in fits if "fit_seconds" in fm]
    if secs:
        print(f"measured fit: {statistics.median(secs):.1f} s per search (median; "
              f"{min(secs):.1f}-{max(secs):.1f} s), "
              f"{statistics.mean(len(_networks(fm)) for fm in fits if 'fit_rounds' in fm):.1f}"
              " networks timed on average, "
              f"{statistics.mean(len(fm['fit_rounds']) for fm in fits if 'fit_rounds' in fm):.1f}"
              " measurements")
    print("stability across seeds (measured max/min − 1, same mode and target):")
    for mode in modes:
        for target in targets:
            v = [meas[a.hash()[:16]] for md, tg, _, a, _, _ in found if md == mode and tg == target]
            if len(v) > 1:
                print(f"  {mode:<12}{target:>8}: {100 * (max(v) / min(v) - 1):5.1f}%")
    rv = sorted(meas[a.hash()[:16]] for a in rand)
    if rv:
        print(f"random architectures (n={len(rv)}): measured {rv[0]:.0f}-{rv[-1]:.0f} us, "
              f"median {statistics.median(rv):.0f} us")


def _right_after(cfg, table, arch: Architecture, args) -> float:
    """`arch` timed again right after its search, interleaved with `--random` random ones (a
    measurement separate from the fit's own), in the table's units."""
    timer = timer_for_table(cfg.latency, table)
    rand = random_archs(cfg.space, args.random, 12345, {arch.hash()})
    nets = {"found": arch, **{f"random {i}": a for i, a in enumerate(rand)}}
    return time_archs(timer, nets, table, panel(cfg.space, table), args.rounds)["found"][
        "median_us"]


def _networks(fm: dict) -> set[tuple[str, ...]]:
    """The distinct networks a measured fit timed (a confirmed one is timed twice)."""
    return {tuple(r["ops"]) for r in fm.get("fit_rounds", [])}


def _timed(fm: dict) -> str:
    """'networks/measurements' of a measured fit, for the table."""
    return f"{len(_networks(fm))}/{len(fm.get('fit_rounds', []))}"


def _space_near(rows: list[list[float]], fixed: float, target: float) -> str:
    """What the space offers near `target` by the table: how many architectures it predicts
    within ±3% and ±1%, and the nearest predicted below and above it (a target in a gap of
    the space cannot be measured on, whatever the fit does)."""
    n = math.prod(len(r) for r in rows)
    if n <= ENUMERATE:
        rel, scale, how = every_cost(rows, fixed) / target - 1, 1, ""
    else:  # too many to enumerate (the ImageNet space: 9^22): estimated from random ones
        rng = np.random.default_rng(0)
        rel = sum(np.asarray(r, dtype=float)[rng.integers(len(r), size=DRAWN)]
                  for r in rows) + fixed
        rel, scale = rel / target - 1, n / DRAWN
        how = f" (estimated from {DRAWN:,} drawn at random of {n:.2e})"
    below, above = rel[rel < 0], rel[rel >= 0]
    near = ", ".join(f"{w} {100 * v:+.1f}%" for w, v in (
        ("below", below.max() if len(below) else None),
        ("above", above.min() if len(above) else None)) if v is not None)

    def count(band: float) -> str:
        k = int(np.sum(np.abs(rel) <= band))
        return str(k) if scale == 1 else f"{scale * k:.3g}"

    return (f"{count(0.03)} architectures of the space predicted within ±3% of {target:.0f} us "
            f"by the table, {count(0.01)} within ±1%; nearest {near}{how}")


def _yes(ok: bool) -> str:
    return f"{'yes' if ok else 'NO':<4}"


if __name__ == "__main__":
    main()
