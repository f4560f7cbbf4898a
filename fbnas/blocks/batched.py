"""A layer's candidates computed together where they read the same input.

In a mode that computes every candidate (`full`), the IRF candidates of one layer all read the
layer's input x: their 1x1 expansions are one convolution over the concatenated weights, one
BatchNorm over the concatenated channels and one ReLU; and the depthwise convolutions of the
candidates of one kernel size (and stride) read adjacent channels of that output, so they
are one depthwise convolution, one BatchNorm and one ReLU too. BatchNorm is per channel, so
each candidate keeps exactly its own statistics (its running mean and variance are written
back, its `num_batches_tracked` counted), and nothing is ever batched along the batch
dimension (which would mix statistics). Each candidate then goes on alone from its first
depthwise stage (`IRFForward.finish`: a second depthwise stage, squeeze-excite, the
projection with its BatchNorm, into which a MixedOp folds m_i, and the residual).

Taken together: only IRF candidates without groups in their 1x1 (a grouped expansion with a
channel shuffle goes alone) and no width masks; BatchNorms that track running statistics
with one momentum, eps and mode across the group (else the group is computed one by one, as
where it is not built). The parameters and buffers stay the candidates' own (state dict keys,
checkpoints, the child's weights unchanged); only the launches are fewer: on FBNet's nine
candidates, 13 BatchNorm calls per layer instead of 24.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fbnas.blocks.irf import IRFForward


def conv_weight(conv: nn.Module) -> torch.Tensor:
    """The weight a conv applies (its own, or its slice of a shared superkernel)."""
    return conv.weight if isinstance(conv, nn.Conv2d) else conv.conv_weight()


def _geometry(conv: nn.Module) -> tuple[int, int, int, int]:
    """(kernel, stride, padding, groups) of a conv or a superkernel slice (read from its
    attributes: taking a slice's weight would mark it used, fbnas.blocks.shared)."""
    return (_first(conv.kernel_size), _first(conv.stride), _first(conv.padding),
            int(conv.groups))


def _first(v: int | tuple[int, ...]) -> int:
    return v[0] if isinstance(v, tuple) else int(v)


def _stats_alike(bns: Sequence[nn.BatchNorm2d]) -> float | None | bool:
    """The one momentum the group's BatchNorms update with (None: not one, or they cannot be
    normalised together); False for BatchNorms that use batch statistics without tracking."""
    b0 = bns[0]
    if any(b.training != b0.training or b.eps != b0.eps or not b.affine
           or not b.track_running_stats or b.running_mean is None for b in bns):
        return None
    if not b0.training:
        return 0.0
    if all(b.momentum is None for b in bns):  # cumulative average: equal counts needed
        n = {int(b.num_batches_tracked) for b in bns}
        return 1.0 / (n.pop() + 1) if len(n) == 1 else None
    mo = {b.momentum for b in bns}
    return mo.pop() if len(mo) == 1 and None not in mo else None


def batch_norm_together(bns: Sequence[nn.BatchNorm2d], y: torch.Tensor, momentum: float,
                        scale: torch.Tensor | None = None) -> torch.Tensor:
    """`bns` applied to their channels of `y` (concatenated in order) in one call, each
    BatchNorm's running statistics and count updated exactly as its own forward would;
    `scale` ([C]) multiplies the output through the affine (as `common.scaled_batch_norm`)."""
    training = bns[0].training
    mean = torch.cat([b.running_mean for b in bns])
    var = torch.cat([b.running_var for b in bns])
    weight, bias = torch.cat([b.weight for b in bns]), torch.cat([b.bias for b in bns])
    if scale is not None:
        weight, bias = weight * scale, bias * scale
    out = F.batch_norm(y, mean, var, weight, bias, training, momentum, bns[0].eps)
    if training:
        sizes = [b.num_features for b in bns]
        with torch.no_grad():
            for b, m, v in zip(bns, mean.split(sizes), var.split(sizes), strict=True):
                b.running_mean.copy_(m)
                b.running_var.copy_(v)
                b.num_batches_tracked.add_(1)
    return out


def stages_together(stages: Sequence[nn.Sequential], x: torch.Tensor, depthwise: bool
                    ) -> torch.Tensor | None:
    """Conv -> BatchNorm -> ReLU `stages` that read x (1x1 expansions) or consecutive
    channel ranges of x (depthwise ones) computed as one of each: their outputs concatenated
    along the channels, in order. None where their BatchNorms cannot be normalised together
    (the caller computes them one by one)."""
    bns = [s[1] for s in stages]
    momentum = _stats_alike(bns)
    if momentum is None:
        return None
    _, stride, pad, _ = _geometry(stages[0][0])
    w = torch.cat([conv_weight(s[0]) for s in stages])
    y = F.conv2d(x, w, None, stride, pad, 1, w.shape[0] if depthwise else 1)
    y = batch_norm_together(bns, y, momentum)
    for m in list(stages[0])[2:]:
        y = m(y)
    return y


@dataclass(frozen=True)
class LayerBatches:
    """Which candidates of a layer are computed together: `expand`, the candidates whose 1x1
    expansions are one convolution, in the order their channels are concatenated (grouped by
    kernel size); `depthwise`, runs of them (positions in `expand`) whose first depthwise
    stages are one convolution."""

    expand: tuple[int, ...]
    depthwise: tuple[tuple[int, ...], ...]
    project: tuple[int, ...] = ()

    @classmethod
    def plan(cls, candidates: Sequence[nn.Module], folded: Sequence[bool] = ()
             ) -> LayerBatches | None:
        """The batches of a layer's candidates, None where fewer than two can share one.
        `folded[i]`: the layer folds m_i into candidate i's last BatchNorm and mixes its
        branch; those IRF candidates' projections are normalised together and summed in
        one reduction (`project`)."""
        def plain(b: nn.Module) -> bool:
            return (isinstance(b, IRFForward) and isinstance(b.shuffle, nn.Identity)
                    and _geometry(b.pw[0])[3] == 1 and len(b.pw) == 3 and len(b.dw[0]) == 3)
        project = tuple(i for i, b in enumerate(candidates)
                        if i < len(folded) and folded[i] and isinstance(b, IRFForward)
                        and len(b.pwl) == 2)
        project = project if len(project) > 1 else ()
        ids = [i for i, b in enumerate(candidates) if plain(b)]
        if len(ids) < 2:
            return cls((), (), project) if project else None
        geo = {i: _geometry(candidates[i].dw[0][0])[:3] for i in ids}
        ids.sort(key=lambda i: (geo[i], i))
        runs: list[tuple[int, ...]] = []
        for pos, i in enumerate(ids):
            if runs and geo[ids[runs[-1][-1]]] == geo[i]:
                runs[-1] = (*runs[-1], pos)
            else:
                runs.append((pos,))
        return cls(tuple(ids), tuple(r for r in runs if len(r) > 1), project)

    def first_stages(self, candidates: Sequence[nn.Module], x: torch.Tensor
                     ) -> dict[int, torch.Tensor]:
        """Each batched candidate's activation after its first depthwise stage, by index
        (`IRFForward.finish` goes on from it); {} where the group cannot be normalised
        together (the candidates are then computed one by one)."""
        blocks = [candidates[i] for i in self.expand]
        if not blocks:
            return {}
        y = stages_together([b.pw for b in blocks], x, depthwise=False)
        if y is None:
            return {}
        sizes = [b.pw[1].num_features for b in blocks]
        starts = [sum(sizes[:p]) for p in range(len(blocks))]
        out: dict[int, torch.Tensor] = {}
        for run in self.depthwise:  # the run's channels are adjacent in y
            n = sum(sizes[p] for p in run)
            got = stages_together([blocks[p].dw[0] for p in run], y.narrow(1, starts[run[0]], n),
                                  depthwise=True)
            if got is not None:
                out.update(zip(run, got.split([sizes[p] for p in run], 1), strict=True))
        for p, b in enumerate(blocks):
            if p not in out:
                out[p] = b.dw[0](y.narrow(1, starts[p], sizes[p]))
        return {self.expand[p]: h for p, h in out.items()}

    def projections(self, candidates: Sequence[nn.Module], x: torch.Tensor,
                    first: dict[int, torch.Tensor], m: torch.Tensor) -> torch.Tensor | None:
        """Σ m_i f_i(x) over the `project` candidates (each candidate's residual branch, m_i
        folded into its last BatchNorm): their projections' outputs concatenated, one
        BatchNorm, one sum over the candidates. `first`: activations after the first
        depthwise stage already computed (`first_stages`). None where their BatchNorms cannot
        be normalised together (the caller computes them one by one)."""
        blocks = [candidates[i] for i in self.project]
        bns = [b.pwl[1] for b in blocks]
        momentum = _stats_alike(bns)
        if momentum is None:
            return None
        zs = []
        for i, b in zip(self.project, blocks, strict=True):
            h = first[i] if i in first else b.dw[0](b.shuffle(b.pw(x)))
            zs.append(b.pwl[0](b.to_projection(h)))
        c = bns[0].num_features
        idx = torch.tensor(self.project, device=m.device)
        scale = m.index_select(0, idx).to(bns[0].weight.dtype).repeat_interleave(c)
        y = batch_norm_together(bns, torch.cat(zs, 1), momentum, scale)
        return y.unflatten(1, (len(blocks), c)).sum(1)
