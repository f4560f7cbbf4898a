"""Cost-aware search losses. One formula per class; each docstring states it.

All take (logits, targets, cost) and return a LossTerms(total, ce, cost_term). `cost` is the
supernet's expected cost Σ m·LAT in the table's unit — microseconds for latency tables (also
the unit the FBNet formula's log is taken in), FLOPs or parameters for those tables.
`build_loss(config)` picks one by name (`loss.kind` in a config file).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fbnas.errors import FbnasError
from fbnas.io import Fields


@dataclass
class LossTerms:
    total: torch.Tensor
    ce: torch.Tensor
    cost_term: torch.Tensor  # the factor (multiplicative losses) or the addend (additive ones)


class CostLoss(nn.Module):
    """Base class: cross-entropy (with optional label smoothing) combined with a cost term."""

    def __init__(self, label_smoothing: float = 0.0):
        super().__init__()
        self.label_smoothing = label_smoothing

    def ce(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing)

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def combine(self, ce: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def check_range(self, lo: float, hi: float) -> None:
        """Raise if costs in [lo, hi] (the search space's cheapest..dearest) break the formula."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor,
                cost: torch.Tensor) -> LossTerms:
        ce = self.ce(logits, targets)
        term = self.cost_term(cost)
        return LossTerms(self.combine(ce, term), ce, term)


class CELoss(CostLoss):
    """No cost term: L = CE (a search that ignores the cost, for comparison)."""

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(cost)

    def combine(self, ce, term):
        return ce


class FBNetLoss(CostLoss):
    """FBNet (Wu et al. 2019, eq. 2): L = CE · α · (log LAT)^β, LAT in microseconds.

    β is an exponent on log LAT (the reference implementation computed α·β·CE·log LAT, which
    makes β a mere scale). log LAT must exceed 1 (LAT > e µs): below that, the power flattens
    or inverts the penalty, so such costs raise an error instead. α multiplies the whole loss,
    so it acts like a learning-rate scale (and Adam, the θ optimizer, is nearly invariant to
    it); β sets the accuracy/cost trade-off. α must be > 0 (α = 0 zeroes the loss: use
    `kind: ce` for a cost-blind search).
    """

    def __init__(self, alpha: float = 0.2, beta: float = 0.6, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        self.alpha, self.beta = alpha, beta

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        if bool((cost <= math.e).any()):
            raise FbnasError(f"FBNet loss needs LAT > e µs (log LAT > 1); got LAT = "
                             f"{float(cost.min()):.4g}. Use a latency table in µs, or "
                             "loss.kind: normalized / additive / abs_target")
        return self.alpha * torch.log(cost) ** self.beta

    def combine(self, ce, term):
        return ce * term

    def check_range(self, lo: float, hi: float) -> None:
        if lo <= math.e:
            raise FbnasError(f"loss.kind fbnet: the cheapest architecture costs {lo:.4g} <= e "
                             "(log LAT <= 1 inverts or flattens the penalty); use a table in µs "
                             "or another loss.kind")


class NormalizedLoss(CostLoss):
    """Normalised multiplicative: L = CE · (log LAT / log T)^β, T the target cost (T > 1)."""

    def __init__(self, target: float, beta: float = 0.6, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        if not target > 1:
            raise FbnasError(f"loss.target: normalized loss needs a target > 1, got {target}")
        self.target, self.beta = target, beta

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        if bool((cost <= 1).any()):
            raise FbnasError(f"normalized loss needs LAT > 1; got {float(cost.min()):.4g}")
        return (torch.log(cost) / math.log(self.target)) ** self.beta

    def combine(self, ce, term):
        return ce * term

    def check_range(self, lo: float, hi: float) -> None:
        if lo <= 1:
            raise FbnasError(f"loss.kind normalized: the cheapest architecture costs {lo:.4g} "
                             "<= 1, where log LAT <= 0")


class _TargetLoss(CostLoss):
    """Base of the additive losses: CE plus λ times a function of LAT relative to a target T."""

    def __init__(self, target: float, lam: float = 0.1, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        if not target > 0:
            raise FbnasError(f"loss.target: must be > 0, got {target}")
        self.target, self.lam = target, lam

    def combine(self, ce, term):
        return ce + term


class AdditiveLoss(_TargetLoss):
    """Additive (ProxylessNAS-style): L = CE + λ · (LAT − T) / T."""

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        return self.lam * (cost - self.target) / self.target


class AbsTargetLoss(_TargetLoss):
    """Absolute target (TuNAS `abs` reward): L = CE + λ · |LAT / T − 1|."""

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        return self.lam * torch.abs(cost / self.target - 1.0)


LOSSES = {"ce": CELoss, "fbnet": FBNetLoss, "normalized": NormalizedLoss, "additive": AdditiveLoss,
          "abs_target": AbsTargetLoss}


# The keys each kind reads, in the order the file's resolved config lists them.
KIND_KEYS = {"ce": ("label_smoothing",), "fbnet": ("alpha", "beta", "label_smoothing"),
             "normalized": ("beta", "target", "label_smoothing"),
             "additive": ("target", "lambda", "label_smoothing"),
             "abs_target": ("target", "lambda", "label_smoothing")}


@dataclass(frozen=True)
class LossConfig:
    """The `loss:` section, typed: `kind` picks the formula (one class above) and the keys it
    reads (KIND_KEYS); keys of other kinds are errors. Built once into a CostLoss by `build`."""

    kind: str = "fbnet"
    alpha: float = 0.2
    beta: float = 0.6
    target: float | None = None
    lam: float = 0.1  # the file's key `lambda`
    label_smoothing: float = 0.0

    @classmethod
    def from_dict(cls, d: Any, where: str = "loss") -> LossConfig:
        f = Fields({} if d is None else d, where)
        kind = f.str("kind", "fbnet", choices=tuple(LOSSES))
        ls = f.float("label_smoothing", 0.0, min=0.0, max=0.99)
        kw: dict[str, Any] = {"kind": kind, "label_smoothing": ls}
        if kind == "fbnet":
            kw.update(alpha=f.float("alpha", 0.2, gt=0.0), beta=f.float("beta", 0.6, gt=0.0))
        elif kind == "normalized":
            kw.update(target=f.float("target", required=True, gt=1.0),
                      beta=f.float("beta", 0.6, gt=0.0))
        elif kind != "ce":
            kw.update(target=f.float("target", required=True, gt=0.0),
                      lam=f.float("lambda", 0.1, min=0.0))
        f.done()
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        """The resolved section: `kind` and the keys it reads, defaults filled in."""
        values = {"alpha": self.alpha, "beta": self.beta, "target": self.target,
                  "lambda": self.lam, "label_smoothing": self.label_smoothing}
        return {"kind": self.kind, **{k: values[k] for k in KIND_KEYS[self.kind]}}

    def build(self) -> CostLoss:
        ls = self.label_smoothing
        if self.kind == "ce":
            return CELoss(ls)
        if self.kind == "fbnet":
            return FBNetLoss(self.alpha, self.beta, ls)
        if self.kind == "normalized":
            return NormalizedLoss(self.target, self.beta, ls)
        cls = AdditiveLoss if self.kind == "additive" else AbsTargetLoss
        return cls(self.target, self.lam, ls)


def build_loss(cfg: LossConfig | Any, where: str = "loss") -> CostLoss:
    """Build a loss from a LossConfig, or from a config mapping {kind, alpha, beta, target,
    lambda, label_smoothing} (validated as the `loss:` section is)."""
    if not isinstance(cfg, LossConfig):
        cfg = LossConfig.from_dict(cfg, where)
    return cfg.build()
