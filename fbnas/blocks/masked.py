"""Candidates computed at the layer's widest shape with their channels masked: width search
(FBNetV2's channel masks, TuNAS's sampled ones; docs/widths.md).

A layer whose input or output width is searched computes every candidate at the widest
shape; the input already has zeros past its chosen width (the previous layer's mask), and
the layer's output is multiplied by the mask of its chosen width. Inside an inverted residual
block the expanded channels are c_in·e for the chosen c_in, so the block's own expanded
activations are masked too, after each BatchNorm (a BatchNorm turns a zero channel into its
bias). With one-hot width weights the path then computes exactly the child network of those
widths: a conv reading zeros is the conv sliced to the channels in use, and a BatchNorm
normalises each channel by its own batch statistics. Soft weights (`full`) mix the masks.

Maskable: plain IRF blocks (dense 1x1 convs, no squeeze-excite: their hidden width is c_in·e
and nothing pools across channels) and `skip`. Grouped 1x1 convs and channel shuffles are
laid out by the width itself, so they are not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fbnas.blocks.irf import parse_irf
from fbnas.errors import FbnasError


def maskable(op: str) -> bool:
    """Whether candidate `op` (canonical) can have its input and output widths searched."""
    if op == "skip":
        return True
    if not op.startswith("ir_"):
        return False
    try:
        spec = parse_irf(op)
    except FbnasError:
        return False
    return spec.groups == 1 and not spec.se


def expansion(op: str) -> int:
    """The hidden width's multiple of c_in (0: a candidate with no hidden activation)."""
    return 0 if op == "skip" else parse_irf(op).expansion


def choice_masks(channels: Sequence[int], total: int) -> torch.Tensor:
    """[len(channels), total] 0/1 rows: row j keeps the first channels[j] channels."""
    idx = torch.arange(total)
    return torch.stack([(idx < c).float() for c in channels])


def mix(weights: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """The channel mask Σ_j w_j · mask_j, a [C] vector."""
    return weights.to(masks.dtype) @ masks


def _batch_norm(bn: nn.BatchNorm2d, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`bn(x)` with its affine weight and bias multiplied by `scale` ([C], >= 0): the output
    times `scale` without touching the activation (and, ahead of a ReLU, the same value:
    ReLU(a·z) = a·ReLU(z) for a >= 0). BatchNorm2d's own forward otherwise: running statistics
    and num_batches_tracked updated alike."""
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


def _conv_bn(seq: nn.Sequential, x: torch.Tensor, mask: torch.Tensor | None,
             reads: torch.Tensor | None = None) -> torch.Tensor:
    """A conv -> BatchNorm [-> ReLU] sequence with its output channels masked by `mask`:
    folded into the BatchNorm's affine parameters where the mask needs no gradient (weight
    steps, scored θ steps) or no ReLU follows (mask·(γx̂+β) is the BatchNorm with γ·mask,
    β·mask, in value and gradient alike); else multiplied after the ReLU, so that the gradient
    of a masked-out channel's weight is what adding it would do, as FBNetV2's (folded ahead of
    the ReLU, a zero channel would pass it no gradient). `reads`: a mask of x's channels,
    folded into the conv's weight (conv(x·m) is the conv with its input channels scaled by m,
    in value and gradient alike), so that no masked copy of x is kept for backward."""
    conv, bn, *rest = seq
    y = conv(x) if reads is None else _conv_reading(conv, x, reads)
    if mask is None:
        y = bn(y)
    elif mask.requires_grad and rest:
        for m in (bn, *rest):
            y = m(y)
        return y * mask.to(y.dtype).view(1, -1, 1, 1)
    else:
        y = _batch_norm(bn, y, mask.to(bn.weight.dtype))
    for m in rest:
        y = m(y)
    return y


def _conv_reading(conv: nn.Module, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
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


def masked_branch(block: nn.Module, x: torch.Tensor, hidden: torch.Tensor | None,
                  out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The residual branch f(x) of a maskable candidate with its expanded channels masked by
    `hidden` after each normalisation and its output by `out` ([C] vectors; None: no mask);
    None for the identity. A `hidden` mask that needs a gradient (the relaxations' θ steps)
    is folded into the weights of the convs that read the expanded channels instead
    (`_conv_bn`'s `reads`): the same values and gradients, without a masked copy of each
    expanded activation kept for backward."""
    if not hasattr(block, "pwl"):  # skip: the identity (no branch) or its projection
        if getattr(block, "proj", None) is None:
            return None
        return _conv_bn(block.proj, x, out)
    if hidden is None or not hidden.requires_grad:
        h = _conv_bn(block.pw, x, hidden)
        for stage in block.dw:
            h = _conv_bn(stage, h, hidden)
        return _conv_bn(block.pwl, h, out)
    h = _conv_bn(block.pw, x, None)
    for stage in block.dw:
        h = _conv_bn(stage, h, None, reads=hidden)
    return _conv_bn(block.pwl, h, out, reads=hidden)
