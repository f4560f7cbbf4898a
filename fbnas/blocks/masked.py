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
from torch import nn

from fbnas.blocks.irf import IRFSpec
from fbnas.blocks.registry import op_spec
from fbnas.errors import FbnasError


def maskable(op: str) -> bool:
    """Whether candidate `op` can have its input and output widths searched: `skip`, and
    IRF blocks without groups or SE (`registry.op_spec`, not the name, says what it is)."""
    if op == "skip":
        return True
    try:
        spec = op_spec(op)
    except FbnasError:
        return False
    return isinstance(spec, IRFSpec) and spec.groups == 1 and not spec.se


def expansion(op: str) -> int:
    """The hidden width's multiple of c_in (0: a candidate with no hidden activation, `skip`)."""
    spec = op_spec(op)
    return spec.expansion if isinstance(spec, IRFSpec) else 0


def choice_masks(channels: Sequence[int], total: int) -> torch.Tensor:
    """[len(channels), total] 0/1 rows: row j keeps the first channels[j] channels."""
    idx = torch.arange(total)
    return torch.stack([(idx < c).float() for c in channels])


def mix(weights: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """The channel mask Σ_j w_j · mask_j, a [C] vector."""
    return weights.to(masks.dtype) @ masks


def masked_branch(block: nn.Module, x: torch.Tensor, hidden: torch.Tensor | None,
                  out: torch.Tensor | None = None, scale: torch.Tensor | None = None
                  ) -> torch.Tensor | None:
    """The residual branch f(x) of a maskable candidate with its expanded channels masked by
    `hidden` after each normalisation and its output by `out` ([C] vectors; None: no mask),
    times `scale` (a MixedOp's m_i, folded with `out` into the last BatchNorm); None for the
    identity. The block's own forward computes it (`fbnas.blocks.irf.IRFForward`, the one
    elastic IRF forward; `skip`'s projection): a `hidden` mask that needs a gradient (the
    relaxations' θ steps) is folded into the weights of the convs that read the expanded
    channels (`fbnas.blocks.common.conv_bn`'s `reads`), the same values and gradients without
    a masked copy of each expanded activation kept for backward."""
    return block(x, shortcut=False, scale=scale, hidden=hidden, out=out)
