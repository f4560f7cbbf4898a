"""MixedOp and the Gumbel-softmax Supernet.

MixedOp holds one layer's candidate blocks and nothing else. The Supernet owns θ (one logit
vector per searchable layer), samples m = GumbelSoftmax(θ, τ) per forward, and returns the
logits together with the expected cost Σ_l Σ_i m_li · cost(b_li) computed from the same m.
Costs are plain buffers (latency in µs, FLOPs, params — whatever table was given); nothing is
threaded through forward and nothing calls `.cuda()`, so the module moves with `.to(device)`
and works unchanged under DistributedDataParallel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fbnas.blocks import build_block, init_weights
from fbnas.errors import FbnasError
from fbnas.search_space import SearchSpace

CostRows = Sequence[Mapping[str, float]] | Sequence[Sequence[float]]


class MixedOp(nn.Module):
    """The candidate blocks of one searchable layer: forward(x, m) = Σ_i m_i · b_i(x)."""

    def __init__(self, ops: Sequence[str], c_in: int, c_out: int, stride: int):
        super().__init__()
        self.op_names = tuple(ops)
        self.candidates = nn.ModuleList(build_block(o, c_in, c_out, stride) for o in ops)

    def forward(self, x: torch.Tensor, m: torch.Tensor,
                active: Sequence[int] | None = None) -> torch.Tensor:
        """Σ_i m_i · b_i(x) over all candidates, or only over `active` ones (the others are
        taken to have m_i = 0 and are not computed)."""
        out = None
        for i in range(len(self.candidates)) if active is None else active:
            y = m[i] * self.candidates[i](x)
            out = y if out is None else out + y
        return out


class Supernet(nn.Module):
    """stem -> MixedOp x L -> head, with θ and a per-(layer, op) cost table."""

    def __init__(self, space: SearchSpace, costs: CostRows | None = None,
                 fixed_cost: float = 0.0):
        super().__init__()
        self.space = space
        self.stem = space.macro.build_stem()
        layers = space.layers()
        cands = space.layer_candidates()
        self.mixed = nn.ModuleList(MixedOp(c, la.c_in, la.c_out, la.stride)
                                   for c, la in zip(cands, layers, strict=True))
        self.head = space.macro.build_head()
        init_weights(self)
        # θ starts uniform: every candidate equally likely.
        self.theta = nn.ParameterList(nn.Parameter(torch.zeros(len(c))) for c in cands)
        self.set_costs(costs, fixed_cost)

    # ---- parameters, told apart by identity -----------------------------------------------
    def arch_parameters(self) -> list[nn.Parameter]:
        return list(self.theta)

    def weight_parameters(self) -> list[nn.Parameter]:
        arch = {id(p) for p in self.theta}
        return [p for p in self.parameters() if id(p) not in arch]

    # ---- costs ------------------------------------------------------------------------------
    def set_costs(self, costs: CostRows | None, fixed_cost: float = 0.0) -> None:
        """Install a cost table: one row per layer, a mapping op -> cost or a list in op order.

        `fixed_cost` (stem + head) is added to every expected cost. Without a table every
        candidate costs 0.
        """
        cands = self.space.layer_candidates()
        if costs is not None and len(costs) != len(cands):
            raise FbnasError(f"cost table has {len(costs)} rows for {len(cands)} layers")
        for li, ops in enumerate(cands):
            row = costs[li] if costs is not None else [0.0] * len(ops)
            if isinstance(row, Mapping):
                missing = [o for o in ops if o not in row]
                if missing:
                    raise FbnasError(f"cost table: layer {li} has no cost for op '{missing[0]}'")
                row = [row[o] for o in ops]
            if len(row) != len(ops):
                raise FbnasError(f"cost table: layer {li} has {len(row)} costs for "
                                 f"{len(ops)} candidates")
            t = torch.tensor([float(v) for v in row], dtype=torch.float32)
            if not torch.isfinite(t).all() or (t < 0).any():
                raise FbnasError(f"cost table: layer {li} has a negative or non-finite cost")
            name = f"cost_{li}"
            if hasattr(self, name):
                getattr(self, name).copy_(t)
            else:
                self.register_buffer(name, t, persistent=False)
        self.fixed_cost = float(fixed_cost)

    def cost_rows(self) -> list[torch.Tensor]:
        return [getattr(self, f"cost_{li}") for li in range(len(self.mixed))]

    def expected_cost(self, m: Sequence[torch.Tensor]) -> torch.Tensor:
        """Σ_l Σ_i m_li · cost_li + fixed cost."""
        total = sum((mi * ci).sum() for mi, ci in zip(m, self.cost_rows(), strict=True))
        return total + self.fixed_cost

    def cost_bounds(self) -> tuple[float, float]:
        """The cheapest and dearest architecture's cost under the installed table."""
        rows = self.cost_rows()
        lo = sum(float(r.min()) for r in rows) + self.fixed_cost
        hi = sum(float(r.max()) for r in rows) + self.fixed_cost
        return lo, hi

    # ---- sampling -------------------------------------------------------------------------------
    def sample_weights(self, tau: float, hard: bool = False) -> list[torch.Tensor]:
        """m_l = GumbelSoftmax(θ_l, τ); `hard` gives one-hot samples with straight-through grads."""
        if not tau > 0:
            raise FbnasError(f"temperature must be > 0, got {tau}")
        return [F.gumbel_softmax(t, tau=tau, hard=hard) for t in self.theta]

    def argmax_weights(self) -> list[torch.Tensor]:
        """One-hot at argmax θ per layer: the deterministic architecture used for validation."""
        return [F.one_hot(t.detach().argmax(), len(t)).to(t.dtype) for t in self.theta]

    def probabilities(self) -> list[torch.Tensor]:
        return [torch.softmax(t.detach(), -1) for t in self.theta]

    def entropy(self) -> torch.Tensor:
        """Entropy (nats) of softmax(θ_l) per layer."""
        return torch.stack([-(p * torch.log(p.clamp_min(1e-30))).sum()
                            for p in self.probabilities()])

    # ---- forward --------------------------------------------------------------------------------
    def argmax_indices(self) -> list[int]:
        return [int(t.detach().argmax()) for t in self.theta]

    def forward(self, x: torch.Tensor, tau: float = 1.0, hard: bool = False,
                m: Sequence[torch.Tensor] | None = None,
                active: Sequence[Sequence[int]] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (logits, expected cost). Pass `m` to use given weights instead of sampling,
        and `active` (candidate indices per layer) to compute only those paths."""
        if m is None:
            m = self.sample_weights(tau, hard)
        y = self.stem(x)
        for li, (op, mi) in enumerate(zip(self.mixed, m, strict=True)):
            y = op(y, mi, None if active is None else active[li])
        return self.head(y), self.expected_cost(m)

    @torch.no_grad()
    def recalibrate_bn(self, batches, m: Sequence[torch.Tensor],
                       active: Sequence[Sequence[int]] | None = None) -> int:
        """Re-estimate BatchNorm running statistics for the path(s) given by `m`/`active`.

        In a supernet, a layer's BN statistics are gathered on the mixture of its input paths;
        a single architecture sees other activations, so its eval-mode accuracy is garbage
        until its statistics are re-estimated. `batches` yields (x, _) on the right device.
        Returns the number of samples used.
        """
        bns = [b for b in self.modules() if isinstance(b, nn.modules.batchnorm._BatchNorm)]
        momenta = [b.momentum for b in bns]
        was_training = self.training
        for b in bns:
            b.reset_running_stats()
            b.momentum = None  # cumulative average over the calibration batches
        self.train()
        n = 0
        try:
            for x in batches:
                self(x, m=m, active=active)
                n += len(x)
        finally:
            for b, mo in zip(bns, momenta, strict=True):
                b.momentum = mo
            self.train(was_training)
        return n
