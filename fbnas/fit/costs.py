"""Where a run's costs come from, and a child network's latency, predicted and measured.

`resolve_costs` loads the table a config names, reuses this machine's cached table for the
space and timer settings, or measures one (the cache policy: `cached_table_path`); a resumed
run keeps the table saved in its run directory. `shared_costs` does the same under torchrun
(rank 0 resolves, the others receive). For a trained child, `find_latency_table` finds the
table to predict with and `predict_ms` predicts (`fbnas.fit.end_to_end.measure_child_ms` times it).
The final fit (`final_fit`) puts a search's θ on its target, by the table and then by timing
the network (`fbnas.fit.end_to_end`); `fit_search_run` does it again for a finished run.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fbnas.arch import Architecture, arch_from_indices, sample_hard
from fbnas.backends.worker import reused_workers
from fbnas.checkpoint import load_checkpoint
from fbnas.config import Config, config_from_dict
from fbnas.cost_kinds import COST_KINDS, is_measured
from fbnas.distributed import DistContext
from fbnas.errors import FbnasError
from fbnas.fit.end_to_end import panel, time_archs
from fbnas.fit.onto_target import (
    Fit,
    cost_lists,
    cost_range,
    fit_to_target,
    fit_with_widths,
    likeliest_in_band,
    measured_fit,
    predicted_cost,
)
from fbnas.latency import LatencyTable, Timer, build_cost_table, build_table, space_hash
from fbnas.latency.signature import layer_width_signatures, stem_signature
from fbnas.search.width_costs import WidthCosts


@dataclass
class CostSource:
    """Per-(layer, op) costs and where they came from."""

    rows: list[dict[str, float]]
    fixed: float
    fingerprint: str
    unit: str
    description: str
    table: Any = None  # the LatencyTable (or counted table) for predictions
    widths: WidthCosts | None = None  # a width-searched space's costs (then `rows` are widest)


def width_costs(space, table) -> WidthCosts | None:
    """A width-searched space's costs from `table` (its calibration applied where it has one;
    the fitted per-(layer, op) corrections are fitted at one width and do not carry over);
    None for a space that searches no widths."""
    if not space.searches_widths:
        return None
    table.require(space)
    cal = table.calibration
    a, b = (float(cal["a"]), float(cal["b"])) if cal else (1.0, 0.0)
    rows, heads = layer_width_signatures(space)
    return WidthCosts(space, [{k: a * table.value(s) for k, s in row.items()} for row in rows],
                      [a * table.value(s) for s in heads],
                      a * table.value(stem_signature(space.macro)) + b)


def _source(cfg: Config, table, description: str) -> CostSource:
    rows, fixed = table.costs_for(cfg.space)
    return CostSource(rows, fixed, table.fingerprint(), COST_KINDS.get(table.cost).unit,
                      description, table, width_costs(cfg.space, table))


def cached_table_path(cfg: Config, timer: Timer | None = None) -> Path:
    """Where `fbnas train` caches the latency table measured for this config's space and
    latency settings on this machine."""
    lat, space = cfg.latency, cfg.space
    fp_dev = (timer or lat.make_timer()).describe()
    key = json.dumps({k: fp_dev.get(k) for k in sorted(fp_dev) if k != "created"},
                     sort_keys=True)
    tag = hashlib.sha256((key + space_hash(space)).encode()).hexdigest()[:16]
    return Path(lat.cache_dir).expanduser() / f"{space.name}-{lat.device}-{tag}.json"


def resolve_costs(cfg: Config, log: Callable[[str], None] = print,
                  run_dir: Path | None = None, prefer_saved: bool = False,
                  save: bool = True) -> CostSource:
    """Load, reuse from cache, or build the cost table the config asks for (a resumed run,
    `prefer_saved`, takes the copy saved in its run directory when the config names no
    table file)."""
    lat, space = cfg.latency, cfg.space
    saved = run_dir / "cost_table.json" if run_dir is not None else None
    if prefer_saved and saved is not None and saved.is_file():
        # a resumed run keeps the table it was searched with, whatever the cache holds now
        table = LatencyTable.load(saved)
        if table.cost == lat.cost:
            return _source(cfg, table, f"cost table {saved}")
    if lat.table:
        table = LatencyTable.load(lat.table)
        if table.cost != lat.cost:
            raise FbnasError(f"{lat.table}: is a {table.cost} table but latency.cost is "
                             f"{lat.cost!r}")
        table.check_run(batch=lat.batch, dtype=lat.dtype,
                        allocator=lat.make_timer().allocator if lat.allocator else None)
        desc = f"{lat.cost} table {lat.table}"
    elif COST_KINDS.get(lat.cost).counted:
        table = build_cost_table(space, lat.cost)
        desc = f"counted {lat.cost} table"
    else:
        timer = lat.make_timer()
        cache = cached_table_path(cfg, timer)
        table = LatencyTable.load(cache) if cache.is_file() else None
        if table is not None and not table.missing(space):
            log(f"reusing cached latency table {cache}")
            desc = f"latency table {cache} (cached, measured on this machine)"
        else:
            log(f"measuring a latency table for this machine ({lat.device}) -> {cache}")
            table = build_table(space, timer, table=table, out=cache, progress=cfg.run.progress,
                                log=log)
            desc = f"latency table {cache} (measured now)"
    if run_dir is not None and save:
        table.save(run_dir / "cost_table.json")
    return _source(cfg, table, desc)


def shared_costs(cfg: Config, dist: DistContext, log: Callable[[str], None], run_dir: Path,
                 resume: bool) -> CostSource:
    """`resolve_costs` for a search run (not saved yet: the trainer saves it once every other
    input is valid). Under torchrun rank 0 loads or measures the table and the other ranks
    receive its rows and fingerprint, or its error."""

    def resolve() -> CostSource:
        return resolve_costs(cfg, log, run_dir, prefer_saved=resume and (
            is_measured(cfg.latency.cost)) and not cfg.latency.table, save=False)

    if not dist.distributed:
        return resolve()
    costs, payload = None, None
    if dist.is_main:
        try:
            costs = resolve()
            payload = ("ok", costs.rows, costs.fixed, costs.fingerprint, costs.unit,
                       costs.description, None, costs.widths)
        except FbnasError as e:
            payload = ("error", str(e))
            dist.broadcast_object(payload)
            raise
    payload = dist.broadcast_object(payload)
    if costs is not None:
        return costs
    if payload[0] == "error":
        raise FbnasError(f"rank 0: {payload[1]}")
    return CostSource(*payload[1:])


# ---- a child's latency predicted from a table ---------------------------------------------
def find_latency_table(cfg: Config, arch: Architecture, log: Any = None
                       ) -> tuple[LatencyTable | None, str | None]:
    """(table, source) for predicting `arch`'s latency: `latency.table`, else the search run's
    cost_table.json (the arch file's meta.run), else this machine's cached table for the
    config's space; (None, None) when there is none (nothing is measured here)."""
    if not is_measured(cfg.latency.cost):
        return None, None
    candidates: list[Path] = []
    if cfg.latency.table:
        candidates.append(Path(cfg.latency.table))
    run = arch.meta.get("run") if isinstance(arch.meta, dict) else None
    if run:
        candidates.append(Path(run) / "cost_table.json")
    try:
        candidates.append(cached_table_path(cfg))
    except FbnasError:
        pass
    for p in candidates:
        if p.is_file():
            try:
                t = LatencyTable.load(p)
            except FbnasError as e:
                if log is not None:
                    log.warning(f"skipping latency table: {e}")
                continue
            if is_measured(t.cost):
                return t, str(p)
    return None, None


def predict_ms(table: LatencyTable, arch: Architecture, cfg: Config) -> float:
    """The table's whole-network latency of `arch`, in ms (its calibration/corrections applied
    when the architecture belongs to the config's space)."""
    try:
        arch.check_fits(cfg.space)
        return table.predict(arch, "auto", cfg.space) / 1e3
    except FbnasError:
        return table.predict(arch, "raw") / 1e3


# ---- the final fit: onto the target by the table, then by measuring the network -----------------
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


def fit_measurer(cfg: Config, table: LatencyTable, widths: Sequence[int] = ()
                 ) -> Callable[[list[int]], tuple[float, float]]:
    """`measure(indices) -> (median, rel_iqr)`: the architecture with these op indices (at
    the choice of `widths` of a width-searched space) built and timed end to end under the
    table's timer settings (threads, batch, dtype, allocator) and drift compensation, in the
    table's units, interleaved with its `panel`."""
    timer = cfg.latency.for_timing(table.meta).make_timer()
    pan = panel(cfg.space, table)

    def measure(indices: list[int]) -> tuple[float, float]:
        arch = arch_from_indices(cfg.space, [*indices, *widths], "fit")
        s = time_archs(timer, {"fit": arch}, table, pan)["fit"]
        return s["median_us"], s["rel_iqr"]

    return measure


TableFit = tuple[Fit, tuple[int, ...], list[list[float]], float]


def table_fit(cfg: Config, theta: list[torch.Tensor], costs: CostSource, target: float
              ) -> TableFit:
    """θ fitted onto `target` by the table: (the fit over the ops, the widths chosen, and the
    per-(layer, op) rows and fixed cost at those widths); a width-searched space fits ops and
    widths (`fit_with_widths`), an op-only one ops at its one width."""
    tol = cfg.search.fit_tolerance
    if costs.widths is not None:
        fit, widths = fit_with_widths(theta, costs.widths, target, tol)
        return (fit, tuple(widths), *costs.widths.rows_at(widths))
    rows = cost_lists(costs.rows, cfg.space.layer_candidates())
    return fit_to_target(theta, rows, costs.fixed, target, tol), (), rows, costs.fixed


def pick_candidates(cfg: Config, theta: list[torch.Tensor], costs: CostSource, target: float,
                    fitted: TableFit | None = None) -> list[list[int]]:
    """The networks `search.final_pick: path` chooses among: the table's fit of θ onto
    `target`, then the most probable ones predicted between target·(1 − 2·fit_tolerance) and
    target·(1 + fit_tolerance), exactly in a space of up to 200,000 networks
    (`likeliest_in_band`). The band reaches further on the cheap side because a table's error
    is of the order of the tolerance (on the second benchmark space, networks predicted 5%
    under the target measure 2-3% under it), and a path's accuracy favours the dearer
    networks of a band, which pulls the choice up towards the target; the measured fit then
    judges it by its time. Where the fit lies outside that band (a gap of the space's costs),
    the band is the fit's cost ± fit_tolerance, no slower than the fit or the band's top.
    At most `search.final_candidates` (decision indices; a width-searched space's at the
    fit's widths). `fitted`: `table_fit`'s result, where the caller has it already."""
    s = cfg.search
    tol = s.fit_tolerance
    fit, widths, rows, fixed = fitted or table_fit(cfg, theta, costs, target)
    ops = theta[:len(rows)]
    lo, hi = target * (1 - 2 * tol), target * (1 + tol)
    if not lo <= fit.cost <= hi:  # in a gap: around the fit's cost
        lo, hi = fit.cost * (1 - tol), min(fit.cost * (1 + tol), max(hi, fit.cost) * (1 + 1e-9))
    near = likeliest_in_band(ops, rows, fixed, lo, hi, s.final_candidates)
    out = [list(fit.indices)] + [i for i in near if i != list(fit.indices)]
    return [[*i, *widths] for i in out[:s.final_candidates]]


def final_fit(cfg: Config, theta: list[torch.Tensor], costs: CostSource, target: float,
              log: Callable[[str], None], run: str = "RUN", fit_measure: str | None = None,
              prefer: Sequence[Sequence[int]] = (), fitted: TableFit | None = None
              ) -> tuple[list[int], dict[str, Any]]:
    """The architecture a search returns for `target`: θ's argmax fitted onto the target by
    the table (`fit_to_target`), then, where `search.fit_measure` allows and this machine can
    time the table's device, timed end to end and re-fitted until it measures within
    `search.fit_tolerance` (`measured_fit`). Returns its op indices and what to record in its
    meta (target, predicted, measured, every timed round). `prefer`: the final pick's networks,
    best first (decision indices, one choice of widths): the first is returned instead of
    the table's fit and timed first, and the measured fit prefers them (`measured_fit`).
    `fitted`: `table_fit`'s result, where the caller has it already."""
    s = cfg.search
    fit, widths, rows, fixed = fitted or table_fit(cfg, theta, costs, target)
    n = len(rows)
    log(fit.describe(cfg.loss.target, target, costs.unit))
    first = list(prefer[0]) if prefer else None
    if first is not None:
        fitted = [*fit.indices, *widths]
        widths = tuple(first[n:])
        rows, fixed = costs.widths.rows_at(widths) if costs.widths is not None else (rows, fixed)
        cost = predicted_cost(rows, fixed, first[:n])
        fit = Fit(list(first[:n]), cost, sum(a != b for a, b in zip(
            first, [int(t.argmax()) for t in theta], strict=True)),
            abs(cost / target - 1) <= s.fit_tolerance, s.fit_tolerance)
        if list(first) != fitted:
            log(f"returned: the final pick's network, predicted {cost:.1f} {costs.unit} "
                f"({cost / target - 1:+.1%} from the target)")
    full, theta = theta, theta[:n]
    meta: dict[str, Any] = {"target": float(target), "predicted": round(fit.cost, 3),
                            "cost_unit": costs.unit, "fitted_layers": fit.changes}
    if _measured_fit_mode(cfg, costs, fit_measure, log, run):
        t0 = time.perf_counter()
        measure = fit_measurer(cfg, costs.table, widths)
        with reused_workers():  # one timing process for all of the fit's measurements
            mf = measured_fit(theta, rows, fixed, target, measure, s.fit_tolerance,
                              s.fit_rounds, first=fit.indices,
                              prefer=[list(p[:n]) for p in prefer])
            meta.update(_measured_meta(cfg, mf, measure, target, costs.unit, log, t0))
        chosen = [*mf.fit.indices, *widths]
        meta["fitted_layers"] = sum(a != int(t.argmax()) for a, t in zip(chosen, full,
                                                                          strict=True))
        return chosen, meta
    return [*fit.indices, *widths], meta


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


# ---- a finished search run's θ, table and fitted architecture (fbnas sample, fbnas sweep) -------
def load_search_run(run_dir: Path) -> tuple[dict[str, Any], Config, list[torch.Tensor]]:
    """(checkpoint state, config, θ per decision) of a search run, θ checked against its
    space (each layer's ops, then each searched stage's widths)."""
    ckpt = Path(run_dir) / "checkpoint.pt"
    state = load_checkpoint(ckpt, kind="search")
    cfg = config_from_dict(state["config"], str(ckpt))
    theta = []
    for i, cands in enumerate(cfg.space.decision_candidates()):
        t = state["model"].get(f"theta.{i}")
        if t is None or t.ndim != 1 or len(t) != len(cands) or not t.is_floating_point():
            raise FbnasError(f"{ckpt}: damaged checkpoint: model.theta.{i} does not fit decision "
                             f"{i} of its search space '{cfg.space.name}' ({len(cands)} "
                             "candidates)")
        theta.append(t)
    return state, cfg, theta


def run_table(run_dir: Path) -> LatencyTable | None:
    """The cost table saved in a run directory (optional; one that is there must load)."""
    p = Path(run_dir) / "cost_table.json"
    return LatencyTable.load(p) if p.exists() else None


def run_costs(cfg: Config, table: LatencyTable) -> CostSource:
    return _source(cfg, table, "the run's cost table")


def run_target(cfg: Config, costs: CostSource) -> float:
    """The run's loss.target in the table's units (a relative target over its space's range)."""
    if costs.widths is not None:
        return cfg.loss.build(costs.widths.bounds()).target
    rows = cost_lists(costs.rows, cfg.space.layer_candidates())
    return cfg.loss.build(cost_range(rows, costs.fixed)).target


def fit_search_run(run_dir: Path, fit_measure: str | None = None,
                   log: Callable[[str], None] = print, loaded: tuple | None = None
                   ) -> Architecture:
    """argmax θ of a search run, fitted to its loss.target as `fbnas train` fits arch_hard.yaml
    (`final_fit`: by the table, then measured where this machine can time the table's device;
    `fit_measure` overrides the run's setting); meta: the fit's record and the run."""
    _, cfg, theta = loaded or load_search_run(run_dir)
    table = run_table(run_dir)
    a = sample_hard(cfg.space, theta, name=f"{cfg.space.name}_search")
    if table is None or cfg.loss.target is None or not cfg.search.fit_target:
        return Architecture(a.macro, a.ops, a.name, a.space, {"run": str(run_dir)})
    costs = run_costs(cfg, table)
    prefer, pick = recorded_pick(run_dir, cfg)
    indices, meta = final_fit(cfg, theta, costs, run_target(cfg, costs), log, str(run_dir),
                              fit_measure, prefer=prefer)
    if pick is not None:
        meta["final_pick"] = pick
    return arch_from_indices(cfg.space, indices, a.name, run=str(run_dir), **meta)


def recorded_pick(run_dir: Path, cfg: Config) -> tuple[list[list[int]], dict | None]:
    """The networks the run's final pick ranked (`search.final_pick: path`, recorded in its
    arch_hard.yaml), best first: a re-fit starts from them, as the search's fit did (a record
    from before the ranking was kept holds the chosen one only); ([], None) where the run made
    none."""
    path = Path(run_dir) / "arch_hard.yaml"
    if not path.is_file():
        return [], None
    a = Architecture.load(path)
    pick = a.meta.get("final_pick")
    cands = pick.get("candidates_indices") or [] if isinstance(pick, dict) else []
    if not cands or not 0 <= int(pick.get("chosen", -1)) < len(cands):
        return [], None
    order = pick.get("ranked") or [int(pick["chosen"])]
    return [list(cands[int(i)]) for i in order], pick
