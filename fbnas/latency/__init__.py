"""What a network costs: latency (and FLOPs / params) lookup tables per device, keyed by block
signature, the cost models made of them and where a run's table comes from.

    table = LatencyTable.load(path)
    table.check_run(batch=1, dtype="float32")
    rows, fixed = table.costs_for(space)      # -> Supernet.set_costs(rows, fixed)

Submodules: `kinds` (what a table holds: latency, FLOPs, params, their units), `signature`
(keys), `measure` (interleaved, reference-normalised rounds), `table` (the file format),
`build` (measure missing entries), `counted` (FLOPs / params tables), `cost_model` and
`width_costs` (an architecture's cost under a table, one way), `resolve` (a run's table:
loaded, cached or measured; a child's predicted latency), `validate` (end-to-end agreement,
calibration, corrected cost model), `end_to_end` (a child timed whole), `bundle` (tables
measured on a device that cannot run fbnas). The timers are `fbnas.backends`' (`Timer` and
`make_timer` are re-exported here). See docs/latency.md.

The names below are imported from their modules the first time they are asked for, so
`fbnas.latency.kinds` is read without torch (the command line's help lists the kinds). The
functions named as their modules are (`measure.measure`, `validate.validate`) are imported from
those modules: the package's attribute of that name is the module.
"""

from __future__ import annotations

from fbnas.registry import lazy_exports

# name -> the module that defines it
_NAMES = {
    "Timer": "fbnas.backends", "make_timer": "fbnas.backends",
    "build_table": "fbnas.latency.build", "measure_archs": "fbnas.latency.build",
    "sample_spanning": "fbnas.latency.build",
    "build_cost_table": "fbnas.latency.counted",
    "REFERENCE": "fbnas.latency.measure", "Protocol": "fbnas.latency.measure",
    **dict.fromkeys(("Signature", "arch_signatures", "block_signature", "head_signature",
                     "layer_signatures", "space_signatures", "stem_signature"),
                    "fbnas.latency.signature"),
    "CostTable": "fbnas.latency.table", "LatencyTable": "fbnas.latency.table",
    "space_hash": "fbnas.latency.table",
    "apply_report": "fbnas.latency.validate",
    "COST_KINDS": "fbnas.latency.kinds",
    "OpCosts": "fbnas.latency.cost_model", "WidthCosts": "fbnas.latency.width_costs",
    "CostSource": "fbnas.latency.resolve", "resolve_costs": "fbnas.latency.resolve",
}

__all__ = sorted(_NAMES)


__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
