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


def _conv_bn(seq: nn.Sequential, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """A conv -> BatchNorm [-> ReLU] sequence with its output channels masked: folded into
    the BatchNorm's affine parameters where the mask needs no gradient (weight steps, scored
    θ steps), else multiplied after (the gradient of a masked-out channel's weight is then
    what adding it would do, as FBNetV2's)."""
    if mask is None:
        return seq(x)
    conv, bn, *rest = seq
    if mask.requires_grad:
        y = seq(x)
        return y * mask.to(y.dtype).view(1, -1, 1, 1)
    y = _batch_norm(bn, conv(x), mask.to(bn.weight.dtype))
    for m in rest:
        y = m(y)
    return y


def masked_branch(block: nn.Module, x: torch.Tensor, hidden: torch.Tensor | None,
                  out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The residual branch f(x) of a maskable candidate with its expanded channels masked by
    `hidden` after each normalisation and its output by `out` ([C] vectors; None: no mask);
    None for the identity."""
    if not hasattr(block, "pwl"):  # skip: the identity (no branch) or its projection
        if getattr(block, "proj", None) is None:
            return None
        return _conv_bn(block.proj, x, out)
    h = _conv_bn(block.pw, x, hidden)
    for stage in block.dw:
        h = _conv_bn(stage, h, hidden)
    return _conv_bn(block.pwl, h, out)
