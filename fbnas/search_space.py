"""Search spaces from YAML: a macro-architecture plus candidate ops per stage, and the widths
a stage searches.

A search space is a macro-architecture (input, stem, stages, head; fbnas.macro, whose shape
inference gives every searchable layer its (c_in, c_out, stride, input HxW), never typed by
hand) plus candidate ops per searchable layer. The `space:` section of a config file looks
like:

    space:
      name: fbnet_cifar10
      input_size: 32            # or [H, W]
      in_channels: 3
      num_classes: 10
      width_mult: 1.0
      stem: {channels: 16, stride: 1}
      candidates: [ir_k3_e1, ir_k3_e1_g2, ir_k3_e3, ...]   # for every stage ...
      stages:
        - {channels: 16, repeats: 1, stride: 1}
        - {channels: 24, repeats: 4, stride: 2, candidates: [...]}   # ... or per stage
        - {channels: 32, repeats: 3, stride: 2, widths: [0.5, 0.75, 1.0]}  # searched width
      width_divisor: 8          # a searched width is rounded to a multiple of this
      head: {channels: 1504, pool: avg, dropout: 0.0}

A stage with `widths` has its output channels searched (FBNetV2, TuNAS; docs/widths.md): the
choices are `channels` times each multiplier, rounded to `width_divisor`, the largest 1.0 (the
supernet's width). All layers of a stage share the choice (their residual shortcuts add
tensors of the stage's width). Every stage's width is one more decision beside the layers' op
choices (`decision_candidates`); an architecture of the space carries its widths as its macro's
stage channels, so a child network is a plain network of those widths.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fbnas.blocks import canonical_op, make_divisible
from fbnas.blocks.masked import maskable
from fbnas.errors import FbnasError
from fbnas.io import load_config_data, show
from fbnas.macro import MAX_CHANNELS, LayerShape, MacroSpec, first_difference, parse_macro
from fbnas.settings import Fields, check_sections

# A space's name becomes part of file names (the latency table cache): no path separators.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")


@dataclass(frozen=True)
class SearchSpace:
    """A macro-architecture plus candidate ops (canonical names) for each searchable layer,
    and the width choices of the stages whose widths are searched (the macro is the widest)."""

    name: str
    macro: MacroSpec
    stage_candidates: tuple[tuple[str, ...], ...]  # one tuple of ops per stage
    # per stage: the width multipliers searched (ascending, the last 1.0), or () when fixed
    stage_widths: tuple[tuple[float, ...], ...] = ()
    width_divisor: int = 8

    # ---- widths (docs/widths.md) --------------------------------------------------------
    def width_choices(self, stage: int) -> tuple[int, ...]:
        """The output channel counts stage `stage` may take (before the macro's width_mult),
        ascending; one when its width is not searched."""
        c = self.macro.stages[stage].channels
        mults = self.stage_widths[stage] if self.stage_widths else ()
        if not mults:
            return (c,)
        return tuple(c if m == 1.0 else make_divisible(c * m, self.width_divisor) for m in mults)

    def width_stages(self) -> list[int]:
        """The stages whose width is searched, in order: one decision each."""
        return [s for s in range(len(self.macro.stages)) if len(self.width_choices(s)) > 1]

    @property
    def searches_widths(self) -> bool:
        return bool(self.width_stages())

    def layer_widths(self) -> list[tuple[int | None, tuple[int, ...], int | None, tuple[int, ...]]]:
        """Per searchable layer: (the width decision its input comes from, the input channel
        choices, the decision of its output, the output channel choices), a decision as an
        index into `width_stages()` (None: fixed, one choice); channels after width_mult."""
        ws = self.width_stages()
        dec = {s: k for k, s in enumerate(ws)}
        scaled = [tuple(self.macro.scaled(c) for c in self.width_choices(s))
                  for s in range(len(self.macro.stages))]
        out = []
        prev: tuple[int | None, tuple[int, ...]] = (None, (self.macro.stem_channels,))
        for la in self.layers():
            here = (dec.get(la.stage), scaled[la.stage])
            out.append((*prev, *here))
            prev = here
        return out

    def _check_widths(self, where: str) -> None:
        """Refuse what a width search cannot mask: a candidate other than plain IRF or skip in
        a layer whose width changes, or a residual shortcut that exists at some widths only."""
        for la, (din, cin, dout, cout) in zip(self.layers(), self.layer_widths(), strict=True):
            if din is None and dout is None:
                continue
            key = f"{where}.stages[{la.stage}]"
            for op in self.candidates(la):
                if not maskable(op):
                    raise FbnasError(f"{key}: layer {la.index} op '{op}' cannot have its width "
                                     "searched (only plain IRF blocks, no groups or SE, and "
                                     "skip); remove it or the widths")
            pairs = zip(cin, cout, strict=True) if din == dout else (
                (ci, co) for ci in cin for co in cout)  # one decision: its own widths match
            same = {ci == co for ci, co in pairs} if la.stride == 1 else {False}
            if len(same) > 1:
                raise FbnasError(f"{key}.widths: layer {la.index} keeps its shape at some "
                                 f"widths ({', '.join(map(str, cin))} in, "
                                 f"{', '.join(map(str, cout))} out) and not at others, so its "
                                 "residual shortcut would come and go; choose widths whose "
                                 "input and output counts never (or always) match")

    def width_labels(self, stage: int) -> tuple[str, ...]:
        """How a stage's width choices are named (plots, θ dumps): `c16`."""
        return tuple(f"c{c}" for c in self.width_choices(stage))

    def decision_candidates(self) -> list[tuple[str, ...]]:
        """Every decision of an architecture in θ's order: each layer's ops, then each
        searched stage's widths (`width_labels`)."""
        return [*self.layer_candidates(), *(self.width_labels(s) for s in self.width_stages())]

    def arch_macro(self, width_indices: Sequence[int] = ()) -> MacroSpec:
        """The macro of the architecture taking width choice `width_indices[k]` in the k-th
        searched stage (none: the widest, the supernet's)."""
        stages = list(self.macro.stages)
        ws = self.width_stages()
        if len(width_indices) not in (0, len(ws)):
            raise FbnasError(f"space '{self.name}': {len(width_indices)} width choices for "
                             f"{len(ws)} searched stages")
        for s, i in zip(ws, width_indices, strict=False):
            stages[s] = dataclasses.replace(stages[s], channels=self.width_choices(s)[i])
        return dataclasses.replace(self.macro, stages=tuple(stages))

    def width_indices(self, macro: MacroSpec, where: str = "architecture") -> list[int]:
        """Which width choice `macro` takes in each searched stage; raises, naming the first
        differing key, unless `macro` is this space's macro at some choice of widths."""
        if len(macro.stages) == len(self.macro.stages):
            for s, st in enumerate(macro.stages):
                choices = self.width_choices(s)
                if st.channels not in choices:
                    has = (f"width choices {', '.join(map(str, choices))}" if len(choices) > 1
                           else show(choices[0]))
                    raise FbnasError(f"{where}: macro.stages[{s}].channels is {st.channels} but "
                                     f"search space '{self.name}' has {has}")
            widest = dataclasses.replace(macro, stages=tuple(
                dataclasses.replace(st, channels=mine.channels)
                for st, mine in zip(macro.stages, self.macro.stages, strict=True)))
        else:
            widest = macro
        if widest != self.macro:
            key, mine, theirs = first_difference(widest.to_dict(), self.macro.to_dict(), "macro")
            raise FbnasError(f"{where}: {key} is {show(mine)} but search space "
                             f"'{self.name}' has {show(theirs)}")
        return [self.width_choices(s).index(macro.stages[s].channels)
                for s in self.width_stages()]

    def layers(self) -> tuple[LayerShape, ...]:
        return self.macro.layers(self.name)

    def candidates(self, layer: int | LayerShape) -> tuple[str, ...]:
        stage = layer.stage if isinstance(layer, LayerShape) else self.layers()[layer].stage
        return self.stage_candidates[stage]

    def layer_candidates(self) -> list[tuple[str, ...]]:
        return [self.stage_candidates[la.stage] for la in self.layers()]

    @property
    def num_layers(self) -> int:
        return self.macro.num_layers

    def size(self) -> int:
        """Number of distinct architectures in the space."""
        n = 1
        for cands in self.decision_candidates():
            n *= len(cands)
        return n

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, **self.macro.to_dict()}
        shared = self.stage_candidates[0] if self.stage_candidates else ()
        if all(c == shared for c in self.stage_candidates):
            d["candidates"] = list(shared)
        else:
            for sd, c in zip(d["stages"], self.stage_candidates, strict=True):
                sd["candidates"] = list(c)
        for sd, w in zip(d["stages"], self.stage_widths, strict=False):
            if w:
                sd["widths"] = list(w)
        if self.searches_widths:
            d["width_divisor"] = self.width_divisor
        return d

    @classmethod
    def from_dict(cls, data: Any, where: str = "space") -> SearchSpace:
        f = Fields(data, where)
        name = f.str("name", required=True)
        if not NAME_RE.match(name):
            raise FbnasError(f"{f.at('name')}: {show(name)} is not a valid space name (letters, "
                             "digits and . _ + - only, at most 100, it names files)")
        default_cands = f.list("candidates", None, nonempty=True)
        divisor = f.int("width_divisor", 8, min=1, max=MAX_CHANNELS)
        macro, per_stage, widths = parse_macro(f, with_candidates=True)
        f.done()
        cands: list[tuple[str, ...]] = []
        for si, c in enumerate(per_stage):
            if c is None and default_cands is None:
                raise FbnasError(f"{where}.stages[{si}]: no candidates (set {where}.candidates "
                                 "or the stage's own candidates)")
            key = f"{where}.stages[{si}].candidates" if c is not None else f"{where}.candidates"
            cands.append(_canonical_list(c if c is not None else default_cands, key))
        space = cls(name, macro, tuple(cands), tuple(widths), divisor)
        macro.layers(where)  # shape-inference errors surface at load time, naming the file
        for si in space.width_stages():
            # as the layers see them: after the macro's width_mult, which rounds again
            got = tuple(macro.scaled(c) for c in space.width_choices(si))
            if sorted(set(got)) != list(got):  # a duplicate, or one rounded above the widest
                raise FbnasError(f"{where}.stages[{si}].widths: {show(list(widths[si]))} of "
                                 f"{macro.stages[si].channels} channels round to "
                                 f"{', '.join(map(str, got))} (a multiple of width_divisor "
                                 f"{divisor}): not distinct and below the widest; use a smaller "
                                 f"{where}.width_divisor")
        space._check_widths(where)
        return space


def _canonical_list(ops: list[Any], where: str) -> tuple[str, ...]:
    out: list[str] = []
    for i, op in enumerate(ops):
        if not isinstance(op, str):
            raise FbnasError(f"{where}[{i}]: expected an op name, got {show(op)}")
        try:
            c = canonical_op(op)
        except FbnasError as e:
            raise FbnasError(f"{where}[{i}]: {e}") from None
        if c in out:
            raise FbnasError(f"{where}[{i}]: op '{op}' is listed twice (as '{c}')")
        out.append(c)
    return tuple(out)


def load_space(path: str | Path) -> SearchSpace:
    """Load the `space:` section of a config file (or of the shipped config of that name)."""
    path, data = load_config_data(path)
    check_sections(data, str(path))
    if "space" not in data:
        raise FbnasError(f"{path}: missing key 'space' (the search space section)")
    return SearchSpace.from_dict(data["space"], f"{path}: space")
