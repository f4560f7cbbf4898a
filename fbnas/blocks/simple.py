"""Non-IRF candidates: skip, and the reference implementation's basic_block and shift_5x5."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fbnas.blocks.common import ConvBN, conv_bn, make_divisible, times
from fbnas.blocks.registry import register_block
from fbnas.errors import FbnasError


class Skip(nn.Module):
    """Identity when shapes match, else a strided 1x1 conv + BN (so a layer can be 'removed')."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.has_skip = c_in == c_out and stride == 1
        self.proj = None if self.has_skip else ConvBN(c_in, c_out, 1, stride, relu=False)

    folds_scale = True  # forward's `scale` multiplies the projection (fbnas.supernet.MixedOp)

    def forward(self, x: torch.Tensor, shortcut: bool = True,
                scale: torch.Tensor | None = None, hidden: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor | None:
        """`shortcut=False` asks for the residual branch: the identity has none (None).
        `scale` multiplies the projection and `out` masks its channels (a width search),
        folded into its BatchNorm (the identity's output is neither: a has_skip block scales
        its branch only); `hidden` is unused (no expanded channels)."""
        if self.proj is None:
            return x if shortcut else None
        return conv_bn(self.proj, x, times(out, scale))


class CascadeConv3x3(nn.Module):
    """Two full 3x3 conv+BN (ReLU between), residual when shapes match."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.has_skip = c_in == c_out and stride == 1
        self.body = nn.Sequential(ConvBN(c_in, c_in, 3, stride), ConvBN(c_in, c_out, 3, relu=False))

    def forward(self, x: torch.Tensor, shortcut: bool = True) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.has_skip and shortcut else y


class Shift(nn.Module):
    """Zero-FLOP spatial shift: each channel moves to one offset of a KxK window (fixed weights)."""

    def __init__(self, channels: int, kernel: int, stride: int):
        super().__init__()
        self.stride, self.pad, self.channels = stride, kernel // 2, channels
        w = torch.zeros(channels, 1, kernel, kernel)
        centre = kernel * kernel // 2
        offsets = [centre] + [i for i in range(kernel * kernel) if i != centre]
        for c in range(channels):
            pos = offsets[c % len(offsets)]
            w[c, 0, pos // kernel, pos % kernel] = 1.0
        self.register_buffer("weight", w, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, None, self.stride, self.pad, groups=self.channels)


class ShiftBlock5x5(nn.Module):
    """1x1 conv+BN+ReLU -> 5x5 shift (stride) -> 1x1 conv+BN, residual when shapes match."""

    def __init__(self, c_in: int, c_out: int, stride: int, expansion: int = 1):
        super().__init__()
        self.has_skip = c_in == c_out and stride == 1
        mid = make_divisible(c_in * expansion, 8)
        self.body = nn.Sequential(ConvBN(c_in, mid, 1), Shift(mid, 5, stride),
                                  ConvBN(mid, c_out, 1, relu=False))

    def forward(self, x: torch.Tensor, shortcut: bool = True) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.has_skip and shortcut else y


def _no_kw(name: str, kw: dict) -> None:
    if kw:
        raise FbnasError(f"op '{name}': unexpected options {sorted(kw)}")


@register_block("skip")
def skip(c_in: int, c_out: int, stride: int, **kw) -> nn.Module:
    _no_kw("skip", kw)
    return Skip(c_in, c_out, stride)


@register_block("basic_block")
def basic_block(c_in: int, c_out: int, stride: int, **kw) -> nn.Module:
    _no_kw("basic_block", kw)
    return CascadeConv3x3(c_in, c_out, stride)


@register_block("shift_5x5")
def shift_5x5(c_in: int, c_out: int, stride: int, **kw) -> nn.Module:
    _no_kw("shift_5x5", kw)
    return ShiftBlock5x5(c_in, c_out, stride)
