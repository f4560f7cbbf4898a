"""`fbnas bench score RUN…`: a search run on the benchmark's space, judged by the truth.

For the run's returned network (its arch_hard.yaml):
- true accuracy: its mean test top-1 over the benchmark's seeds at the full budget;
- regret: the best true accuracy among networks measured no slower than it, minus its own;
- percentile: the share of networks within ±`near` of its measured latency that it is at least
  as accurate as (100: the best of them);
- on-target regret: the lowest regret among the networks a fit to the run's target may return
  (`on_target`: measured within ±search.fit_tolerance of it, or, in a gap of the space's costs,
  within the nearest one's distance plus the tolerance): what the latency asked for allows;
- the ceiling of the percentile: the best percentile any of those networks reaches (where it is
  under 90, no network on the target is in the top 10% of its latency-matched ones);
- exhaustive training: every network the target allows trained once (each of the benchmark's
  seeds in turn) and the best validation accuracy kept: its regret and percentile (means over
  the seeds), what a search that could afford to train them all would return;
- the supernet's ranking of every network of the space: Kendall τ and Spearman ρ between the
  path accuracy on the supernet's weights (BN re-estimated, as `fbnas fidelity` computes it) and
  the networks' mean validation accuracy, and Kendall τ between the two validation CEs.

How it compares with a random network of its latency, as a user reads it: `beats_random`, the
chance that it is more accurate than one drawn from the networks within ±`near` of its latency
(ties count half; the median over runs is the share of its band a typical pick beats).

The ranking inside latency bands, where the choice is made: `tau_within`, Kendall τ of the
supernet's path accuracy against the truth inside disjoint bands of latency (`bands`: log-width
2·log(1 + near), those of at least 5 networks, weighted by size); like for like against one
training, `tau_seed` (the supernet against one seed's validation accuracy, mean over seeds)
beside the yardstick `yardstick_tau` (one seed's against another's, over the space) and
`yardstick_tau_within` (the same inside the bands).

Baselines beside it: a random network of matched latency (within ±`near`: the mean regret of
those networks and its standard deviation), and random search given the search's wall time
(networks of matched latency drawn and "trained" by `Bench.query` until their recorded training
seconds add up to the search's; the one with the best queried validation accuracy kept; mean
regret over `trials` such searches).

On a sampled benchmark (`Bench.sampled`: a reference sample of N networks per target band plus
added networks, fbnas.bench.sample) the run's network must be in the file (drawn or added:
`fbnas bench add`), and every figure above is read over the reference sample instead of every
network (`Score.sampled`, `Score.reference`): the percentile and `beats_random` over the
reference networks within ±`near` of its latency (the pick counted among them only if it was
drawn), regret against the best reference network no slower (or itself: never below 0), the
random baselines drawing from the reference networks of matched latency, τ over the reference
networks. The on-target and exhaustive-training figures are those of the sampled networks
measured within ±fit_tolerance of the target; where none is, they are omitted
(`Score.omitted` says why: the fit's rule in a gap needs every network's latency). A pick whose
latency no reference network is near (outside the sample's bands) is a one-line error.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fbnas.bench.fidelity import supernet_accuracy
from fbnas.bench.table import Bench, check_space
from fbnas.errors import FbnasError
from fbnas.fit.onto_target import near_or_nearest
from fbnas.fit.search_run import SearchRun
from fbnas.settings import LATENCY_TOLERANCE

TRUTH = "test_acc"  # what regret and percentile judge by (mean over seeds, full budget)


@dataclass
class Score:
    """One run judged (the module docstring defines each figure); on a sampled benchmark
    (`sampled`) every figure is read over its `reference` networks, not the space's."""

    run: str
    ops: list[str]
    latency: float
    true_acc: float
    regret: float
    percentile: float
    matched: int  # networks within ±near of its latency
    kendall_tau: float
    spearman_rho: float
    kendall_tau_ce: float
    search_seconds: float
    target: float  # the run's latency target (nan: none recorded)
    on_target_regret: float  # the lowest regret a network the fit may return has (`on_target`)
    on_target: int  # how many networks the fit may return
    on_target_percentile: float  # the best percentile one of those networks reaches
    exhaustive_regret: float  # every on-target network trained once, best validation kept
    exhaustive_percentile: float
    exhaustive_top10: float  # the share of the seeds whose pick has percentile >= 90
    random_regret: float
    random_regret_sd: float
    random_search_regret: float
    random_search_networks: float
    beats_random: float = math.nan  # P(more accurate than a random network of its latency)
    tau_within: float = math.nan  # supernet vs truth inside latency bands
    tau_seed: float = math.nan  # supernet vs one seed's validation accuracy (like for like)
    yardstick_tau: float = math.nan  # one seed's validation accuracy against another's
    yardstick_tau_within: float = math.nan  # the same inside latency bands
    sampled: bool = False  # the truth is a reference sample: every figure is over the sample
    reference: int = 0  # the complete networks the figures are read over (all, or the sample's)
    omitted: str = ""  # why the on-target and exhaustive figures are omitted (NaN), if they are

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def truth(bench: Bench) -> dict[str, dict[str, float]]:
    """Per network: latency (measured end to end, else predicted), mean test top-1, mean
    validation top-1 and CE, at the full budget."""
    out = {}
    for k in bench:
        if not bench.complete(k):
            continue
        n = bench.networks[k]
        lat = n.get("measured") if n.get("measured") is not None else n["predicted"]
        out[k] = {"latency": float(lat), "acc": bench.mean(k, TRUTH),
                  "val_acc": bench.mean(k, "val_acc"), "val_ce": bench.mean(k, "val_ce")}
    return out


def regret(t: dict[str, dict[str, float]], k: str,
           among: dict[str, dict[str, float]] | None = None) -> float:
    """The best true accuracy among networks no slower than `k` (those of `among`, default
    `t`, and `k` itself), minus `k`'s."""
    lat = t[k]["latency"]
    pool = t if among is None else among
    return max([t[k]["acc"], *(v["acc"] for v in pool.values() if v["latency"] <= lat)]
               ) - t[k]["acc"]


def matched(t: dict[str, dict[str, float]], lat: float, near: float) -> list[str]:
    return [j for j, v in t.items() if abs(v["latency"] / lat - 1) <= near]


def on_target(t: dict[str, dict[str, float]], target: float, tol: float) -> list[str]:
    """The networks a fit to `target` may return: those measured within ±`tol` of it, or, where
    none is (a gap of the space's costs), those within the nearest one's distance plus
    log(1 + tol) in log-latency, the fit's rule in a gap (`near_or_nearest`)."""
    ks = list(t)
    ok = near_or_nearest([t[j]["latency"] for j in ks], target, tol)
    return [j for j, k in zip(ks, ok, strict=True) if k]


def _mean(xs) -> float:
    xs = list(xs)
    return statistics.fmean(xs) if xs else math.nan


def percentile(t: dict[str, dict[str, float]], k: str, near: float,
               among: dict[str, dict[str, float]] | None = None) -> float:
    """The share of networks (of `among`, default `t`) within ±`near` of `k`'s latency that
    `k` is at least as accurate as, in percent (100: the best of them); NaN where none is."""
    pool = matched(t if among is None else among, t[k]["latency"], near)
    if not pool:
        return math.nan
    return 100.0 * sum(t[j]["acc"] <= t[k]["acc"] for j in pool) / len(pool)


def beats(t: dict[str, dict[str, float]], k: str, near: float,
          among: dict[str, dict[str, float]] | None = None) -> float:
    """The chance that `k` is more accurate than a network drawn from the others (of `among`,
    default `t`) within ±`near` of its latency (ties count half); NaN where it has no such
    neighbour."""
    mine = t[k]["acc"]
    pool = [t[j]["acc"] for j in matched(t if among is None else among, t[k]["latency"], near)
            if j != k]
    return _mean(1.0 if a < mine else 0.5 if a == mine else 0.0 for a in pool)


def bands(t: dict[str, dict[str, float]], near: float) -> list[list[str]]:
    """Disjoint latency bands, from the fastest network up: each holds the networks up to
    (1 + near)² times its fastest one's latency."""
    out: list[list[str]] = []
    lo = None
    for j in sorted(t, key=lambda j: t[j]["latency"]):
        if lo is None or t[j]["latency"] > lo * (1 + near) ** 2:
            out.append([])
            lo = t[j]["latency"]
        out[-1].append(j)
    return out


def tau_within(groups: list[list[str]], x: dict[str, float], y: dict[str, float],
               smallest: int = 5) -> float:
    """Kendall τ of `x` against `y` inside each group of at least `smallest` networks, the
    groups' mean weighted by their sizes (NaN where no group is large enough or every τ is
    undefined)."""
    from scipy import stats  # scipy.stats: 0.6 s, here only

    num = den = 0.0
    for g in groups:
        if len(g) < smallest:
            continue
        tau = float(stats.kendalltau([x[j] for j in g], [y[j] for j in g]).statistic)
        if math.isfinite(tau):
            num, den = num + len(g) * tau, den + len(g)
    return num / den if den else math.nan


def seed_values(bench: Bench, keys: list[str], metric: str = "val_acc") -> list[dict[str, float]]:
    """Per benchmark seed: each network's `metric` at the full budget under that seed."""
    b = str(bench.budgets[-1])
    return [{k: float(bench.networks[k]["runs"][str(s)][b][metric]) for k in keys}
            for s in bench.seeds]


def exhaustive(bench: Bench, pool: list[str]) -> list[str]:
    """Per seed of the benchmark: the network of `pool` with the best validation accuracy
    of that seed's training at the full budget (ties: the lower CE), as training every network
    of `pool` once would find it."""
    b = str(bench.budgets[-1])
    def val(k: str, s: int) -> tuple[float, float]:
        r = bench.networks[k]["runs"][str(s)][b]
        return float(r["val_acc"]), -float(r["val_ce"])
    return [max(pool, key=lambda k: val(k, s)) for s in bench.seeds] if pool else []


def random_search(bench: Bench, pool: list[str], seconds: float, rng: random.Random
                  ) -> tuple[str, int]:
    """Random search over `pool` until the queried training seconds reach `seconds` (at least
    one network): the network with the best queried validation accuracy, and how many."""
    best, best_val, n, spent = None, -math.inf, 0, 0.0
    while best is None or spent < seconds:
        k = rng.choice(pool)
        rec = bench.query(k, seed=rng.choice(bench.seeds))
        spent += rec["seconds"]
        n += 1
        if rec["val_acc"] > best_val:
            best, best_val = k, rec["val_acc"]
    return best, n


def supernet_ranking(run: SearchRun, bench: Bench, keys: list[str]) -> dict[str, tuple]:
    """Per network: (supernet path accuracy, CE) on the run's validation split."""
    cfg = run.config
    check_space(bench, cfg, run.dir)
    net, data = run.supernet(), run.search_data()
    device = torch.device("cpu")
    return {k: supernet_accuracy(net, bench.arch(k), cfg, data, device) for k in keys}


def score_run(bench: Bench, run_dir: str | Path, near: float = LATENCY_TOLERANCE, trials: int = 200,
              seed: int = 0, rank: bool = True) -> Score:
    from scipy import stats  # scipy.stats: 0.6 s, here only

    run = SearchRun.open(run_dir)
    arch = run.arch
    if arch is None:
        if not run.checkpoint.is_file():
            raise FbnasError(f"{run_dir}: not a search run (it holds no {run.checkpoint.name}; "
                             "give a folder `fbnas train` wrote)")
        raise FbnasError(f"{run.files.arch}: no such file (the search has not finished)")
    k = bench.key(arch, str(run.files.arch))
    t = truth(bench)
    if k not in t:
        raise FbnasError(f"{run_dir}: its network {arch.short_hash} is not complete in the "
                         "benchmark")
    # the networks the truth is read over: all, or the reference sample's
    ref = t if not bench.sampled else {j: t[j] for j in bench.reference() if j in t}
    lat = t[k]["latency"]
    pool = matched(ref, lat, near)
    if not pool:
        drawn = ", ".join(f"{b['target']} ({b['lo']:.6g}-{b['hi']:.6g})"
                          for b in bench.meta["sample"]["band_list"])
        raise FbnasError(f"{run_dir}: no network of {bench.path}'s reference sample lies within "
                         f"±{near:.0%} of its network's latency {lat:.6g} "
                         f"{bench.meta['latency']['unit']} (the sample's bands, predicted: "
                         f"{drawn}); build a sampled benchmark with a band at its target")
    mine = t[k]["acc"]
    pct = percentile(t, k, near, ref)
    regrets = [regret(t, j, ref) for j in pool]
    secs = run.search_seconds
    target = float(arch.meta.get("target", math.nan))
    omitted = ""
    if math.isnan(target):
        feasible = []
    elif bench.sampled:  # the fit's rule in a gap would need every network's latency
        feasible = [j for j in ref if abs(ref[j]["latency"] / target - 1) <= run.fit_tolerance]
        if not feasible:
            omitted = (f"no network of the reference sample is measured within "
                       f"±{run.fit_tolerance:.0%} of the target {target:.6g} (the fit's rule "
                       "in a gap needs every network)")
    else:
        feasible = on_target(t, target, run.fit_tolerance)
    best_trained = exhaustive(bench, feasible)
    rng = random.Random(seed)
    found = [random_search(bench, pool, secs, rng) for _ in range(trials)]
    tau = rho = tau_ce = tau_band = tau_seed = math.nan
    keys = sorted(ref)
    groups = bands(ref, near)
    per_seed = seed_values(bench, keys)
    yard = yard_band = math.nan
    if len(per_seed) >= 2:
        yard = float(stats.kendalltau([per_seed[0][j] for j in keys],
                                      [per_seed[1][j] for j in keys]).statistic)
        yard_band = tau_within(groups, per_seed[0], per_seed[1])
    if rank:
        est = supernet_ranking(run, bench, keys)
        path_acc = {j: est[j][0] for j in keys}
        tau_band = tau_within(groups, path_acc, {j: t[j]["val_acc"] for j in keys})
        tau_seed = _mean(float(stats.kendalltau([path_acc[j] for j in keys],
                                                [v[j] for j in keys]).statistic)
                         for v in per_seed)
        tau = float(stats.kendalltau([est[j][0] for j in keys],
                                     [t[j]["val_acc"] for j in keys]).statistic)
        rho = float(stats.spearmanr([est[j][0] for j in keys],
                                    [t[j]["val_acc"] for j in keys]).statistic)
        tau_ce = float(stats.kendalltau([est[j][1] for j in keys],
                                        [t[j]["val_ce"] for j in keys]).statistic)
    return Score(
        run=str(run.dir), ops=list(arch.ops), latency=lat, true_acc=mine,
        regret=regret(t, k, ref), percentile=pct, matched=len(pool), kendall_tau=tau,
        spearman_rho=rho, kendall_tau_ce=tau_ce, search_seconds=secs, target=target,
        on_target_regret=min((regret(t, j, ref) for j in feasible), default=math.nan),
        on_target=len(feasible),
        on_target_percentile=max((percentile(t, j, near, ref) for j in feasible),
                                 default=math.nan),
        exhaustive_regret=_mean(regret(t, j, ref) for j in best_trained),
        exhaustive_percentile=_mean(percentile(t, j, near, ref) for j in best_trained),
        exhaustive_top10=_mean(percentile(t, j, near, ref) >= 90 for j in best_trained),
        random_regret=statistics.fmean(regrets),
        random_regret_sd=statistics.pstdev(regrets),
        random_search_regret=statistics.fmean(regret(t, j, ref) for j, _ in found),
        random_search_networks=statistics.fmean(n for _, n in found),
        beats_random=beats(t, k, near, ref), tau_within=tau_band, tau_seed=tau_seed,
        yardstick_tau=yard, yardstick_tau_within=yard_band, sampled=bench.sampled,
        reference=len(ref), omitted=omitted)
