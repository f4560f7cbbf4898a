"""The fixed part of a network: input, stem, stages (channels, repeats, stride) and head, the
shape inference that gives every searchable layer its (c_in, c_out, stride, H, W), and the
YAML reader shared by a space's `space:` section and an architecture's `macro:` (a space's
stages may also carry `candidates` and `widths`; fbnas.search_space).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fbnas.blocks import ConvBN, make_divisible
from fbnas.errors import FbnasError
from fbnas.io import show
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
