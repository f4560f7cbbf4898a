"""Where a run's costs come from, and a child network's latency predicted from a table.

`resolve_costs` loads the table a run's `latency:` section names, reuses this machine's cached
table for the space and timer settings, or measures one (the cache policy:
`cached_table_path`); a resumed run keeps the table saved in its run directory. `shared_costs`
does the same under torchrun (rank 0 resolves, the others receive). For a trained child,
`find_latency_table` finds the table to predict with and `predict_us` predicts
(`fbnas.latency.end_to_end.measure_child` times it). What a finished search's table makes of
its loss.target: `run_costs`, `run_target`. The functions take the config's parts they read
(the space, its `latency:` and `loss:` sections), not the config, which sits above this
package. (From θ to the returned network: `fbnas.fit.select`.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fbnas.arch import Architecture
from fbnas.backends import Timer
from fbnas.errors import FbnasError
from fbnas.latency.build import build_table
from fbnas.latency.config import LatencyConfig
from fbnas.latency.cost_model import OpCosts, cost_lists
from fbnas.latency.counted import build_cost_table
from fbnas.latency.kinds import COST_KINDS, is_measured
from fbnas.latency.signature import layer_width_signatures, stem_signature
from fbnas.latency.table import LatencyTable, calibrated, space_hash
from fbnas.latency.width_costs import WidthCosts
from fbnas.loss import LossConfig
from fbnas.runs.files import RunFiles
from fbnas.search_space import SearchSpace
from fbnas.training.distributed import DistContext


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

    def model(self, space) -> WidthCosts | OpCosts:
        """The cost of an architecture of `space` under these costs, one way (of, bounds,
        rows_at: fbnas.latency.cost_model)."""
        if self.widths is not None:
            return self.widths
        return OpCosts(cost_lists(self.rows, space.layer_candidates()), self.fixed)


def width_costs(space, table) -> WidthCosts | None:
    """A width-searched space's costs from `table` (its calibration applied where it has one;
    the fitted per-(layer, op) corrections are fitted at one width and do not carry over);
    None for a space that searches no widths."""
    if not space.searches_widths:
        return None
    table.require(space)
    sig_rows, heads = layer_width_signatures(space)
    rows = [{k: table.value(s) for k, s in row.items()} for row in sig_rows]
    head = {i: table.value(s) for i, s in enumerate(heads)}  # times a, as the blocks
    rows, stem = calibrated(table.calibration, [*rows, head],
                            table.value(stem_signature(space.macro)))  # times a, plus b
    return WidthCosts(space, rows[:-1], list(rows[-1].values()), stem)


def _source(space: SearchSpace, table, description: str) -> CostSource:
    rows, fixed = table.costs_for(space)
    return CostSource(rows, fixed, table.fingerprint(), COST_KINDS.get(table.cost).unit,
                      description, table, width_costs(space, table))


def cached_table_path(space: SearchSpace, lat: LatencyConfig, timer: Timer | None = None
                      ) -> Path:
    """Where `fbnas train` caches the latency table measured for this space and these latency
    settings on this machine."""
    fp_dev = (timer or lat.make_timer()).describe()
    key = json.dumps({k: fp_dev.get(k) for k in sorted(fp_dev) if k != "created"},
                     sort_keys=True)
    tag = hashlib.sha256((key + space_hash(space)).encode()).hexdigest()[:16]
    return Path(lat.cache_dir).expanduser() / f"{space.name}-{lat.device}-{tag}.json"


def resolve_costs(space: SearchSpace, lat: LatencyConfig, log: Callable[[str], None] = print,
                  run_dir: Path | None = None, prefer_saved: bool = False,
                  save: bool = True, progress: bool = False) -> CostSource:
    """Load, reuse from cache, or build the cost table `lat` (a config's `latency:`) asks for
    (a resumed run, `prefer_saved`, takes the copy saved in its run directory when `lat` names
    no table file; `progress`: a progress bar while measuring)."""
    saved = RunFiles(run_dir).table if run_dir is not None else None
    if prefer_saved and saved is not None and saved.is_file():
        # a resumed run keeps the table it was searched with, whatever the cache holds now
        table = LatencyTable.load(saved)
        if table.cost == lat.cost:
            return _source(space, table, f"cost table {saved}")
    if lat.table:
        table = LatencyTable.load(lat.table)
        if table.cost != lat.cost:
            raise FbnasError(f"{lat.table}: is a {table.cost} table but latency.cost is "
                             f"{lat.cost!r}")
        table.check_run(batch=lat.batch, dtype=lat.dtype, quantization=lat.quantization,
                        allocator=lat.make_timer().allocator if lat.allocator else None)
        desc = f"{lat.cost} table {lat.table}"
    elif COST_KINDS.get(lat.cost).counted:
        table = build_cost_table(space, lat.cost)
        desc = f"counted {lat.cost} table"
    else:
        timer = lat.make_timer()
        cache = cached_table_path(space, lat, timer)
        table = LatencyTable.load(cache) if cache.is_file() else None
        if table is not None and not table.missing(space):
            log(f"reusing cached latency table {cache}")
            desc = f"latency table {cache} (cached, measured on this machine)"
        else:
            log(f"measuring a latency table for this machine ({lat.device}) -> {cache}")
            table = build_table(space, timer, table=table, out=cache, progress=progress,
                                log=log)
            desc = f"latency table {cache} (measured now)"
    if run_dir is not None and save:
        table.save(RunFiles(run_dir).table)
    return _source(space, table, desc)


def shared_costs(space: SearchSpace, lat: LatencyConfig, dist: DistContext,
                 log: Callable[[str], None], run_dir: Path, resume: bool,
                 progress: bool = False) -> CostSource:
    """`resolve_costs` for a search run (not saved yet: the trainer saves it once every other
    input is valid). Under torchrun rank 0 loads or measures the table and the other ranks
    receive its rows and fingerprint, or its error."""

    def resolve() -> CostSource:
        return resolve_costs(space, lat, log, run_dir, prefer_saved=resume and (
            is_measured(lat.cost)) and not lat.table, save=False, progress=progress)

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
def find_latency_table(space: SearchSpace, lat: LatencyConfig, arch: Architecture,
                       log: Any = None) -> tuple[LatencyTable | None, str | None]:
    """(table, source) for predicting `arch`'s latency: `lat.table`, else the search run's
    cost_table.json (the arch file's meta.run), else this machine's cached table for `space`;
    (None, None) when there is none (nothing is measured here)."""
    if not is_measured(lat.cost):
        return None, None
    candidates: list[Path] = []
    if lat.table:
        candidates.append(Path(lat.table))
    run = arch.meta.get("run") if isinstance(arch.meta, dict) else None
    if run:
        candidates.append(RunFiles(run).table)
    try:
        candidates.append(cached_table_path(space, lat))
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


def predict_us(table: LatencyTable, arch: Architecture, space: SearchSpace) -> float:
    """The table's whole-network latency of `arch`, in µs (its calibration/corrections applied
    when the architecture belongs to `space`)."""
    try:
        arch.check_fits(space)
        return table.predict(arch, "auto", space)
    except FbnasError:
        return table.predict(arch, "raw")


# ---- a finished search's costs ------------------------------------------------------------
def run_costs(space: SearchSpace, table: LatencyTable) -> CostSource:
    return _source(space, table, "the run's cost table")


def run_target(space: SearchSpace, loss: LossConfig, costs: CostSource) -> float:
    """The run's loss.target in the table's units (a relative target over its space's range)."""
    return loss.build(costs.model(space).bounds()).target
