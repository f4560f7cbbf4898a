"""Inverted-residual (IRF) blocks, the FBNet candidates, parsed from their op names.

Grammar (tokens after `ir`, separated by `_`, `k` first, the rest in any order):
  k{K}      depthwise kernel K in {1, 3, 5, 7}; `k33`/`k55`/`k77` = two cascaded KxK depthwise
  e{E}      expansion ratio (default 1)
  g{G}      grouped 1x1 convs (G in {2, 4, 8}) with a channel shuffle between them;
            `s{G}` is the reference implementation's spelling (its `ir_k3_s2` is e1 g2;
            its `ir_k3_s4` / `ir_k5_s4` are registered aliases for e4 g4, as it builds them)
  sep       cascaded depthwise (the reference's `ir_k3_sep` = `ir_k33_e1`)
  se        squeeze-and-excite on the expanded channels
Canonical form: `ir_k{K}[K]_e{E}[_g{G}][_se]`, e.g. `ir_k5_e1_g2`, `ir_k33_e6_se`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from fbnas.blocks.common import ChannelShuffle, ConvBN, SqueezeExcite, conv_bn, times
from fbnas.blocks.registry import register_alias, register_family
from fbnas.errors import FbnasError

KERNELS = (1, 3, 5, 7)
GROUPS = (1, 2, 4, 8)
MAX_EXPANSION = 16


@dataclass(frozen=True)
class IRFSpec:
    kernel: int
    expansion: int = 1
    groups: int = 1
    cascade: bool = False
    se: bool = False

    @property
    def name(self) -> str:
        k = f"{self.kernel}{self.kernel}" if self.cascade else f"{self.kernel}"
        g = f"_g{self.groups}" if self.groups > 1 else ""
        return f"ir_k{k}_e{self.expansion}{g}{'_se' if self.se else ''}"


_TOKEN = re.compile(r"^(k|e|g|s)([0-9]{1,4})$")  # ASCII digits, a few at most


def parse_irf(name: str) -> IRFSpec:
    """Parse an `ir_...` op name into an IRFSpec; raise FbnasError naming the bad part."""
    parts = name.split("_")
    if parts[0] != "ir" or len(parts) < 2:
        raise FbnasError(f"op '{name}': inverted-residual ops look like ir_k3_e6")
    fields: dict[str, object] = {}
    for tok in parts[1:]:
        m = _TOKEN.match(tok)
        if tok in ("sep", "se"):
            key, val = ("cascade", True) if tok == "sep" else ("se", True)
        elif m:
            letter, digits = m.groups()
            key = {"k": "kernel", "e": "expansion", "g": "groups", "s": "groups"}[letter]
            val = digits
        else:
            raise FbnasError(f"op '{name}': cannot parse '{tok}' (expected k#, e#, g#, sep or se)")
        if key in fields and not (key == "cascade" and fields.get(key) is True):
            raise FbnasError(f"op '{name}': '{tok}' repeats an earlier setting")
        fields[key] = val
    if "kernel" not in fields or parts[1][0] != "k":
        raise FbnasError(f"op '{name}': the kernel size k# must come first (e.g. ir_k3_e6)")
    kdigits = str(fields["kernel"])
    if len(kdigits) == 2 and kdigits[0] == kdigits[1]:
        fields["kernel"], fields["cascade"] = kdigits[0], True
    kernel = int(fields["kernel"])
    if kernel not in KERNELS:
        raise FbnasError(f"op '{name}': kernel {fields['kernel']} not in {KERNELS}")
    expansion = int(fields.get("expansion", 1))
    if not 1 <= expansion <= MAX_EXPANSION:
        raise FbnasError(f"op '{name}': expansion {expansion} not in 1..{MAX_EXPANSION}")
    groups = int(fields.get("groups", 1))
    if groups not in GROUPS:
        raise FbnasError(f"op '{name}': groups {groups} not in {GROUPS}")
    return IRFSpec(kernel, expansion, groups, bool(fields.get("cascade")), bool(fields.get("se")))


class IRFForward(nn.Module):
    """The inverted-residual forward, written once and elastic: `pw` (1x1 expand, BN, ReLU),
    `shuffle`, `dw` (KxK depthwise, BN, ReLU), `se`, `pwl` (1x1 project, BN), and the shortcut
    where `has_skip`. A block supplies those modules: its own convs (`IRFBlock`, the child) or
    slices of a layer's superkernel (`fbnas.blocks.shared.SlicedIRF`); the width search masks
    its channels through the same forward (`hidden`, `out`: fbnas.blocks.masked)."""

    has_skip: bool
    folds_scale = True  # forward's `scale` multiplies f(x) (fbnas.supernet.MixedOp)

    def forward(self, x: torch.Tensor, shortcut: bool = True,
                scale: torch.Tensor | None = None, hidden: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """x + f(x) when the shapes match, else f(x); `shortcut=False` gives f(x) alone (the
        residual branch, which a MixedOp mixes under one shared shortcut). `scale` (a 0-d
        tensor, a MixedOp's m_i) multiplies f(x), folded into the last BatchNorm's affine
        (no ReLU follows it): the value and gradients of scale · f(x) without a multiply over
        the activation. `hidden`, `out`: width masks ([C]) of the expanded channels, applied
        after each of their normalisations, and of the output (a maskable block: no grouped
        1x1, no squeeze-excite; fbnas.blocks.masked); a `hidden` that needs a gradient is
        folded into the convs reading the expanded channels instead (`conv_bn`'s `reads`)."""
        reads = hidden if hidden is not None and hidden.requires_grad else None
        after = None if reads is not None else hidden
        h = self.shuffle(conv_bn(self.pw, x, after))
        return self.finish(x, conv_bn(self.dw[0], h, after, reads), shortcut, scale, hidden,
                           out)

    def finish(self, x: torch.Tensor, h: torch.Tensor, shortcut: bool = True,
               scale: torch.Tensor | None = None, hidden: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """`forward` from `h`, the activation after the first depthwise stage (where a layer
        computed several candidates' stages up to there together: fbnas.blocks.batched)."""
        reads = hidden if hidden is not None and hidden.requires_grad else None
        after = None if reads is not None else hidden
        y = conv_bn(self.pwl, self.to_projection(h, after, reads), times(out, scale), reads)
        return x + y if self.has_skip and shortcut else y

    def to_projection(self, h: torch.Tensor, after: torch.Tensor | None = None,
                      reads: torch.Tensor | None = None) -> torch.Tensor:
        """The projection's input from `h` (after the first depthwise stage): a cascade's
        second depthwise stage, then squeeze-excite."""
        for stage in list(self.dw)[1:]:
            h = conv_bn(stage, h, after, reads)
        return self.se(h)


class IRFBlock(IRFForward):
    """1x1 expand -> BN -> ReLU -> KxK depthwise (stride) -> BN -> ReLU -> 1x1 project -> BN."""

    def __init__(self, c_in: int, c_out: int, stride: int, spec: IRFSpec):
        super().__init__()
        g = spec.groups
        mid = c_in * spec.expansion
        for what, c in (("c_in", c_in), ("c_out", c_out)):
            if c % g:
                raise FbnasError(f"op '{spec.name}': {what}={c} is not divisible by groups {g}")
        self.has_skip = c_in == c_out and stride == 1
        # The expand conv exists even at e1, as in the reference implementation.
        self.pw = ConvBN(c_in, mid, 1, groups=g)
        self.shuffle = ChannelShuffle(g) if g > 1 else nn.Identity()
        dw: list[nn.Module] = [ConvBN(mid, mid, spec.kernel, stride, groups=mid)]
        if spec.cascade:
            dw.append(ConvBN(mid, mid, spec.kernel, 1, groups=mid))
        self.dw = nn.Sequential(*dw)
        self.se = SqueezeExcite(mid) if spec.se else nn.Identity()
        self.pwl = ConvBN(mid, c_out, 1, groups=g, relu=False)


def _parse(name: str):
    spec = parse_irf(name)
    factory = partial(_build_irf, spec)
    factory.spec = spec  # what the op is (registry.op_spec), for code that must not parse names
    return spec.name, factory


def _build_irf(spec: IRFSpec, c_in: int, c_out: int, stride: int, **kw) -> nn.Module:
    if kw:
        raise FbnasError(f"op '{spec.name}': unexpected options {sorted(kw)}")
    return IRFBlock(c_in, c_out, stride, spec)


_EXAMPLES = [
    IRFSpec(k, e).name for k in KERNELS for e in (1, 3, 4, 6)
] + [
    "ir_k3_e1_g2", "ir_k5_e1_g2", "ir_k3_e4_g4", "ir_k3_e6_se", "ir_k5_e3_g2_se",
    "ir_k33_e1", "ir_k33_e3", "ir_k33_e6", "ir_k77_e6",
]
register_family("ir", _parse, _EXAMPLES)
# The reference implementation's `shuffle` primitive: k3, grouped 1x1 (4 groups) with shuffle.
register_alias("shuffle", "ir_k3_e1_g4")
# In the reference, `ir_k3_s2` is e1 with 2 groups but `ir_k3_s4` is e4 with 4 groups.
for _k in (3, 5):
    for _se in ("", "_se"):
        register_alias(f"ir_k{_k}_s4{_se}", f"ir_k{_k}_e4_g4{_se}")
