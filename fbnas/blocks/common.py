"""Small layers shared by the candidate blocks."""

from __future__ import annotations

import torch
from torch import nn


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round a channel count to a multiple of `divisor`, never dropping more than 10%."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBN(nn.Sequential):
    """Conv2d (no bias) -> BatchNorm2d -> optional ReLU, padding kernel // 2."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, stride: int = 1,
                 groups: int = 1, relu: bool = True):
        layers: list[nn.Module] = [
            nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(c_out),
        ]
        if relu:
            layers.append(nn.ReLU(inplace=True))
        super().__init__(*layers)


class ChannelShuffle(nn.Module):
    """Interleave channels across `groups` (ShuffleNet), so grouped 1x1 convs mix groups."""

    def __init__(self, groups: int):
        super().__init__()
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        g = self.groups
        return x.view(n, g, c // g, h, w).transpose(1, 2).reshape(n, c, h, w)


class SqueezeExcite(nn.Module):
    """Squeeze-and-excite: global pool -> 1x1 reduce -> ReLU -> 1x1 expand -> hard-sigmoid gate."""

    def __init__(self, channels: int, reduction: int = 4):
        super().__init__()
        mid = make_divisible(channels / reduction, 8)
        self.reduce = nn.Conv2d(channels, mid, 1)
        self.act = nn.ReLU(inplace=True)
        self.expand = nn.Conv2d(mid, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * self.gate(self.expand(self.act(self.reduce(s))))


def init_weights(module: nn.Module) -> None:
    """Kaiming-normal (fan_out) convs, unit BN, N(0, 0.01) classifier: the MobileNet recipe."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            if m.weight.requires_grad:
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)
