"""From θ to the network a search returns: one path, its steps named as a user names them.

    argmax      θ's most probable network (no target, or `search.fit_target: false`: returned)
    table fit   θ fitted onto the loss's target by the cost table (`table_fit`)
    pick        `search.final_pick: path`: the most probable networks near that cost
                (`candidates`), ranked by their paths on the supernet (a finished run's
                recorded ranking is read back instead); with `search.final_train: K`, the K
                best of them trained from scratch and ranked first by that (`train_ranked`)
    measured fit
                the first of them timed end to end and re-fitted until it measures within
                `search.fit_tolerance`, where `search.fit_measure` allows and this machine can
                time the table's device (`measured_fit`)

A `Selector` is made once per search with its config, θ, costs and target; its methods are
those steps and `select` runs them, for the trainer (which lends the pick a `PathJudge`: each
rank scores paths, rank 0 trains and times networks) and for a finished run (`refit`: `fbnas
sample`, the sweep).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from fbnas.arch import Architecture, arch_from_indices, sample_hard
from fbnas.backends.worker import reused_workers
from fbnas.config import Config
from fbnas.errors import FbnasError
from fbnas.fit._band import drawn_in_band
from fbnas.fit.onto_target import (
    Fit,
    fit_to_target,
    fit_with_widths,
    likeliest_in_band,
    measured_fit,
)
from fbnas.fit.search_run import SearchRun
from fbnas.latency.cost_model import cost_lists, predicted_cost
from fbnas.latency.end_to_end import fit_panel, panel, time_archs
from fbnas.latency.kinds import is_measured
from fbnas.latency.resolve import CostSource
from fbnas.latency.table import LatencyTable

Measurer = Callable[[list[int]], tuple[float, float]]


BUNDLE_HINT = ("to close the loop there: fbnas sample {run} --near-target 5 --bundle DIR, run "
               "DIR/run_bundle.py on the device, then fbnas sample {run} --pick "
               "DIR/results.json")


def cannot_time_here(cfg: Config, table: LatencyTable | None) -> str | None:
    """Why this machine cannot time networks as `table` was measured (None: it can)."""
    if table is None or not is_measured(table.cost):
        return "the run has no measured latency table"
    meta = table.meta
    if meta.get("imported_from") or meta.get("bundle"):
        return (f"its latency table was measured on another device ({meta.get('device_name')}, "
                "imported from a bundle)")
    try:
        timer = cfg.latency.for_timing(meta).make_timer()
    except FbnasError as e:
        return f"its latency table's timer cannot run here ({e})"
    here, there = timer.describe().get("device_name"), meta.get("device_name")
    if there and here != there:
        return f"its latency table was measured on {there}, and this machine is {here}"
    return None


def fit_measurer(cfg: Config, table: LatencyTable, widths: Sequence[int] = (),
                 near_us: float | None = None) -> Callable[[list[int]], tuple[float, float]]:
    """`measure(indices) -> (median, rel_iqr)`: the architecture with these op indices (at
    the choice of `widths` of a width-searched space) built and timed end to end under the
    table's timer settings (threads, batch, dtype, allocator) and drift compensation, in the
    table's units, interleaved with its `panel` (`search.fit_panel` of its probe networks
    nearest `near_us`, the target, where both are given)."""
    timer = cfg.latency.for_timing(table.meta).make_timer()
    pan = (fit_panel(cfg.space, table, cfg.search.fit_panel, near_us) if near_us
           else panel(cfg.space, table))

    def measure(indices: list[int]) -> tuple[float, float]:
        arch = arch_from_indices(cfg.space, [*indices, *widths], "fit")
        s = time_archs(timer, {"fit": arch}, table, pan, stop_ci=cfg.search.fit_stop_ci)["fit"]
        return s["median_us"], s["rel_iqr"]

    return measure


def _measured_fit_mode(cfg: Config, costs: CostSource, fit_measure: str | None,
                       log: Callable[[str], None], run: str) -> bool:
    """Whether the final fit goes on to time networks (`search.fit_measure`, or
    `fit_measure`): `on` where this machine cannot time the table's device is an error,
    `auto` says why it skips."""
    mode = fit_measure or cfg.search.fit_measure
    if mode == "off" or not is_measured(cfg.latency.cost):
        return False
    why = cannot_time_here(cfg, costs.table)
    if why is not None:
        if mode == "on":
            raise FbnasError(f"search.fit_measure: on, but {why}")
        log(f"measured fit skipped: {why}; {BUNDLE_HINT.format(run=run)}")
        return False
    return True


def _measured_meta(cfg: Config, mf, measure, target: float, unit: str,
                   log: Callable[[str], None], t0: float) -> dict[str, Any]:
    """The measured fit's rounds logged, the returned network timed once more, and what its
    meta records."""
    cands = cfg.space.layer_candidates()
    for i, r in enumerate(mf.rounds):
        again = " (again)" if r.indices in {x.indices for x in mf.rounds[:i]} else ""
        log(f"measured fit round {i + 1}{again}: predicted {r.predicted:.1f}, measured "
            f"{r.measured:.1f} {unit} (IQR {r.rel_iqr:.1%}), "
            f"{r.measured / target - 1:+.1%} from the target")
    log(mf.describe(target, unit))
    c = mf.chosen
    # the figure reported is timed once more, in a measurement no decision reads: the one that
    # chose the network stopped the fit because it landed in the band, so it leans inward
    med, iqr = measure(list(c.indices))
    log(f"the returned network timed again: {med:.1f} {unit} (IQR {iqr:.1%}), "
        f"{med / target - 1:+.1%} from the target (it was chosen at {c.measured:.1f})")
    return dict(predicted=round(c.predicted, 3), measured=round(med, 3),
                measured_rel_iqr=round(iqr, 4),
                measured_inside=abs(med / target - 1) <= cfg.search.fit_tolerance,
                selection_measured=round(c.measured, 3), selection_rel_iqr=round(c.rel_iqr, 4),
                selection_inside=c.inside, fitted_layers=mf.fit.changes,
                fit_seconds=round(time.perf_counter() - t0, 2),
                fit_rounds=[r.to_dict(cands) for r in mf.rounds])


# ---- the one path --------------------------------------------------------------------------------
@dataclass
class Selection:
    """The network a search returns (decision indices) and what its arch file records."""

    indices: list[int]
    meta: dict[str, Any] = field(default_factory=dict)

    def architecture(self, cfg: Config, name: str, **meta: Any) -> Architecture:
        return arch_from_indices(cfg.space, self.indices, name, **meta, **self.meta)


def rank_paths(cands: list[list[int]], scores: list[dict[str, float]]
               ) -> tuple[list[int], dict[str, Any]]:
    """The final pick's ranking of `cands` by their paths' validation accuracy (then CE), and
    its record (the arch file's meta.final_pick)."""
    ranked = sorted(range(len(cands)), key=lambda i: (-scores[i]["acc"], scores[i]["ce"]))
    return ranked, {"candidates": len(cands), "chosen": ranked[0], "ranked": ranked,
                    "path_acc": [round(r["acc"], 4) for r in scores],
                    "candidates_indices": [list(map(int, c)) for c in cands]}


def distinct_top(prefer: list[list[int]], k: int, differ: int = 1,
                 eligible: Callable[[list[int]], bool] | None = None) -> list[int]:
    """Positions in `prefer` of its `k` best-ranked networks that differ pairwise in at least
    `differ` decisions (each in rank order, passed over where it is that close to one already
    taken), among those `eligible` accepts (all by default)."""
    out: list[int] = []
    for j, p in enumerate(prefer):
        if len(out) == k:
            break
        if (eligible is None or eligible(p)) and all(
                sum(a != b for a, b in zip(p, prefer[i], strict=True)) >= differ for i in out):
            out.append(j)
    return out


def train_ranked(prefer: list[list[int]], train: Callable[[list[int]], dict[str, float]],
                 k: int, log: Callable[[str], None], differ: int = 1,
                 eligible: Callable[[list[int]], bool] | None = None
                 ) -> tuple[list[list[int]], list[dict]]:
    """The `k` best-ranked of `prefer` that differ pairwise in at least `differ` decisions,
    among those `eligible` accepts (`distinct_top`), trained (`train(indices)` -> {val_acc,
    val_ce, ...}) and put first in the order of their validation accuracy (then CE), the rest
    after them as they were; and what each training read (the arch file's
    final_pick.trained)."""
    taken = distinct_top(prefer, k, differ, eligible)
    top = [prefer[j] for j in taken]
    got = [train(list(p)) for p in top]
    order = sorted(range(len(top)), key=lambda i: (-got[i]["val_acc"], got[i]["val_ce"]))
    rest = [p for j, p in enumerate(prefer) if j not in set(taken)]
    rec = [{"indices": list(map(int, top[i])), "supernet_rank": taken[i],
            "val_acc": round(got[i]["val_acc"], 4), "val_ce": round(got[i]["val_ce"], 4),
            "seconds": round(got[i].get("seconds", 0.0), 1)} for i in range(len(top))]
    log(f"final pick: the {len(top)} best-ranked networks trained: val acc "
        + ", ".join(f"{got[i]['val_acc']:.3f}" for i in range(len(top)))
        + f" (by supernet rank); first now the supernet's #{taken[order[0]] + 1}")
    return [top[i] for i in order] + rest, rec


@dataclass(frozen=True)
class TableFit:
    """θ fitted onto the target by the table: the fit over the ops, the widths chosen (a
    width-searched space), and the per-(layer, op) cost rows and fixed cost at those widths."""

    fit: Fit
    widths: tuple[int, ...]
    rows: list[list[float]]
    fixed: float


class PathJudge(Protocol):
    """What the search trainer lends the final pick: its supernet's verdict on paths (each
    candidate's validation {acc, ce}, BN re-estimated; every rank scores) and a child trained
    from scratch with the retrain section ({val_acc, val_ce, seconds}; rank 0).
    `can_score`: there is a validation split; `can_train`: children can be trained here (not
    under torchrun)."""

    can_score: bool
    can_train: bool

    def score_paths(self, cands: list[list[int]]) -> list[dict[str, float]]: ...

    def train_path(self, indices: list[int]) -> dict[str, float]: ...


class Selector:
    """The network one search returns for `target`, by the steps the module docstring names:
    `argmax`, `table_fit`, `pick` (the candidates, `candidates`, ranked by a `PathJudge`),
    `measured_fit`; `select` runs them. `fit_measure` overrides `search.fit_measure`;
    `measure` times a network instead of the clock (a simulation); `dist`: rank 0 times, the
    other ranks receive its choice."""

    def __init__(self, cfg: Config, theta: Sequence[torch.Tensor], costs: CostSource,
                 target: float | None, log: Callable[[str], None] = print, run: str = "RUN",
                 *, fit_measure: str | None = None, measure: Measurer | None = None,
                 dist: Any = None):
        self.cfg, self.theta, self.costs, self.target = cfg, list(theta), costs, target
        self.log, self.run = log, run
        self.fit_measure, self.measure, self.dist = fit_measure, measure, dist
        self._fitted: TableFit | None = None

    @property
    def fits(self) -> bool:
        """Whether the search fits a target (else it returns θ's argmax)."""
        return self.target is not None and self.cfg.search.fit_target

    def argmax(self) -> list[int]:
        """θ's most probable network (decision indices)."""
        return [int(t.argmax()) for t in self.theta]

    def table_fit(self) -> TableFit:
        """θ fitted onto the target by the table (once); a width-searched space fits ops and
        widths (`fit_with_widths`), an op-only one ops at its one width."""
        if self._fitted is None:
            cfg, costs, target = self.cfg, self.costs, float(self.target)
            tol = cfg.search.fit_tolerance
            if costs.widths is not None:
                fit, widths = fit_with_widths(self.theta, costs.widths, target, tol)
                self._fitted = TableFit(fit, tuple(widths), *costs.widths.rows_at(widths))
            else:
                rows = cost_lists(costs.rows, cfg.space.layer_candidates())
                self._fitted = TableFit(fit_to_target(self.theta, rows, costs.fixed, target,
                                                      tol), (), rows, costs.fixed)
        return self._fitted

    def candidates(self) -> list[list[int]]:
        """The networks `search.final_pick: path` chooses among: the table's fit of θ onto
        the target, then the most probable ones predicted between target·(1 − 2·fit_tolerance)
        and target·(1 + fit_tolerance), exactly in a space of up to 200,000 networks
        (`likeliest_in_band`). The band reaches further on the cheap side because a table's
        error is of the order of the tolerance (on the second benchmark space, networks
        predicted 5% under the target measure 2-3% under it), and a path's accuracy favours
        the dearer networks of a band, which pulls the choice up towards the target; the
        measured fit then judges it by its time. Where the fit lies outside that band (a gap
        of the space's costs), the band is the fit's cost ± fit_tolerance, no slower than the
        fit or the band's top. At most `search.final_candidates` (decision indices; a
        width-searched space's at the fit's widths), then `search.final_band_draws` more
        drawn uniformly from the same band (`drawn_in_band`, seeded by `search.seed`)."""
        s, target = self.cfg.search, float(self.target)
        tol = s.fit_tolerance
        tf = self.table_fit()
        fit, rows, fixed = tf.fit, tf.rows, tf.fixed
        ops = self.theta[:len(rows)]
        lo, hi = target * (1 - 2 * tol), target * (1 + tol)
        if not lo <= fit.cost <= hi:  # in a gap: around the fit's cost
            lo, hi = fit.cost * (1 - tol), min(fit.cost * (1 + tol),
                                               max(hi, fit.cost) * (1 + 1e-9))
        near = likeliest_in_band(ops, rows, fixed, lo, hi, s.final_candidates)
        out = ([list(fit.indices)] + [i for i in near if i != list(fit.indices)]
               )[:s.final_candidates]
        if s.final_band_draws:
            seen = {tuple(i) for i in out}
            rng = random.Random(f"fbnas-final-pick:{s.seed}")
            out += [i for i in drawn_in_band(rows, fixed, lo, hi, s.final_band_draws + len(out),
                                             rng) if tuple(i) not in seen][:s.final_band_draws]
        return [[*i, *tf.widths] for i in out]

    def pick(self, judge: PathJudge) -> tuple[list[list[int]], dict[str, Any], int]:
        """`search.final_pick: path`: the candidates ranked by their paths on the supernet;
        with `search.final_train: K`, the K best-ranked predicted within the tolerance
        trained from scratch and put first by that. (ranked candidates, the arch file's
        meta.final_pick, how many of the first were ranked by training)."""
        s, log, target = self.cfg.search, self.log, float(self.target)
        cands = self.candidates()
        scores = judge.score_paths(cands)
        ranked, rec = rank_paths(cands, scores)
        best = ranked[0]
        log(f"final pick: of {len(cands)} networks near the fitted cost"
            + (f" (θ's most probable and up to {s.final_band_draws} drawn across the band)"
               if s.final_band_draws else "") + ", the best path on the "
            f"supernet reads val acc {scores[best]['acc']:.3f} (the table fit's "
            f"{scores[0]['acc']:.3f})" + (": the fit's own" if best == 0 else ""))
        prefer = [cands[i] for i in ranked]
        trained = 0
        if s.final_train and judge.can_train:
            # only networks the table predicts within the tolerance: a trained network the
            # measured fit cannot return would be a training spent for nothing
            model = self.costs.model(self.cfg.space)
            prefer, rec["trained"] = train_ranked(
                prefer, judge.train_path, s.final_train, log, s.final_train_distinct,
                lambda p: abs(model.of(list(p)) / target - 1) <= s.fit_tolerance)
            pos = {tuple(c): i for i, c in enumerate(cands)}
            rec["ranked"] = [pos[tuple(p)] for p in prefer]
            trained = len(rec["trained"])
            rec["chosen"] = rec["ranked"][0]
        elif s.final_train:
            log("search.final_train skipped: the final pick cannot train networks here "
                "(under torchrun)")
        return prefer, rec, trained

    def measured_fit(self, prefer: Sequence[Sequence[int]] = (), trained: int = 0
                     ) -> tuple[list[int], dict[str, Any]]:
        """The table's fit (or `prefer`'s first: the final pick's networks, best first, one
        choice of widths), then, where `search.fit_measure` allows and this machine can time
        the table's device, timed end to end and re-fitted until it measures within
        `search.fit_tolerance` (`fbnas.fit.onto_target.measured_fit`, which prefers
        `prefer`'s networks; the first `trained` of them were ranked by training them).
        Returns its decision indices and what to record in its meta (target, predicted,
        measured, every timed round)."""
        cfg, costs, log, target = self.cfg, self.costs, self.log, float(self.target)
        s = cfg.search
        tf = self.table_fit()
        fit, widths, rows, fixed = tf.fit, tf.widths, tf.rows, tf.fixed
        n = len(rows)
        log(fit.describe(cfg.loss.target, target, costs.unit))
        first = list(prefer[0]) if prefer else None
        if first is not None:
            fitted = [*fit.indices, *widths]
            widths = tuple(first[n:])
            rows, fixed = costs.model(cfg.space).rows_at(widths)
            cost = predicted_cost(rows, fixed, first[:n])
            fit = Fit(list(first[:n]), cost, sum(a != b for a, b in zip(
                first, self.argmax(), strict=True)),
                abs(cost / target - 1) <= s.fit_tolerance, s.fit_tolerance)
            if list(first) != fitted:
                log(f"returned: the final pick's network, predicted {cost:.1f} {costs.unit} "
                    f"({cost / target - 1:+.1%} from the target)")
        full, theta = self.theta, self.theta[:n]
        meta: dict[str, Any] = {"target": target, "predicted": round(fit.cost, 3),
                                "cost_unit": costs.unit, "fitted_layers": fit.changes}
        if _measured_fit_mode(cfg, costs, self.fit_measure, log, self.run):
            t0 = time.perf_counter()
            measure = self.measure or fit_measurer(cfg, costs.table, widths, near_us=target)
            with reused_workers():  # one timing process for all of the fit's measurements
                mf = measured_fit(theta, rows, fixed, target, measure, s.fit_tolerance,
                                  s.fit_rounds, first=fit.indices,
                                  prefer=[list(p[:n]) for p in prefer], trained=trained)
                meta.update(_measured_meta(cfg, mf, measure, target, costs.unit, log, t0))
            chosen = [*mf.fit.indices, *widths]
            meta["fitted_layers"] = sum(a != int(t.argmax()) for a, t in zip(chosen, full,
                                                                              strict=True))
            return chosen, meta
        return [*fit.indices, *widths], meta

    def select(self, judge: PathJudge | None = None, recorded: Sequence[Sequence[int]] = (),
               recorded_trained: int = 0) -> Selection:
        """The steps in order: θ's argmax where the search fits no target; else the pick
        (by `judge`, or a finished run's `recorded` ranking, its first `recorded_trained`
        ranked by training them) and the measured fit, on rank 0 (the other ranks receive
        its choice)."""
        if not self.fits:
            return Selection(self.argmax())
        meta: dict[str, Any] = {}
        prefer: list[list[int]] = [list(p) for p in recorded]
        trained = recorded_trained  # how many of `prefer`, first, were ranked by training
        if (not prefer and self.cfg.search.final_pick == "path" and judge is not None
                and judge.can_score):
            prefer, meta["final_pick"], trained = self.pick(judge)
        dist = self.dist
        distributed = dist is not None and dist.distributed
        got: tuple = ()
        if dist is None or dist.is_main:
            try:
                got = ("ok", *self.measured_fit(prefer, trained))
            except FbnasError as e:
                got = ("error", str(e))
                if distributed:
                    dist.broadcast_object(got)
                raise
        if distributed:
            got = dist.broadcast_object(got)
        if got[0] == "error":
            raise FbnasError(f"rank 0: {got[1]}")
        _, indices, fit_meta = got
        meta.update(fit_meta)
        return Selection(list(indices), meta)


def refit(run: SearchRun, fit_measure: str | None = None,
          log: Callable[[str], None] = print) -> Architecture:
    """A finished search's network selected again as `fbnas train` selected arch_hard.yaml
    (its recorded pick read back; measured where this machine can time the table's device;
    `fit_measure` overrides the run's setting); meta: the run and the selection's record."""
    cfg = run.config
    name, where = f"{cfg.space.name}_search", str(run.dir)
    if run.table is None or cfg.loss.target is None or not cfg.search.fit_target:
        a = sample_hard(cfg.space, run.theta, name=name)
        return Architecture(a.macro, a.ops, a.name, a.space).with_meta(run=where)
    prefer, pick = run.recorded_pick
    sel = Selector(cfg, run.theta, run.costs, run.target, log, where,
                   fit_measure=fit_measure).select(
        recorded=prefer, recorded_trained=len((pick or {}).get("trained", [])))
    if pick is not None:
        sel.meta = {"final_pick": pick, **sel.meta}
    return sel.architecture(cfg, name, run=where)
