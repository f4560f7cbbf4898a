"""Costs of a width-searched space: a layer's cost depends on its op, its own width and the
width of its input (the previous stage's), so costs are no longer one number per (layer, op).

`WidthCosts` holds, per layer, a [ops, input widths, output widths] tensor from the table
(every (op, c_in, c_out) the space can produce), the head's cost per width of the last stage
and the stem's. Width decisions are sampled independently of each other and of the ops, so
the expected cost under the decisions' weights is exact as

    Σ_l Σ_{o,i,j} m_l[o]·p_in(l)[i]·p_out(l)[j]·C_l[o,i,j] + Σ_j p_last[j]·head[j] + stem

(the product of the two adjacent width distributions, not a per-layer approximation that drops
their coupling); a layer inside a stage reads and writes the stage's one width, so only the
diagonal C_l[o, j, j] counts there. An architecture's cost, the space's cheapest and dearest
architecture and the fit onto a target all use the same tensors. The values come from a
latency or counted table (`fbnas.latency.resolve.width_costs`, keyed by
`fbnas.latency.signature.layer_width_signatures`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

from fbnas.errors import FbnasError
from fbnas.search_space import SearchSpace

# the most width combinations `bounds` enumerates (3 choices in each of 12 stages is 531,441)
MAX_WIDTH_COMBOS = 1_000_000


class WidthCosts(nn.Module):
    """Per-layer [ops, in, out] cost tensors of a width-searched space (see the module
    docstring); buffers only, so it moves with the supernet and is not saved in its state."""

    def __init__(self, space: SearchSpace, values: Sequence[dict], heads: Sequence[float],
                 stem: float):
        super().__init__()
        self.wiring = [(din, dout) for din, _, dout, _ in space.layer_widths()]
        self.n_widths = [len(space.width_choices(s)) for s in space.width_stages()]
        self.n_layers = len(self.wiring)
        for li, (la, row, (_, cin, _, cout)) in enumerate(zip(
                space.layers(), values, space.layer_widths(), strict=True)):
            ops = space.candidates(la)
            t = torch.full((len(ops), len(cin), len(cout)), math.nan, dtype=torch.float64)
            for (op, i, j), v in row.items():
                t[ops.index(op), i, j] = float(v)
            if self.wiring[li][0] is not None and self.wiring[li][0] == self.wiring[li][1]:
                t = torch.diagonal(t, dim1=1, dim2=2)  # [ops, widths]: one decision
            if torch.isnan(t).any() or (t < 0).any():
                raise FbnasError(f"cost table: layer {li} lacks a cost or has a negative one")
            self.register_buffer(f"layer_{li}", t.float(), persistent=False)
        self.head_dec = self.wiring[-1][1] if self.wiring else None
        self.register_buffer("head", torch.tensor([float(v) for v in heads]), persistent=False)
        self.stem = float(stem)
        # host copies for what is computed on the host (an architecture's cost, the fit, the
        # range): plain attributes, which .to(device) leaves where they are
        self._host = [t.double().clone() for t in self.tables()]
        self._host_head = [float(v) for v in heads]
        self._range: dict[str, tuple[float, list[int]]] = {}

    def tables(self) -> list[torch.Tensor]:
        return [getattr(self, f"layer_{li}") for li in range(self.n_layers)]

    # ---- the expected cost and an architecture's ---------------------------------------------
    def expected(self, m_ops: Sequence[torch.Tensor], m_widths: Sequence[torch.Tensor]
                 ) -> torch.Tensor:
        """The exact expected cost under per-layer op weights and per-decision width
        weights (soft, one-hot or probabilities), in float32 whatever autocast is on (a
        FLOPs table's counts would overflow float16)."""
        with torch.autocast(self.head.device.type, enabled=False):
            return self._expected([m.float() for m in m_ops], [w.float() for w in m_widths])

    def _expected(self, m_ops: Sequence[torch.Tensor], m_widths: Sequence[torch.Tensor]
                  ) -> torch.Tensor:
        total = self.head.new_tensor(self.stem)
        for (din, dout), t, m in zip(self.wiring, self.tables(), m_ops, strict=True):
            m = m.to(t.dtype)
            if din is not None and din == dout:
                total = total + m @ t @ m_widths[dout].to(t.dtype)
                continue
            p_in = m_widths[din].to(t.dtype) if din is not None else t.new_ones(1)
            p_out = m_widths[dout].to(t.dtype) if dout is not None else t.new_ones(1)
            total = total + torch.einsum("o,i,j,oij->", m, p_in, p_out, t)
        head = (self.head[0] if self.head_dec is None
                else m_widths[self.head_dec].to(self.head.dtype) @ self.head)
        return total + head

    def of(self, indices: Sequence[int]) -> float:
        """The cost of the architecture with these decision choices (ops, then widths)."""
        ops, widths = indices[:self.n_layers], indices[self.n_layers:]
        rows, fixed = self.rows_at(widths)
        return fixed + sum(r[o] for r, o in zip(rows, ops, strict=True))

    def rows_at(self, widths: Sequence[int]) -> tuple[list[list[float]], float]:
        """(rows, fixed): the per-(layer, op) costs and stem + head at one choice of widths,
        where costs are additive over layers again (what the op fit works on)."""
        rows = []
        for (din, dout), t in zip(self.wiring, self._host, strict=True):
            col = (t[:, widths[dout]] if din is not None and din == dout else
                   t[:, 0 if din is None else widths[din], 0 if dout is None else widths[dout]])
            rows.append(col.tolist())
        head = self._host_head[0 if self.head_dec is None else widths[self.head_dec]]
        return rows, self.stem + head

    def width_combos(self) -> list[tuple[int, ...]]:
        """Every choice of widths (at most MAX_WIDTH_COMBOS)."""
        n = math.prod(self.n_widths)
        if n > MAX_WIDTH_COMBOS:
            raise FbnasError(f"width search: {n} width combinations, more than the "
                             f"{MAX_WIDTH_COMBOS} the cost range and the fit go through")
        return list(itertools.product(*(range(k) for k in self.n_widths)))

    # ---- the space's range ------------------------------------------------------------------
    def _extremes(self, pick) -> tuple[float, list[int]]:
        """The cheapest (pick=min) or dearest (max) architecture: every width combination,
        each layer's best op under it (computed once: the tables do not change)."""
        if pick.__name__ in self._range:
            return self._range[pick.__name__]
        best: tuple[float, list[int]] | None = None
        for widths in self.width_combos():
            rows, total = self.rows_at(widths)
            ops = [r.index(pick(r)) for r in rows]
            total += sum(r[o] for r, o in zip(rows, ops, strict=True))
            if best is None or pick(total, best[0]) != best[0]:
                best = (total, [*ops, *widths])
        assert best is not None
        self._range[pick.__name__] = best
        return best

    def bounds(self) -> tuple[float, float]:
        return self._extremes(min)[0], self._extremes(max)[0]

    def dearest(self) -> list[int]:
        """The dearest architecture's decision choices (the sandwich rule's largest path)."""
        return list(self._extremes(max)[1])
