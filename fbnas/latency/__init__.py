"""Latency (and FLOPs / params) lookup tables per device, keyed by block signature.

    table = LatencyTable.load(path)
    table.check_run(batch=1, dtype="float32")
    rows, fixed = table.costs_for(space)      # -> Supernet.set_costs(rows, fixed)

Submodules: `signature` (keys), `measure` (interleaved, reference-normalised rounds), `table`
(the file format), `build` (measure missing entries), `counted` (FLOPs / params tables), `validate`
(end-to-end agreement, calibration, corrected cost model), `bundle` (tables measured on a device
that cannot run fbnas). The timers are `fbnas.backends`' (`Timer` and `make_timer` are
re-exported here). The package depends only on blocks, search_space, arch, costs and
backends; see docs/latency.md.
"""

from fbnas.backends import Timer, make_timer
from fbnas.latency.build import build_table, measure_archs, sample_spanning
from fbnas.latency.counted import build_cost_table
from fbnas.latency.measure import REFERENCE, Protocol, measure
from fbnas.latency.signature import (
    Signature,
    arch_signatures,
    block_signature,
    head_signature,
    layer_signatures,
    space_signatures,
    stem_signature,
)
from fbnas.latency.table import CostTable, LatencyTable, space_hash
from fbnas.latency.validate import apply_report, validate

__all__ = [
    "REFERENCE", "CostTable", "LatencyTable", "Protocol", "Signature", "Timer", "apply_report",
    "arch_signatures", "block_signature", "build_cost_table", "build_table", "head_signature",
    "layer_signatures", "make_timer", "measure", "measure_archs", "sample_spanning",
    "space_hash", "space_signatures", "stem_signature", "validate",
]
