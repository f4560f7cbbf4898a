"""Search spaces from YAML, and the shape inference that turns them into layer specs.

A search space is a macro-architecture (input, stem, stages, head) plus candidate ops per
searchable layer. Every searchable layer's (c_in, c_out, stride, input HxW) is inferred here,
never typed by hand. The `space:` section of a config file looks like:

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

import torch
from torch import nn

from fbnas.blocks import ConvBN, canonical_op, make_divisible
from fbnas.blocks.masked import maskable
from fbnas.errors import FbnasError
from fbnas.io import load_yaml, show
from fbnas.settings import Fields

POOLS = ("avg", "max")
# Upper bounds on a macro-architecture's numbers: far above any real network (ImageNet models
# use <= 4096 channels, 224-512 px inputs, tens of layers), low enough that a typo or a fuzzed
# file fails here with a message instead of hanging shape inference or exhausting memory.
MAX_CHANNELS = 1 << 16
MAX_INPUT = 1 << 14
MAX_REPEATS = 1024
MAX_STRIDE = 64
MAX_KERNEL = 63
MAX_CLASSES = 1 << 20
MAX_LAYERS = 4096
# A space's name becomes part of file names (the latency table cache): no path separators.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")


@dataclass(frozen=True)
class StemSpec:
    channels: int
    stride: int = 2
    kernel: int = 3


@dataclass(frozen=True)
class StageSpec:
    channels: int
    repeats: int
    stride: int = 1


@dataclass(frozen=True)
class HeadSpec:
    channels: int
    pool: str = "avg"
    dropout: float = 0.0


@dataclass(frozen=True)
class LayerShape:
    """One searchable layer: where it sits and the shape its candidates see."""

    index: int
    stage: int
    position: int  # index within its stage
    c_in: int
    c_out: int
    stride: int
    h: int  # input height
    w: int  # input width

    @property
    def out_hw(self) -> tuple[int, int]:
        return (self.h - 1) // self.stride + 1, (self.w - 1) // self.stride + 1


@dataclass(frozen=True)
class MacroSpec:
    """The fixed part of a network: input, stem, stages (channels, repeats, stride), head."""

    input_size: tuple[int, int]
    num_classes: int
    stem: StemSpec
    stages: tuple[StageSpec, ...]
    head: HeadSpec
    in_channels: int = 3
    width_mult: float = 1.0

    # ---- channels after the width multiplier -------------------------------------------
    def scaled(self, c: int) -> int:
        return c if self.width_mult == 1.0 else make_divisible(c * self.width_mult, 8)

    @property
    def stem_channels(self) -> int:
        return self.scaled(self.stem.channels)

    @property
    def head_channels(self) -> int:
        # MobileNet convention: the last conv only widens, never narrows, with the multiplier.
        return self.scaled(self.head.channels) if self.width_mult > 1.0 else self.head.channels

    @property
    def num_layers(self) -> int:
        return sum(s.repeats for s in self.stages)

    # ---- shape inference ----------------------------------------------------------------
    def stem_shape(self) -> tuple[int, int, int, int, int]:
        """(c_in, c_out, stride, H, W) of the stem conv."""
        h, w = self.input_size
        return self.in_channels, self.stem_channels, self.stem.stride, h, w

    def layers(self, where: str = "space") -> tuple[LayerShape, ...]:
        """Infer every searchable layer's shape; raise if a stride meets a 1x1 map."""
        h, w = self.input_size
        if h < self.stem.stride or w < self.stem.stride:
            raise FbnasError(f"{where}.stem.stride: {self.stem.stride} on a {h}x{w} input "
                             "would leave less than 1x1")
        h, w = (h - 1) // self.stem.stride + 1, (w - 1) // self.stem.stride + 1
        c = self.stem_channels
        out: list[LayerShape] = []
        for si, st in enumerate(self.stages):
            c_out = self.scaled(st.channels)
            for pos in range(st.repeats):
                stride = st.stride if pos == 0 else 1
                if stride > 1 and (h < stride or w < stride):
                    raise FbnasError(
                        f"{where}.stages[{si}].stride: stride {stride} on a {h}x{w} map would "
                        "drive the resolution below 1x1")
                layer = LayerShape(len(out), si, pos, c, c_out, stride, h, w)
                out.append(layer)
                h, w = layer.out_hw
                c = c_out
        return tuple(out)

    def head_shape(self) -> tuple[int, int, int, int, int]:
        """(c_in, head channels, H, W, classes) of the head."""
        layers = self.layers()
        if layers:
            c, (h, w) = layers[-1].c_out, layers[-1].out_hw
        else:
            _, c, s, h0, w0 = self.stem_shape()
            h, w = (h0 - 1) // s + 1, (w0 - 1) // s + 1
        return c, self.head_channels, h, w, self.num_classes

    # ---- fixed modules ------------------------------------------------------------------
    def build_stem(self) -> nn.Module:
        c_in, c_out, stride, _, _ = self.stem_shape()
        return ConvBN(c_in, c_out, self.stem.kernel, stride)

    def build_head(self) -> nn.Module:
        c_in, c_head, _, _, classes = self.head_shape()
        return Head(c_in, c_head, classes, self.head.pool, self.head.dropout)

    # ---- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        h, w = self.input_size
        return {
            "input_size": h if h == w else [h, w],
            "in_channels": self.in_channels,
            "num_classes": self.num_classes,
            "width_mult": self.width_mult,
            "stem": {"channels": self.stem.channels, "stride": self.stem.stride,
                     "kernel": self.stem.kernel},
            "stages": [{"channels": s.channels, "repeats": s.repeats, "stride": s.stride}
                       for s in self.stages],
            "head": {"channels": self.head.channels, "pool": self.head.pool,
                     "dropout": self.head.dropout},
        }


class Head(nn.Module):
    """1x1 conv + BN + ReLU -> global pool -> dropout -> linear classifier."""

    def __init__(self, c_in: int, c_head: int, num_classes: int, pool: str = "avg",
                 dropout: float = 0.0):
        super().__init__()
        self.conv = ConvBN(c_in, c_head, 1)
        self.pool = nn.AdaptiveAvgPool2d(1) if pool == "avg" else nn.AdaptiveMaxPool2d(1)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fc = nn.Linear(c_head, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(torch.flatten(self.pool(self.conv(x)), 1)))


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


def first_difference(a: Any, b: Any, key: str) -> tuple[str, Any, Any]:
    """(key path, a's value, b's value) of the first place where `a` and `b` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{key}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{key}[{i}]")
    return key, a, b


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


def _hw(v: Any, where: str) -> tuple[int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v, v]
    if (not isinstance(v, list) or len(v) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)):
        raise FbnasError(f"{where}: expected an integer or [H, W], got {show(v)}")
    if min(v) < 1:
        raise FbnasError(f"{where}: must be positive, got {show(v)}")
    if max(v) > MAX_INPUT:
        raise FbnasError(f"{where}: must be <= {MAX_INPUT}, got {show(v)}")
    return int(v[0]), int(v[1])


def parse_macro(f: Fields, with_candidates: bool
                ) -> tuple[MacroSpec, list[list | None], list[tuple[float, ...]]]:
    """Read the macro keys from `f` (a space or an architecture's `macro`); with
    `with_candidates` (a space) also each stage's candidates and searched widths."""
    input_size = _hw(f.raw("input_size", required=True), f.at("input_size"))
    in_channels = f.int("in_channels", 3, min=1, max=MAX_CHANNELS)
    num_classes = f.int("num_classes", required=True, min=1, max=MAX_CLASSES)
    width_mult = f.float("width_mult", 1.0, gt=0.0, max=16.0)
    sf = f.sub("stem", required=True)
    stem = StemSpec(sf.int("channels", required=True, min=1, max=MAX_CHANNELS),
                    sf.int("stride", 2, min=1, max=MAX_STRIDE),
                    sf.int("kernel", 3, min=1, max=MAX_KERNEL))
    if stem.kernel % 2 == 0:
        raise FbnasError(f"{sf.at('kernel')}: must be odd, got {stem.kernel}")
    sf.done()
    stages: list[StageSpec] = []
    per_stage: list[list | None] = []
    widths: list[tuple[float, ...]] = []
    for i, sd in enumerate(f.list("stages", required=True, nonempty=True)):
        g = Fields(sd, f"{f.at('stages')}[{i}]")
        stages.append(StageSpec(g.int("channels", required=True, min=1, max=MAX_CHANNELS),
                                g.int("repeats", 1, min=1, max=MAX_REPEATS),
                                g.int("stride", 1, min=1, max=MAX_STRIDE)))
        per_stage.append(g.list("candidates", None, nonempty=True) if with_candidates else None)
        widths.append(_widths(g.list("widths", None, nonempty=True), g.at("widths"))
                      if with_candidates else ())
        g.done()
    layers = sum(s.repeats for s in stages)
    if layers > MAX_LAYERS:
        raise FbnasError(f"{f.at('stages')}: {layers} searchable layers, more than the "
                         f"{MAX_LAYERS} allowed")
    hf = f.sub("head", required=True)
    head = HeadSpec(hf.int("channels", required=True, min=1, max=MAX_CHANNELS),
                    hf.str("pool", "avg", choices=POOLS),
                    hf.float("dropout", 0.0, min=0.0, max=0.99))
    hf.done()
    macro = MacroSpec(input_size, num_classes, stem, tuple(stages), head, in_channels, width_mult)
    return macro, per_stage, widths


def _widths(v: list | None, where: str) -> tuple[float, ...]:
    """A stage's `widths`: multipliers in (0, 1], listed once each, 1.0 among them."""
    if v is None:
        return ()
    out = []
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x <= 1:
            raise FbnasError(f"{where}[{i}]: expected a width multiplier in (0, 1], got {show(x)}")
        if float(x) in out:
            raise FbnasError(f"{where}[{i}]: {show(x)} is listed twice")
        out.append(float(x))
    if 1.0 not in out:
        raise FbnasError(f"{where}: {show(v)} lacks 1.0 (the stage's `channels`, the widest "
                         "choice: the supernet's width)")
    return tuple(sorted(out))


def load_space(path: str | Path) -> SearchSpace:
    """Load the `space:` section of a config file."""
    data = load_yaml(path)
    if "space" not in data:
        raise FbnasError(f"{path}: missing key 'space' (the search space section)")
    return SearchSpace.from_dict(data["space"], f"{path}: space")
