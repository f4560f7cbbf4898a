"""Block signatures: what a latency (or FLOPs, or params) table is keyed by.

An entry is identified by what it computes, never by where it sits in a network: a searchable
block by (op, c_in, c_out, stride, H, W), the stem by (kernel, c_in, c_out, stride, H, W), the
head by (pool, c_in, c_head, H, W, classes). Batch size, dtype and memory format are properties
of the whole table (its `meta`), checked when a table is loaded for a run.

Keys are short readable strings, e.g. `ir_k3_e6 c16-24 s1 32x32`, `stem k3 c3-16 s1 32x32`,
`head avg c352-1504 4x4 cls10`.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from fbnas.blocks import ConvBN, build_block, canonical_op, init_weights
from fbnas.errors import FbnasError
from fbnas.macro import Head, MacroSpec
from fbnas.search_space import SearchSpace
from fbnas.settings import Fields

KINDS = ("block", "stem", "head")


@dataclass(frozen=True)
class Signature:
    """What one table entry measures. `op` is the canonical op (block), `k{K}` (stem) or the
    pool kind (head); `classes` is used by the head only."""

    kind: str
    op: str
    c_in: int
    c_out: int
    stride: int
    h: int
    w: int
    classes: int = 0

    def key(self) -> str:
        if self.kind == "block":
            return f"{self.op} c{self.c_in}-{self.c_out} s{self.stride} {self.h}x{self.w}"
        if self.kind == "stem":
            return f"stem {self.op} c{self.c_in}-{self.c_out} s{self.stride} {self.h}x{self.w}"
        return f"head {self.op} c{self.c_in}-{self.c_out} {self.h}x{self.w} cls{self.classes}"

    def __str__(self) -> str:
        return self.key()

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the input this entry is timed on."""
        return self.c_in, self.h, self.w

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.kind != "head":
            d.pop("classes")
        return d

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Signature:
        f = Fields(data, where)
        kind = f.str("kind", required=True, choices=KINDS)
        sig = cls(kind, f.str("op", required=True), f.int("c_in", required=True, min=1),
                  f.int("c_out", required=True, min=1), f.int("stride", 1, min=1),
                  f.int("h", required=True, min=1), f.int("w", required=True, min=1),
                  f.int("classes", 0, min=0))
        f.done()
        if kind == "block":
            try:
                canon = canonical_op(sig.op)
            except FbnasError as e:
                raise FbnasError(f"{where}.op: {e}") from None
            if canon != sig.op:
                raise FbnasError(f"{where}.op: '{sig.op}' is not canonical (write '{canon}')")
        if kind == "head" and sig.classes < 1:
            raise FbnasError(f"{where}.classes: a head entry needs classes >= 1")
        return sig

    def build(self) -> nn.Module:
        """The module this signature times, with the MobileNet weight init of a child net."""
        if self.kind == "block":
            m = build_block(self.op, self.c_in, self.c_out, self.stride)
        elif self.kind == "stem":
            m = ConvBN(self.c_in, self.c_out, int(self.op[1:]), self.stride)
        else:
            m = Head(self.c_in, self.c_out, self.classes, self.op)
        init_weights(m)
        return m


def block_signature(op: str, c_in: int, c_out: int, stride: int, h: int, w: int) -> Signature:
    """The signature of a searchable block (op spelled any accepted way)."""
    return Signature("block", canonical_op(op), c_in, c_out, stride, h, w)


def stem_signature(macro: MacroSpec) -> Signature:
    c_in, c_out, stride, h, w = macro.stem_shape()
    return Signature("stem", f"k{macro.stem.kernel}", c_in, c_out, stride, h, w)


def head_signature(macro: MacroSpec) -> Signature:
    c_in, c_head, h, w, classes = macro.head_shape()
    return Signature("head", macro.head.pool, c_in, c_head, 1, h, w, classes)


def layer_signatures(space: SearchSpace) -> list[dict[str, Signature]]:
    """One mapping op -> signature per searchable layer of `space`."""
    return [{op: block_signature(op, la.c_in, la.c_out, la.stride, la.h, la.w)
             for op in space.candidates(la)} for la in space.layers()]


def space_signatures(space: SearchSpace) -> list[Signature]:
    """Every distinct signature `space` needs (stem, blocks in layer order, head; with
    searched widths every (op, c_in, c_out) and head width they produce), each once."""
    out: dict[Signature, None] = {stem_signature(space.macro): None}
    for row in layer_signatures(space):
        for sig in row.values():
            out.setdefault(sig, None)
    out.setdefault(head_signature(space.macro), None)
    if space.searches_widths:
        for sig in width_signatures(space):
            out.setdefault(sig, None)
    return list(out)


def layer_width_signatures(space: SearchSpace
                           ) -> tuple[list[dict[tuple[str, int, int], Signature]], list[Signature]]:
    """Per layer: {(op, i, j): Signature} for every op and (input, output) width choice;
    and per choice of the last stage's width, the head's signature."""
    layers = space.layers()
    rows = []
    for la, (din, cin, dout, cout) in zip(layers, space.layer_widths(), strict=True):
        h, w = la.h, la.w
        row = {}
        for (i, ci), (j, co) in itertools.product(enumerate(cin), enumerate(cout)):
            if din is not None and din == dout and i != j:
                continue  # one decision: the input and output widths are the same choice
            for op in space.candidates(la):
                row[(op, i, j)] = block_signature(op, ci, co, la.stride, h, w)
        rows.append(row)
    last = space.layer_widths()[-1][2:] if layers else (None, ())
    heads = []
    for j in range(max(1, len(last[1]))):
        widths = [0] * len(space.width_stages())
        if last[0] is not None:
            widths = [len(space.width_choices(s)) - 1 for s in space.width_stages()]
            widths[last[0]] = j
        heads.append(head_signature(space.arch_macro(widths)))
    return rows, heads


def width_signatures(space: SearchSpace) -> list[Signature]:
    """Every signature a width-searched space needs beyond the stem (blocks, heads), once."""
    rows, heads = layer_width_signatures(space)
    out: dict[Signature, None] = {}
    for row in rows:
        for sig in row.values():
            out.setdefault(sig, None)
    for sig in heads:
        out.setdefault(sig, None)
    return list(out)



def arch_signatures(arch) -> list[Signature]:
    """Signatures of an Architecture's stem, chosen blocks (in order) and head."""
    layers = arch.macro.layers(arch.name)
    blocks = [block_signature(op, la.c_in, la.c_out, la.stride, la.h, la.w)
              for op, la in zip(arch.ops, layers, strict=True)]
    return [stem_signature(arch.macro), *blocks, head_signature(arch.macro)]
