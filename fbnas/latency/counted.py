"""Counted tables: FLOPs and params per block signature, in the latency-table format (no
device needed), and the FLOPs per (layer, op) that order ops when sampling networks."""

from __future__ import annotations

from fbnas.arch import module_flops
from fbnas.errors import FbnasError
from fbnas.latency.kinds import COST_KINDS, counted_kinds
from fbnas.latency.signature import Signature, layer_signatures, space_signatures
from fbnas.latency.table import LatencyTable
from fbnas.search_space import SearchSpace


def counted_rows(space: SearchSpace) -> list[dict[str, float]]:
    """FLOPs per (layer, op), counted on the meta device (instant; for ordering ops)."""
    return [{op: float(module_flops(sig.build().eval().to("meta"), sig.input_shape, "meta"))
             for op, sig in row.items()} for row in layer_signatures(space)]


def count_signature(sig: Signature, cost: str) -> float:
    """The counted cost (a kind with a `count` in COST_KINDS: FLOPs, params) of one entry."""
    return COST_KINDS.get(cost).count(sig.build().eval(), sig.input_shape)


def build_cost_table(space: SearchSpace, cost: str = "flops",
                     table: LatencyTable | None = None) -> LatencyTable:
    """A FLOPs or params table in the latency-table format, keyed by the same signatures;
    needs no device. Extends `table` with the missing signatures when given."""
    if cost not in counted_kinds():
        raise FbnasError(f"cost must be {' or '.join(counted_kinds())} for a counted table, "
                         f"got {cost!r}")
    if table is None:
        table = LatencyTable(cost, {"backend": "none", "batch": 1,
                                    "note": "counted per sample, device independent"})
    elif table.cost != cost:
        raise FbnasError(f"{table.path or 'table'}: is a {table.cost} table, not {cost}")
    for sig in space_signatures(space):
        if sig not in table:
            table.add(sig, count_signature(sig, cost))
    return table
