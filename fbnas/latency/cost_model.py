"""The cost of an architecture, one way: an op-only space's costs (`OpCosts`, one number per
(layer, op)) behind the same host-side interface as a width-searched space's (`WidthCosts`,
fbnas.latency.width_costs): `of(indices)` (an architecture's predicted cost), `bounds()` (the
cheapest and dearest architecture's), `rows_at(widths)` (per-(layer, op) costs and the fixed
cost at one choice of widths: what the fit works on). `CostSource.model(space)`
(fbnas.latency.resolve) gives a run's; the row primitives below are what both are made of.
"""

from __future__ import annotations

from collections.abc import Sequence


def cost_lists(rows: Sequence[dict[str, float]], candidates: Sequence[Sequence[str]]
               ) -> list[list[float]]:
    """A cost table's rows (op -> cost per layer) in each layer's candidate order."""
    return [[float(row[op]) for op in cands] for row, cands in zip(rows, candidates, strict=True)]


def cost_range(rows: Sequence[Sequence[float]], fixed: float) -> tuple[float, float]:
    """The cheapest and dearest architecture's cost: what a relative (`0.6x`) target spans."""
    return fixed + sum(min(r) for r in rows), fixed + sum(max(r) for r in rows)


def predicted_cost(rows: Sequence[Sequence[float]], fixed: float, indices: Sequence[int]
                   ) -> float:
    """Σ_l rows[l][indices[l]] + fixed."""
    return fixed + sum(float(r[i]) for r, i in zip(rows, indices, strict=True))


class OpCosts:
    """An op-only space's costs: `rows[l][i]`, candidate i of layer l, plus a fixed cost."""

    def __init__(self, rows: Sequence[Sequence[float]], fixed: float):
        self.rows, self.fixed = [list(map(float, r)) for r in rows], float(fixed)

    def of(self, indices: Sequence[int]) -> float:
        """The cost of the architecture with these op choices (one per layer)."""
        return predicted_cost(self.rows, self.fixed, indices[:len(self.rows)])

    def bounds(self) -> tuple[float, float]:
        return cost_range(self.rows, self.fixed)

    def rows_at(self, widths: Sequence[int] = ()) -> tuple[list[list[float]], float]:
        """(rows, fixed): an op-only space has one choice of widths."""
        return self.rows, self.fixed
