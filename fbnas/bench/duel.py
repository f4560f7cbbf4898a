"""The duel: for what a search costs, is its network better than random search's at that cost?

Per target × seed (a pair), interleaved (the search of a pair, then its random side, then the
next pair), each pair's results written as they finish (`PairStore`; a re-run skips what is
done):

1. the search side: the shipped search as a user runs it, `fbnas train --config C --set
   loss.target=T --set search.seed=S --set run.dir=…`, in a process of its own at a fixed
   thread count (`search_side`). Its cost C is the whole process's wall time (table build or
   load, search, pick and measured fit included); its pick is the run's arch_hard.yaml.
2. the random side (`random_search`): on the same threads, for C seconds, networks are drawn
   uniformly from the space (seeded by S); those whose cost the run's table predicts within
   `search.fit_tolerance` of the run's target (resolved as the search resolves it:
   `SearchRun.target`) are kept, timed end to end as the measured fit times them
   (`fit_measurer`; skipped, and said so, where the search's fit would skip it:
   `search.fit_measure: off`, a counted cost, or a table this machine cannot time), those
   measured outside the tolerance dropped, and each remaining one trained with the child
   recipe (the config's retrain section, retrain.seed = S; `train_child`). A network already
   drawn is drawn again (the draw's time counts). The budget's rule: a network whose
   training *starts* before C seconds are spent finishes and counts; the overshoot past C is
   reported (`RandomSearch.overshoot`). At least one network is trained, however long the
   draws and measurements took; a band whose every network has been drawn ends the search
   early (`exhausted`: `MAX_DRAWS` draws in a row found no new one). The network returned is
   the best by validation accuracy (the lower validation CE breaks ties). R = C / (the
   median seconds of one child training among those trained): at R = 1 the random side is
   one random network of the band.
3. both picks retrained under fresh seeds (`retrain_pick`: none of the pairs' seeds), each
   pick's test accuracy the mean over them; its latency offset from the target (measured
   where it was timed, else predicted); with a benchmark file, its percentile among the file's
   reference networks within ±3% of its latency (`fbnas.bench.score.percentile`, `among=`).

`summarize` reads the pairs per target: the paired mean difference in test accuracy
(search − random) and its 95% bootstrap interval (pairs resampled, seeded), wins (search
strictly better) and ties, the median R, and the R = 1 comparison (`r1_beats_median`: the
share of pairs whose search pick's mean test accuracy is above the median test accuracy of the
random side's trained networks, each trained once; `r1_beats_random`: the mean chance that
the pick beats one of them, ties half).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fbnas.arch import Architecture, arch_from_indices, arch_indices
from fbnas.backends.worker import reused_workers
from fbnas.bench.score import percentile, truth
from fbnas.bench.table import Bench
from fbnas.config import Config, load_config
from fbnas.errors import FbnasError
from fbnas.fit.search_run import SearchRun
from fbnas.fit.select import cannot_time_here, fit_measurer
from fbnas.io import atomic_write
from fbnas.latency.kinds import is_measured
from fbnas.retrain import search_cost_of, train_child
from fbnas.runs.files import RunFiles
from fbnas.search_space import SearchSpace
from fbnas.settings import LATENCY_TOLERANCE
from fbnas.training.loop import torch_threads

MAX_DRAWS = 100_000  # draws in a row without a new network in the band: it is exhausted
NEAR = LATENCY_TOLERANCE  # a pick's percentile: among the reference networks within ±3% of it

Measure = Callable[[list[int]], tuple[float, float]]
Train = Callable[[list[int]], dict[str, float]]


# ---- one child trained with the child recipe ----------------------------------------------------
# ---- random search at equal cost -----------------------------------------------------------
@dataclass
class Trained:
    """One network the random side trained."""

    indices: list[int]
    predicted: float
    measured: float | None  # None: not timed (the measurement was skipped)
    val_acc: float
    val_ce: float
    test_acc: float
    seconds: float


@dataclass
class RandomSearch:
    """What random search at equal cost returned, and where its seconds went."""

    budget: float
    trained: list[Trained] = field(default_factory=list)
    drawn: int = 0  # every draw, repeats included
    kept: int = 0  # distinct networks predicted within the tolerance
    dropped: int = 0  # of those, measured outside it (not trained)
    seconds_drawing: float = 0.0
    seconds_measuring: float = 0.0
    seconds_training: float = 0.0
    measured: bool = True
    skipped_measure: str = ""  # why the networks were not timed, where they were not
    exhausted: bool = False  # stopped before the budget: no new network of the band was left

    @property
    def best(self) -> Trained:
        """The best by validation accuracy, the lower validation CE breaking ties (the first
        trained of equals)."""
        return min(self.trained, key=lambda t: (-t.val_acc, t.val_ce))

    @property
    def spent(self) -> float:
        return self.seconds_drawing + self.seconds_measuring + self.seconds_training

    @property
    def overshoot(self) -> float:
        """Seconds spent past the budget (the last network's training finishing)."""
        return max(0.0, self.spent - self.budget)

    @property
    def one_training(self) -> float:
        """The median seconds of one child training."""
        return statistics.median(t.seconds for t in self.trained)

    @property
    def r(self) -> float:
        """R = budget / one child training."""
        return self.budget / self.one_training

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(best=asdict(self.best), spent=self.spent, overshoot=self.overshoot,
                 one_training=self.one_training, r=self.r, networks=len(self.trained))
        return d


def random_search(space, model, target: float, tolerance: float, budget: float, seed: int,
                  train: Train, measure: Measure | None = None, skipped_measure: str = "",
                  clock: Callable[[], float] = time.perf_counter) -> RandomSearch:
    """Random search for `budget` seconds of `clock` (module docstring, the random side):
    uniform draws of `space`'s decision indices from `random.Random(seed)`; kept where
    `model.of(indices)` lies within ±`tolerance` of `target`; `measure(indices) -> (median,
    rel_iqr)` in the model's unit (None: not timed, `skipped_measure` says why), dropped when
    measured outside it; `train(indices)` -> {val_acc, val_ce, test_acc, seconds}. A training that
    starts before the budget is spent finishes and counts; at least one network is trained; where
    `MAX_DRAWS` draws in a row find no new network of the band, it stops (`exhausted`). Every second
    of `clock` between the start and the end is charged to drawing, measuring or training."""
    if not budget > 0 or not math.isfinite(budget):
        raise FbnasError(f"random search: a budget of {budget!r} seconds (give > 0)")
    rng = random.Random(seed)
    cands = space.decision_candidates()
    out = RandomSearch(budget=float(budget), measured=measure is not None,
                       skipped_measure="" if measure is not None else skipped_measure)
    seen: set[tuple[int, ...]] = set()
    start = clock()
    misses = 0
    while not out.trained or clock() - start < budget:
        t0 = clock()
        idx = [rng.randrange(len(c)) for c in cands]
        out.drawn += 1
        pred = float(model.of(idx))
        fresh = tuple(idx) not in seen
        seen.add(tuple(idx))
        inside = abs(pred / target - 1) <= tolerance
        t1 = clock()
        out.seconds_drawing += t1 - t0
        if not (fresh and inside):
            misses += 1
            if misses >= MAX_DRAWS:
                if out.trained:  # every network of the band has been drawn: nothing left
                    out.exhausted = True
                    break
                raise FbnasError(f"random search: {MAX_DRAWS:,} draws in a row without a "
                                 f"network predicted within ±{tolerance:.0%} of the target "
                                 f"{target:.6g} (none of the band trainable); choose another "
                                 "target or a wider search.fit_tolerance")
            continue
        misses = 0
        out.kept += 1
        med = None
        if measure is not None:
            med, _ = measure(idx)
            t2 = clock()
            out.seconds_measuring += t2 - t1
            t1 = t2
            if abs(med / target - 1) > tolerance:
                out.dropped += 1
                continue
        rec = train(idx)
        out.seconds_training += clock() - t1
        out.trained.append(Trained(idx, pred, med, float(rec["val_acc"]),
                                   float(rec["val_ce"]), float(rec.get("test_acc", math.nan)),
                                   float(rec["seconds"])))
    return out


def equal_cost_random(run: SearchRun, budget: float, seed: int, work: str | Path,
                      threads: int | None = None, log: Callable[[str], None] = print
                      ) -> RandomSearch:
    """`random_search` on a finished search run's space, table and target for `budget`
    seconds: its networks timed by the measured fit's measurer where the run's fit would
    time them, and trained by `train_child` at retrain.seed = `seed`."""
    cfg = run.config
    costs = run.costs
    measure, why = None, ""
    if cfg.search.fit_measure == "off":
        why = "search.fit_measure is off"
    elif not is_measured(cfg.latency.cost):
        why = f"the cost ({cfg.latency.cost}) is counted, not measured"
    else:
        why = cannot_time_here(cfg, costs.table) or ""
        if not why:
            measure = fit_measurer(cfg, costs.table, near_us=run.target)
    if why:
        log(f"duel: random side's networks not timed end to end: {why}")

    def train(idx: list[int]) -> dict[str, float]:
        return train_child(cfg, arch_from_indices(cfg.space, idx, "random"), seed, work,
                           threads)

    # one timing process for all of its measurements, as the measured fit keeps one
    with torch_threads(threads), reused_workers():
        return random_search(cfg.space, costs.model(cfg.space), run.target,
                             cfg.search.fit_tolerance, budget, seed, train, measure, why)


# ---- the search side -----------------------------------------------------------------------
def search_side(config: str | Path, target: str, seed: int, run_dir: str | Path,
                threads: int = 1, sets: Sequence[str] = ()) -> float:
    """`fbnas train` as a user runs it, in a process of its own with `threads` threads
    (OMP_NUM_THREADS, MKL_NUM_THREADS), importing the fbnas this module is; its wall seconds
    (the search's cost C). A failed run is an error holding the end of its stderr."""
    root = str(Path(__file__).resolve().parents[2])  # the child imports this same fbnas
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "fbnas", "train", "--config", str(config),
           *(x for s in [*sets, f"loss.target={target}", f"search.seed={seed}",
                         f"run.dir={run_dir}"] for x in ("--set", s))]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise FbnasError(f"duel: {' '.join(cmd)} failed (exit {out.returncode}): "
                         f"{out.stderr.strip()[-1500:]}")
    return wall


def recorded_cost(run_dir: str | Path) -> dict[str, float | None]:
    """What a search run recorded it spent (its arch file's meta `search_cost`, from the table
    loaded to the pick): `recorded_seconds`, and `recorded_r` in trainings where it ran at a
    `search.budget` (None where it recorded none)."""
    arch = RunFiles(run_dir).arch
    meta = Architecture.load(arch).meta if arch.is_file() else {}
    return {"recorded_seconds": search_cost_of(meta, "seconds"),
            "recorded_r": search_cost_of(meta, "trainings")}


# ---- the picks retrained ----------------------------------------------------------------------
def retrain_pick(cfg: Config, arch: Architecture, seeds: Sequence[int], work: str | Path,
                 threads: int | None = None) -> dict[str, Any]:
    """`arch` trained under each of `seeds`: per seed test accuracy, and their mean."""
    accs = [train_child(cfg, arch, s, work, threads)["test_acc"] for s in seeds]
    return {"seeds": list(seeds), "test_acc": accs, "mean_test_acc": statistics.fmean(accs)}


def bench_percentile(bench: Bench, arch: Architecture, latency: float, acc: float,
                     near: float = NEAR) -> tuple[float, str]:
    """A pick's percentile among the benchmark's reference networks within ±`near` of its
    latency (`fbnas.bench.score.percentile`, `among=` the reference), and what it was read
    by: the file's own truth where the pick is complete in it ('bench'), else the duel's
    figures (its latency here and its mean test accuracy over the fresh seeds: 'duel')."""
    t = truth(bench)
    ref = {k: t[k] for k in bench.reference() if k in t}
    h = arch.hash()
    if h in t:
        return percentile(t, h, near, ref), "bench"
    key = "duel-pick"
    return percentile({**t, key: {"latency": latency, "acc": acc}}, key, near, ref), "duel"


# ---- the pairs, resumable ---------------------------------------------------------------------
class PairStore:
    """Each pair's record (its stages: search, random, retrain), in one JSON file rewritten
    atomically as each stage finishes; a re-run reads it and skips finished stages."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.pairs: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            try:
                self.pairs = json.loads(self.path.read_text())["pairs"]
            except (ValueError, KeyError, TypeError) as e:
                raise FbnasError(f"{self.path}: not a duel's pair file ({e}); move it away "
                                 "or give another --out") from e

    @staticmethod
    def key(target: str, seed: int) -> str:
        return f"{target}/seed{seed}"

    def get(self, target: str, seed: int) -> dict[str, Any]:
        return self.pairs.setdefault(self.key(target, seed), {"target": target, "seed": seed})

    def done(self, target: str, seed: int) -> bool:
        return "retrain" in self.pairs.get(self.key(target, seed), {})

    def save(self) -> None:
        text = json.dumps({"pairs": self.pairs}, indent=1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, lambda f: f.write(text))


# ---- the report -------------------------------------------------------------------------------
def pair_picks(path: str | Path, space: SearchSpace) -> list[tuple[Architecture, str]]:
    """Both picks of every finished pair of a duel's pair file, as architectures of `space`
    (to train into a sampled benchmark: `fbnas bench add BENCH --pairs FILE`), each with its
    source "FILE:TARGET/seedN:SIDE". One line where the file is not a pair file, has no
    finished pair, or a pick is not of `space`."""
    p = Path(path)
    if not p.is_file():
        raise FbnasError(f"--pairs {p}: no such file")
    store = PairStore(p)
    if len(space.decision_candidates()) != space.num_layers:
        raise FbnasError(f"--pairs {p}: space '{space.name}' searches widths; a pair records "
                         "its picks' ops only")
    out = []
    for key, rec in store.pairs.items():
        for side in ("search", "random"):
            pick = rec.get("retrain", {}).get(side)
            if pick is None:
                continue
            arch = _pick_arch(space, pick.get("ops") or [], pick.get("hash"),
                              f"{side}_{key.replace('/', '_')}", f"--pairs {p}: {key} {side}")
            out.append((arch, f"{p}:{key}:{side}"))
    if not out:
        raise FbnasError(f"--pairs {p}: no finished pair (none retrained yet)")
    return out


def _pick_arch(space: SearchSpace, ops: Sequence[str], recorded_hash: str | None, name: str,
               where: str) -> Architecture:
    """A pair's pick (its recorded ops) as an architecture of `space`; one line where its ops
    are not a network of `space` or give another hash than the one recorded."""
    cands = space.layer_candidates()
    if len(ops) != len(cands) or any(op not in c for c, op in zip(cands, ops, strict=True)):
        raise FbnasError(f"{where}'s pick {' '.join(map(str, ops))} is not a network of space "
                         f"'{space.name}'")
    arch = arch_from_indices(space, [c.index(op) for c, op in zip(cands, ops, strict=True)],
                             name)
    if recorded_hash not in (None, arch.hash()):
        raise FbnasError(f"{where}'s pick has hash {recorded_hash[:12]}, its ops in space "
                         f"'{space.name}' give {arch.short_hash}: another space")
    return arch


def bootstrap_interval(diffs: Sequence[float], resamples: int = 10_000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of `diffs` (pairs resampled with
    replacement, `random.Random(seed)`): the (1 − level)/2 and (1 + level)/2 quantiles of the
    resampled means (nearest rank)."""
    xs = list(diffs)
    if not xs:
        return math.nan, math.nan
    rng = random.Random(seed)
    n = len(xs)
    means = sorted(sum(rng.choices(xs, k=n)) / n for _ in range(resamples))
    lo = means[max(0, math.ceil((1 - level) / 2 * resamples) - 1)]
    hi = means[min(resamples - 1, math.ceil((1 + level) / 2 * resamples) - 1)]
    return lo, hi


def _beats(x: float, others: Sequence[float]) -> float:
    return statistics.fmean(1.0 if o < x else 0.5 if o == x else 0.0 for o in others)


def summarize(pairs: Sequence[dict[str, Any]], resamples: int = 10_000, seed: int = 0
              ) -> dict[str, dict[str, Any]]:
    """Per target, over its finished pairs (accuracies as fractions, the difference in points):
    n, mean_diff_pt and ci95_pt, wins and ties, median_r, r1_beats_median (share of pairs),
    r1_beats_random (mean chance), the picks' median latency offsets, and where the pairs
    carry their picks' percentiles in a benchmark's reference sample: how many carry one
    (`with_percentile`), each side's median percentile and its picks at or above the 90th."""
    out: dict[str, dict[str, Any]] = {}
    for target in dict.fromkeys(p["target"] for p in pairs):
        ps = [p for p in pairs if p["target"] == target and "retrain" in p]
        if not ps:
            continue
        d = [100 * (p["retrain"]["search"]["mean_test_acc"]
                    - p["retrain"]["random"]["mean_test_acc"]) for p in ps]
        lo, hi = bootstrap_interval(d, resamples, seed)
        r1 = [(p["retrain"]["search"]["mean_test_acc"],
               [t["test_acc"] for t in p["random"]["trained"]]) for p in ps]
        out[target] = {
            "pairs": len(ps), "mean_diff_pt": statistics.fmean(d), "ci95_pt": [lo, hi],
            "wins": sum(x > 0 for x in d), "ties": sum(x == 0 for x in d),
            "median_r": statistics.median(p["random"]["r"] for p in ps),
            "median_recorded_r": _median_known(p.get("search", {}).get("recorded_r")
                                               for p in ps),
            "r1_beats_median": statistics.fmean(a > statistics.median(o) for a, o in r1),
            "r1_beats_random": statistics.fmean(_beats(a, o) for a, o in r1),
            "search_offset_median": statistics.median(
                p["retrain"]["search"]["offset"] for p in ps),
            "random_offset_median": statistics.median(
                p["retrain"]["random"]["offset"] for p in ps)}
        pct = {side: [p["retrain"][side]["percentile"] for p in ps
                      if _number(p["retrain"][side].get("percentile"))]
               for side in ("search", "random")}
        out[target]["with_percentile"] = len(pct["search"])
        for side, xs in pct.items():
            out[target][f"{side}_percentile_median"] = statistics.median(xs) if xs else None
            out[target][f"{side}_top10"] = sum(x >= 90 for x in xs)
    return out


def _median_known(xs) -> float | None:
    """The median of the numbers among `xs` (None where there is none)."""
    known = [x for x in xs if _number(x)]
    return statistics.median(known) if known else None


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not math.isnan(x)


# ---- one pair ---------------------------------------------------------------------------------
def _pick_latency(arch: Architecture, fallback: float) -> tuple[float, str]:
    meta = arch.meta if isinstance(arch.meta, dict) else {}
    if meta.get("measured") is not None:
        return float(meta["measured"]), "measured"
    if meta.get("predicted") is not None:
        return float(meta["predicted"]), "predicted"
    return fallback, "predicted"


def run_pair(store: PairStore, config: str | Path, target: str, seed: int, out: str | Path,
             retrain_seeds: Sequence[int], threads: int = 1, sets: Sequence[str] = (),
             bench: Bench | None = None, log: Callable[[str], None] = print,
             own_table: bool = False) -> dict[str, Any]:
    """One pair's stages, each skipped where the store has it and saved as it finishes.
    `own_table`: the search measures its own latency table (latency.cache_dir in its run
    directory), its build in C, as a user's first search on a machine; otherwise the
    machine's table cache is shared, and only a search that found no table builds one (the
    record's `table_built` says whether it did)."""
    rec = store.get(target, seed)
    run_dir = Path(out) / "runs" / f"{target}-seed{seed}"
    work = Path(out) / "scratch"
    if "search" not in rec:
        shutil.rmtree(run_dir, ignore_errors=True)  # a search stopped part-way starts again
        extra = [f"latency.cache_dir={run_dir / 'table-cache'}"] if own_table else []
        wall = search_side(config, target, seed, run_dir, threads, [*sets, *extra])
        built = RunFiles(run_dir).log
        rec["search"] = {"run": str(run_dir), "seconds": wall, "table_built": built.is_file()
                         and "measuring a latency table" in built.read_text(),
                         **recorded_cost(run_dir)}
        store.save()
        said = (f" (it recorded {rec['search']['recorded_r']:.2f} trainings spent, "
                f"{rec['search']['recorded_seconds']:.1f} s after its table)"
                if rec["search"].get("recorded_r") is not None else "")
        log(f"duel {target} seed {seed}: search {wall:.1f} s{said}")
    run = SearchRun.open(run_dir) if "retrain" not in rec else None
    if "random" not in rec:
        rs = equal_cost_random(run, rec["search"]["seconds"], seed, work, threads, log)
        rec["random"] = rs.to_dict()
        store.save()
        own = rec["search"].get("recorded_r")
        log(f"duel {target} seed {seed}: random search trained {len(rs.trained)} networks in "
            f"{rs.spent:.1f} s (budget {rs.budget:.1f}, overshoot {rs.overshoot:.1f}), "
            f"R = {rs.r:.2f}" + (f" (the search's own record: {own:.2f})"
                                 if own is not None else ""))
    if "retrain" not in rec:
        cfg = run.config
        tgt = run.target
        picks: dict[str, Any] = {}
        s_arch = run.arch
        if s_arch is None:
            raise FbnasError(f"{run_dir}: no arch_hard.yaml (the search did not finish)")
        s_idx = arch_indices(cfg.space, s_arch)
        s_lat, s_how = _pick_latency(s_arch, float(run.costs.model(cfg.space).of(s_idx)))
        best = rec["random"]["best"]
        r_arch = arch_from_indices(cfg.space, best["indices"], "random_pick")
        r_lat, r_how = ((best["measured"], "measured") if best["measured"] is not None
                        else (best["predicted"], "predicted"))
        for side, arch, lat, how in (("search", s_arch, s_lat, s_how),
                                     ("random", r_arch, r_lat, r_how)):
            with torch_threads(threads):
                p = retrain_pick(cfg, arch, retrain_seeds, work, threads)
            p.update(hash=arch.hash(), ops=list(arch.ops), latency=lat, latency_is=how,
                     offset=lat / tgt - 1)
            picks[side] = p
        picks["target_cost"] = tgt
        rec["retrain"] = picks
        store.save()
        log(f"duel {target} seed {seed}: test {picks['search']['mean_test_acc']:.4f} (search) "
            f"vs {picks['random']['mean_test_acc']:.4f} (random)")
    if bench is not None and any(rec["retrain"][side].get("percentile") is None
                                 for side in ("search", "random")):  # just retrained, or the
        space = (run.config if run is not None  # bench came later
                 else load_config(config, list(sets))).space
        _fill_percentiles(rec, space, bench)
        store.save()
    shutil.rmtree(work, ignore_errors=True)
    return rec


def _fill_percentiles(rec: dict[str, Any], space: SearchSpace, bench: Bench) -> None:
    """A retrained pair's picks' percentiles in `bench` (their records unchanged otherwise),
    just after their retrain, or later: the pair ran before the benchmark held them, or
    without one."""
    for side in ("search", "random"):
        p = rec["retrain"][side]
        arch = _pick_arch(space, p.get("ops") or [], p.get("hash"),
                          f"{side}_{rec['target']}_seed{rec['seed']}", f"{rec['target']}/seed"
                          f"{rec['seed']} {side}")
        p["percentile"], p["percentile_by"] = bench_percentile(bench, arch, p["latency"],
                                                               p["mean_test_acc"])
