"""Fitting the searched architecture to a cost target (after the search, as TF-NAS does).

θ's argmax is one architecture; a search steered towards T ends with softmax(θ) whose
*expected* cost is near T, while the argmax's cost can sit a few percent (or, with flat θ,
far) away. `fit_to_target` moves the argmax onto T by the cheapest changes in θ's own terms:
while the predicted cost misses T by more than `tol`, it changes the one layer's op that
moves the cost towards T at the smallest loss of log-probability per unit of cost moved,
preferring a change that lands inside T·(1 ± tol). Each change is one op in one layer; the
architecture stays the most probable one that θ allows at that cost, to a greedy
approximation. Where the greedy steps stop short of the band and the space is small enough
(≤ 200,000 architectures, as the quickstart's 7^6), the most probable architecture inside the
band is found exhaustively, and where the band holds none, the band widened by the nearest
network's distance (`_likeliest_in_band`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fbnas.arch import log_prob
from fbnas.latency.cost_model import predicted_cost
from fbnas.settings import LATENCY_TOLERANCE


@dataclass(frozen=True)
class Fit:
    indices: list[int]  # the op index per layer after fitting
    cost: float  # its predicted cost
    changes: int  # layers changed from the argmax
    hit: bool  # within tolerance of the target
    tol: float = LATENCY_TOLERANCE

    def describe(self, spec: object, target: float, unit: str) -> str:
        """The log line: what was asked, how many layers moved, where it landed."""
        return (f"fitted to loss.target {spec} ({target:.1f} {unit}): {self.changes} layer(s) "
                f"changed from argmax θ, predicted {self.cost:.1f} {unit}"
                + ("" if self.hit else f" (outside ±{self.tol:.0%}: no network found inside)"))


def range_warning(spec: object, loss: object, bounds: tuple[float, float], unit: str
                  ) -> str | None:
    """One line when the loss's resolved target lies outside [cheapest, dearest]."""
    target = getattr(loss, "target", None)
    lo, hi = bounds
    if target is None or lo <= target <= hi:
        return None
    return (f"loss.target: {spec} ({target:.1f} {unit}) is outside this space's range "
            f"{lo:.1f}-{hi:.1f} {unit} (cheapest-dearest architecture under the cost table); "
            f"the search will end near the {'cheapest' if target < lo else 'dearest'} one")


def fit_to_target(theta: Sequence[torch.Tensor], rows: Sequence[Sequence[float]], fixed: float,
                  target: float, tol: float = LATENCY_TOLERANCE,
                  start: Sequence[int] | None = None) -> Fit:
    """The argmax of θ (or `start`), changed greedily until its predicted cost Σ rows[l][i_l] +
    fixed is within a factor 1 ± `tol` of `target` (or no change moves it closer)."""
    logp = [torch.log_softmax(t.detach().double().cpu(), -1).tolist() for t in theta]
    idx = list(start) if start is not None else [max(range(len(lp)), key=lp.__getitem__)
                                                 for lp in logp]
    first = list(idx)
    lo, hi = target * (1 - tol), target * (1 + tol)
    cost = predicted_cost(rows, fixed, idx)
    for _ in range(sum(len(r) for r in rows)):  # each step moves strictly towards the band
        if lo <= cost <= hi:
            break
        up = cost < lo
        landing, moving = [], []
        for layer, (row, lp) in enumerate(zip(rows, logp, strict=True)):
            cur = idx[layer]
            for j, c in enumerate(row):
                delta = float(c) - float(row[cur])
                if j == cur or (delta <= 0 if up else delta >= 0):
                    continue
                new = cost + delta
                drop = lp[cur] - lp[j]  # log-probability given up
                if lo <= new <= hi:
                    landing.append((drop, layer, j, new))
                elif (new < lo) if up else (new > hi):  # still short of the band
                    moving.append((drop / abs(delta), layer, j, new))
        if landing:
            _, layer, j, cost = min(landing)
        elif moving:
            _, layer, j, cost = min(moving)
        else:  # every move overshoots the band: take the one ending nearest to the target
            best = None
            for layer, row in enumerate(rows):
                for j, c in enumerate(row):
                    new = cost + float(c) - float(row[idx[layer]])
                    gap = abs(math.log(new / target)) if new > 0 else math.inf
                    if j != idx[layer] and (best is None or gap < best[0]):
                        best = (gap, layer, j, new)
            if best is None or best[0] >= abs(math.log(cost / target)):
                break
            _, layer, j, cost = best
        idx[layer] = j
    if not lo <= cost <= hi:  # greedy steps got stuck short of the band
        best = _likeliest_in_band(theta, rows, fixed, target, tol)
        if best is not None:
            idx, cost = best
    return Fit(idx, cost, sum(a != b for a, b in zip(idx, first, strict=True)), lo <= cost <= hi,
               tol)


def fit_with_widths(theta: Sequence[torch.Tensor], wc, target: float, tol: float = LATENCY_TOLERANCE
                    ) -> tuple[Fit, tuple[int, ...]]:
    """`fit_to_target` for a width-searched space (`wc`: its WidthCosts): at each choice of
    widths the costs are additive over layers again, so the op fit runs at every choice and
    the most probable result inside the band is kept (log P of its ops plus its widths'), else
    the one nearest the target. Returns the fit over the ops and the widths chosen."""
    n = len(wc.wiring)
    ops_theta, w_lp = theta[:n], [torch.log_softmax(t.detach().double().cpu(), -1).tolist()
                                  for t in theta[n:]]
    first = _argmax(theta)
    fits: list[tuple[float, Fit, tuple[int, ...]]] = []
    for widths in wc.width_combos():
        rows, fixed = wc.rows_at(widths)
        f = fit_to_target(ops_theta, rows, fixed, target, tol)
        fits.append((log_prob(ops_theta, f.indices)
                     + sum(lp[w] for lp, w in zip(w_lp, widths, strict=True)), f, widths))
    near = [x for x in fits if x[1].hit]
    if not near:  # no choice of widths lands: as `fit_to_target` in a gap, across the choices
        gap = [abs(math.log(f.cost / target)) for _, f, _ in fits]
        near = [x for x, g in zip(fits, gap, strict=True) if g <= min(gap) + math.log1p(tol)]
    _, f, widths = max(near, key=lambda x: x[0])
    changes = sum(a != b for a, b in zip([*f.indices, *widths], first, strict=True))
    return dataclasses.replace(f, changes=changes), widths


def near_or_nearest(values: Sequence[float], target: float, tol: float) -> np.ndarray:
    """Which of `values` (costs) lie within ±`tol` of `target`; where none does (a gap of a
    space's costs), those whose |log(value / target)| is within log(1 + tol) of the smallest,
    on either side: the fit's rule in a gap (`_likeliest_in_band`, the measured fit's
    `choose`, and `fbnas bench score`'s networks a target allows)."""
    v = np.asarray(values, dtype=float)
    ok = np.abs(v / target - 1) <= tol
    if ok.any():
        return ok
    gap = np.abs(np.log(np.maximum(v, 1e-300) / target))
    return gap <= gap.min() + math.log1p(tol) + 1e-12


def _likeliest_in_band(theta: Sequence[torch.Tensor], rows: Sequence[Sequence[float]],
                       fixed: float, target: float, tol: float, limit: int = 200_000
                       ) -> tuple[list[int], float] | None:
    """The most probable architecture whose cost is within a factor 1 ± `tol` of `target`, by
    exhaustive search of a space of at most `limit` architectures (a dynamic program over
    layers would need the costs on a grid); None where the space is larger. Where no
    architecture lies in that band (a space's costs can have gaps: in the benchmark's, none
    between 613 and 676 µs), the band is widened by the distance of the nearest architecture
    (`near_or_nearest`; the greedy steps once returned +6.7% over a 0.8x target where θ
    preferred a network at -5%, beside one at -3.4%). A more probable architecture on the far
    side can win: with the nearest at -3.4% and tol 3%, one up to +6.6%."""
    if math.prod(len(r) for r in rows) > limit:
        return None
    ok = np.flatnonzero(near_or_nearest(every_cost(rows, fixed), target, tol))
    i = int(ok[np.argmax(every_log_prob(theta)[ok])])
    idx = [int(j) for j in np.unravel_index(i, [len(r) for r in rows])]
    return idx, predicted_cost(rows, fixed, idx)


# ---- the measured fit: the network returned, timed, and re-fitted until it is on target -------
@dataclass(frozen=True)
class Round:
    """One architecture the measured fit timed: its predicted and measured cost (the table's
    units) and the spread of the measurement (interquartile range / median)."""

    indices: tuple[int, ...]
    predicted: float
    measured: float
    rel_iqr: float
    log_prob: float
    inside: bool

    def to_dict(self, candidates: Sequence[Sequence[str]]) -> dict:
        return {"ops": [c[i] for c, i in zip(candidates, self.indices, strict=True)],
                "predicted": round(self.predicted, 3), "measured": round(self.measured, 3),
                "rel_iqr": round(self.rel_iqr, 4), "log_probability": round(self.log_prob, 4),
                "inside": self.inside}


@dataclass(frozen=True)
class MeasuredFit:
    """What `measured_fit` returns: the chosen architecture and every round it timed."""

    fit: Fit  # the chosen architecture (its `cost` is the table's prediction)
    rounds: list[Round]  # every timing, in order (a network confirmed is timed twice)
    chosen: Round  # its measurements pooled

    @property
    def hit(self) -> bool:
        return self.chosen.inside

    def describe(self, target: float, unit: str) -> str:
        c = self.chosen
        miss = c.measured / target - 1
        nets, times = len({r.indices for r in self.rounds}), len(self.rounds)
        return (f"measured fit: {nets} network(s) timed ({times} measurements); target "
                f"{target:.1f} {unit}, predicted {c.predicted:.1f}, measured "
                f"{c.measured:.1f} {unit} (±{c.rel_iqr / 2:.1%}), {miss:+.1%} from the target"
                + ("" if c.inside else f" (outside ±{self.fit.tol:.0%}: the closest measured)"))


def measured_fit(theta: Sequence[torch.Tensor], rows: Sequence[Sequence[float]], fixed: float,
                 target: float, measure, tol: float = LATENCY_TOLERANCE, max_rounds: int = 6,
                 confirm: bool = True, first: Sequence[int] | None = None,
                 prefer: Sequence[Sequence[int]] = (), trained: int = 0) -> MeasuredFit:
    """`fit_to_target`, then the fitted architecture timed end to end by `measure(indices) ->
    (median, rel_iqr)` (in the table's units), and re-fitted until it measures in the inner
    third of the band, target ± `tol`/3: the user's own re-measurement moves by about 1% (sd)
    on a busy machine, so only a network measured that near the target stays inside ±tol
    when timed again. While it misses, the table is asked for the prediction that the
    measurements say measures at the target (`_goal`: the secant between the networks measured
    nearest below and above it, else the nearest one's predicted / measured ratio) and the fit
    repeated near it (`_next`, within ±tol/3 of the goal; where that returns networks already
    timed, the most probable untried one predicted near the goal), for at most `max_rounds`
    networks. With `confirm`, a network measured inside the middle half of the band (± tol/2)
    is timed once more, and a third time where its two measurements part by more than tol/2;
    it is judged on their pooled figure (`_pooled`). Returns what `choose` chooses among the
    networks timed; `rounds` holds every timing. `first`: the network timed first (default:
    the first of `prefer`, else the table's fit). `prefer`: networks ranked best first (the
    final pick's, by their paths on the supernet): while re-fitting, the best-ranked untried
    one predicted within ±tol/3 of the goal, else within ±tol of it, is timed before θ's own
    fit (which a ranked network is left only for when none is predicted that near), and
    `choose` prefers ranked networks. `trained`: the first so many of `prefer` were ranked
    by training them (`search.final_train`), which outranks any timing nearer the target:
    one of them measured within ±tol is timed again (confirmed), and the fit stops where
    their pooled figure is within ±tol; `choose` returns the best-ranked trained network so
    measured."""
    lo, hi = target * (1 - tol), target * (1 + tol)
    inner, middle = tol / 3, tol / 2
    rank = {tuple(p): i for i, p in enumerate(prefer)}
    decisive = {tuple(p) for p in prefer[:trained]}
    rounds: list[Round] = []
    if first is None:
        first = prefer[0] if prefer else fit_to_target(theta, rows, fixed, target, tol).indices
    key, networks = tuple(first), 1
    while True:
        med, spread = measure(list(key))
        rounds.append(Round(key, predicted_cost(rows, fixed, key), float(med), float(spread),
                            log_prob(theta, key), lo <= med <= hi))
        mine = [r.measured for r in rounds if r.indices == key]
        est = _pooled(rounds, lo, hi)
        this = next(r for r in est if r.indices == key)
        near = tol if key in decisive else middle
        if confirm and (len(mine) == 1 and abs(med / target - 1) <= near or len(mine) == 2
                        and abs(math.log(mine[1] / mine[0])) > middle
                        and min(abs(m / target - 1) for m in mine) <= near):
            continue  # time it again before judging it
        if abs(this.measured / target - 1) <= (tol if key in decisive else inner):
            break
        if networks >= max_rounds:
            break
        goal = _goal(est, target)
        reach = min(abs(r.predicted / goal - 1) for r in est)
        tried = {r.indices for r in est}
        # the best-ranked untried network predicted near the goal, then (still one of the
        # ranked networks, not θ's) within ±tol of it; only then θ's own re-fit
        nxt = next((k for w in (inner, tol) for k in rank if k not in tried
                    and abs(predicted_cost(rows, fixed, k) / goal - 1) <= w), None)
        if nxt is None:
            nxt = _next(theta, rows, fixed, goal, inner, tried, reach)
        if nxt is None:
            break
        key, networks = nxt, networks + 1
    chosen = choose(_pooled(rounds, lo, hi), target, (inner, middle), rank, tol, decisive)
    idx = list(chosen.indices)
    changes = sum(a != b for a, b in zip(idx, _argmax(theta), strict=True))
    return MeasuredFit(Fit(idx, chosen.predicted, changes, chosen.inside, tol), rounds, chosen)


def choose(est: Sequence[Round], target: float, bands: Sequence[float],
           rank: dict[tuple[int, ...], int] | None = None, tol: float | None = None,
           decisive: frozenset | set = frozenset()) -> Round:
    """The best `rank`ed network measured within the widest of `bands` (relative distances to
    `target`), where one was: the supernet ranks a band's networks far better than θ's
    probability does (docs/bench.md, "the duel"). Else the most probable network measured
    within the narrowest of `bands` that holds one, else the one measured nearest to the
    target; with `tol`, where none was measured within ±tol (a gap), the table fit's gap rule
    (`near_or_nearest`: of those within the nearest one's distance plus log(1 + tol), the best
    ranked, then the most probable). Then, with `tol`, a network measured within ±tol, no
    slower than that choice and ranked before it (unranked ranks last) is returned instead,
    the best ranked: as fast, and better by the supernet (docs/search.md; figures in
    docs/measurements.md). Before all that, the best-ranked of the `decisive` networks (ranked
    by training them) measured within ±tol, where one was."""
    rank = rank or {}

    def rk(r: Round) -> int:
        return rank.get(r.indices, len(rank))

    trained = [r for r in est if r.indices in decisive and tol is not None
               and abs(r.measured / target - 1) <= tol]
    if trained:
        return min(trained, key=rk)

    inside = next((ins for b in sorted(bands)
                   if (ins := [r for r in est if abs(r.measured / target - 1) <= b])), None)
    ranked = [r for r in est if r.indices in rank
              and abs(r.measured / target - 1) <= max(bands, default=0.0)]
    if ranked:  # a ranked network measured within the widest band: the best ranked
        chosen = min(ranked, key=rk)
    elif inside:
        chosen = max(inside, key=lambda r: (-rk(r), r.log_prob))
    elif tol is not None and not any(abs(r.measured / target - 1) <= tol for r in est):
        ok = near_or_nearest([r.measured for r in est], target, tol)
        chosen = max((r for r, k in zip(est, ok, strict=True) if k),
                     key=lambda r: (-rk(r), r.log_prob))
    else:
        chosen = min(est, key=lambda r: abs(math.log(r.measured / target)))
    better = [r for r in est if tol is not None and abs(r.measured / target - 1) <= tol
              and r.measured <= chosen.measured and rk(r) < rk(chosen)]
    return min(better, key=rk) if better else chosen


def _pooled(rounds: Sequence[Round], lo: float, hi: float) -> list[Round]:
    """One Round per distinct network, in the order first timed: the median of its
    measurements in log space (the geometric mean of two; of three, the middle one, so an
    outlier does not count) and the mean of their spreads over √(times timed)."""
    by: dict[tuple[int, ...], list[Round]] = {}
    for r in rounds:
        by.setdefault(r.indices, []).append(r)
    out = []
    for rs in by.values():
        m = math.exp(statistics.median(math.log(r.measured) for r in rs))
        spread = statistics.mean(r.rel_iqr for r in rs) / math.sqrt(len(rs))
        out.append(dataclasses.replace(rs[0], measured=m, rel_iqr=spread, inside=lo <= m <= hi))
    return out


def _next(theta: Sequence[torch.Tensor], rows: Sequence[Sequence[float]], fixed: float,
          goal: float, band: float, tried: set[tuple[int, ...]], reach: float = 0.0
          ) -> tuple[int, ...] | None:
    """The next network to time: the table's fit within ±`band` of `goal`, its band narrowed
    while that is a network already timed; then (a goal in a gap of the space, or between
    timed networks) an untried network predicted near the goal (`_nearest_untried`, within
    ±band, ±2·band, ±3·band, then ±`reach`: the distance from the goal of the nearest timed
    network's prediction, so that any untried network nearer the goal than every timed one is
    tried); None where the table predicts no untried network that near."""
    for b in (band, band / 2, band / 4):
        f = fit_to_target(theta, rows, fixed, goal, b)
        if f.hit and tuple(f.indices) not in tried:
            return tuple(f.indices)
    spreads = (band, 2 * band, 3 * band, *([reach] if reach > 3 * band else []))
    return _nearest_untried(theta, rows, fixed, goal, spreads, band / 4, tried)


def every_cost(rows: Sequence[Sequence[float]], fixed: float) -> np.ndarray:
    """Σ rows[l][i_l] + fixed for every architecture, flat in the order of
    `itertools.product` over the layers' indices (`np.unravel_index` gives the indices)."""
    out = np.array([float(fixed)])
    for r in rows:
        out = np.add.outer(out, np.asarray(r, dtype=float)).ravel()
    return out


def every_log_prob(theta: Sequence[torch.Tensor]) -> np.ndarray:
    """log P_θ of every architecture, flat in `every_cost`'s order."""
    return every_cost([torch.log_softmax(t.detach().double().cpu(), -1).numpy() for t in theta],
                      0.0)


def _nearest_untried(theta: Sequence[torch.Tensor], rows: Sequence[Sequence[float]],
                     fixed: float, goal: float, spreads: Sequence[float], slack: float,
                     tried: set[tuple[int, ...]], limit: int = 200_000
                     ) -> tuple[int, ...] | None:
    """Of the untried networks predicted within goal × (1 ± spread), for the first of
    `spreads` that holds one, those nearest to the goal (within `slack` of the nearest one's
    relative distance), the most probable: in a gap the fit's next network should be
    predicted as near the goal as the space allows, and the most probable of the near ones.
    Exhaustive for spaces of at most `limit` architectures (every cost computed once);
    beyond, over `near_target`'s candidates at each spread."""
    shape = tuple(len(r) for r in rows)
    if math.prod(shape) <= limit:
        dist = np.abs(every_cost(rows, fixed) / goal - 1)
        if tried:
            dist[np.ravel_multi_index(tuple(np.array(sorted(tried)).T), shape)] = np.inf
        lp = None
        for spread in spreads:
            ok = np.flatnonzero(dist <= spread)
            if len(ok):
                if lp is None:
                    lp = every_log_prob(theta)
                near = ok[dist[ok] <= dist[ok].min() + slack]
                best = near[np.argmax(lp[near])]
                return tuple(int(i) for i in np.unravel_index(best, shape))
        return None
    for spread in spreads:
        cands = [tuple(i) for i in near_target(theta, rows, fixed, goal, len(tried) + 8, spread)
                 if tuple(i) not in tried]
        if cands:
            dist_of = {c: abs(predicted_cost(rows, fixed, c) / goal - 1) for c in cands}
            dmin = min(dist_of.values())
            return max((c for c in cands if dist_of[c] <= dmin + slack),
                       key=lambda c: log_prob(theta, c))
    return None


def _argmax(theta: Sequence[torch.Tensor]) -> list[int]:
    return [int(torch.argmax(t.detach())) for t in theta]


def _goal(rounds: Sequence[Round], target: float) -> float:
    """The prediction that should measure at `target`: interpolated between the nearest timed
    networks measured below and above it (the secant: the table's error changes with the
    network), else the target times predicted / measured of the one measured nearest."""
    below = [r for r in rounds if r.measured < target]
    above = [r for r in rounds if r.measured > target]
    if below and above:
        b = max(below, key=lambda r: r.measured)
        a = min(above, key=lambda r: r.measured)
        t = (target - b.measured) / (a.measured - b.measured)
        return b.predicted + t * (a.predicted - b.predicted)
    near = min(rounds, key=lambda r: abs(math.log(r.measured / target)))
    return target * near.predicted / near.measured


def near_target(theta: Sequence[torch.Tensor], rows: Sequence[Sequence[float]], fixed: float,
                target: float, k: int, spread: float = 0.1) -> list[list[int]]:
    """Up to `k` distinct architectures predicted across target × (1 ± spread), most probable
    first: the most probable one (`fit_to_target`) at each of k sub-targets spread evenly over
    the band, so that a table that is off by up to `spread` still has one measured on target.
    Finer sub-target grids are tried while fewer than k distinct ones are found."""
    found: dict[tuple[int, ...], float] = {}
    n = k
    while len(found) < k and n <= 16 * k:
        points = [0.0] if n == 1 else [spread * (2 * j / (n - 1) - 1) for j in range(n)]
        for d in sorted(points, key=abs):  # the target itself first
            f = fit_to_target(theta, rows, fixed, target * (1 + d), spread / max(n, 1))
            if abs(f.cost / target - 1) <= spread * 1.0001:
                found.setdefault(tuple(f.indices), log_prob(theta, f.indices))
            if len(found) >= k:
                break
        n *= 2
    return [list(i) for i, _ in sorted(found.items(), key=lambda x: -x[1])][:k]


def likeliest_in_band(theta: Sequence[torch.Tensor], rows: Sequence[Sequence[float]],
                      fixed: float, lo: float, hi: float, k: int, limit: int = 200_000
                      ) -> list[list[int]]:
    """The `k` most probable architectures predicted in [lo, hi], most probable first: exact
    for spaces of at most `limit` architectures (every cost and log-probability computed once);
    beyond, `near_target`'s networks spread over the band (the most probable at sub-targets),
    those in [lo, hi]."""
    shape = tuple(len(r) for r in rows)
    if math.prod(shape) > limit:
        mid, half = (lo + hi) / 2, (hi - lo) / (hi + lo)
        return [i for i in near_target(theta, rows, fixed, mid, 2 * k, half)
                if lo <= predicted_cost(rows, fixed, i) <= hi][:k]
    costs, lp = every_cost(rows, fixed), every_log_prob(theta)
    ok = np.flatnonzero((costs >= lo) & (costs <= hi))
    best = ok[np.argsort(-lp[ok], kind="stable")[:k]]
    return [[int(j) for j in np.unravel_index(i, shape)] for i in best]
