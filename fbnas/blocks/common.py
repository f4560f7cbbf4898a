"""Small layers shared by the candidate blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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


def scaled_batch_norm(bn: nn.BatchNorm2d, x: torch.Tensor, scale: torch.Tensor
                      ) -> torch.Tensor:
    """`bn(x)` with its affine weight and bias multiplied by `scale` (a [C] vector or a 0-d
    tensor): the output times `scale`, in value and gradient, without a multiply over the
    activation or a copy of it kept for backward (ahead of a ReLU the same value too where
    scale >= 0: ReLU(a·z) = a·ReLU(z)). Otherwise BatchNorm2d's own forward: running
    statistics and num_batches_tracked updated alike. The width masks (fbnas.blocks.masked)
    and a MixedOp's candidate weights m_i (fbnas.supernet) are folded through it (`conv_bn`)."""
    momentum = 0.0 if bn.momentum is None else bn.momentum
    if bn.training and bn.track_running_stats and bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        if bn.momentum is None:  # cumulative moving average
            momentum = 1.0 / float(bn.num_batches_tracked)
    use_batch = bn.training or (bn.running_mean is None and bn.running_var is None)
    track = not bn.training or bn.track_running_stats
    return F.batch_norm(x, bn.running_mean if track else None,
                        bn.running_var if track else None, bn.weight * scale,
                        bn.bias * scale, use_batch, momentum, bn.eps)


def conv_bn(seq: nn.Sequential, x: torch.Tensor, mask: torch.Tensor | None = None,
            reads: torch.Tensor | None = None) -> torch.Tensor:
    """A conv -> BatchNorm [-> ReLU] sequence (`ConvBN`, or a slice of a shared superkernel
    with its BatchNorm), as it is where `mask` and `reads` are None, else with its output
    channels masked by `mask` ([C], or a 0-d scale such as a MixedOp's m_i):
    folded into the BatchNorm's affine parameters where the mask needs no gradient (weight
    steps, scored θ steps) or no ReLU follows (mask·(γx̂+β) is the BatchNorm with γ·mask,
    β·mask, in value and gradient alike); else multiplied after the ReLU, so that the gradient
    of a masked-out channel's weight is what adding it would do, as FBNetV2's (folded ahead of
    the ReLU, a zero channel would pass it no gradient). `reads`: a mask of x's channels,
    folded into the conv's weight (conv(x·m) is the conv with its input channels scaled by m,
    in value and gradient alike), so that no masked copy of x is kept for backward."""
    conv, bn, *rest = seq
    y = conv(x) if reads is None else conv_reading(conv, x, reads)
    if mask is None:
        y = bn(y)
    elif mask.requires_grad and rest:
        for m in (bn, *rest):
            y = m(y)
        return y * mask.to(y.dtype).view(1, -1, 1, 1)
    else:
        y = scaled_batch_norm(bn, y, mask.to(bn.weight.dtype))
    for m in rest:
        y = m(y)
    return y


def conv_reading(conv: nn.Module, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """conv(x · m) for a per-channel mask m of x: a dense conv's weight scaled along its
    input channels, a depthwise one's along its (one-to-one) output channels."""
    if isinstance(conv, nn.Conv2d):
        w, bias, dilation = conv.weight, conv.bias, conv.dilation
    else:  # a slice of a shared superkernel (fbnas.blocks.shared)
        w, bias, dilation = conv.conv_weight(), None, 1
    m = m.to(w.dtype)
    if conv.groups == 1:
        w = w * m.view(1, -1, 1, 1)
    elif conv.groups == x.shape[1] == w.shape[0]:
        w = w * m.view(-1, 1, 1, 1)
    else:
        return conv(x * m.view(1, -1, 1, 1))
    return F.conv2d(x, w, bias, conv.stride, conv.padding, dilation, conv.groups)


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


def times(mask: torch.Tensor | None, scale: torch.Tensor | None) -> torch.Tensor | None:
    """An output mask times a scale, either of them None (not applied)."""
    if scale is None or mask is None:
        return mask if scale is None else scale
    return mask * scale.to(mask.dtype)


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
