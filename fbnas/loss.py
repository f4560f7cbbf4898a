"""Cost-aware search losses. One formula per class; each docstring states it.

All take (logits, targets, cost) and return a LossTerms(total, ce, cost_term). `cost` is the
supernet's cost in the table's unit — microseconds for latency tables (also the unit the FBNet
formula's log is taken in), FLOPs or parameters for those tables: Σ m·LAT over the sampled
path weights m, or, for the losses with `on_expected` (target, hinge), the expected cost
Σ softmax(θ)·LAT, which is deterministic and reaches every θ in every search mode.
`build_loss(config)` picks one by name (`loss.kind` in a config file).

A target T (`loss.target`) is a number in the table's unit, a time with a unit (`1.2ms`,
`900us`; latency tables only), or a position in the space's range (`0.6x`: cheapest +
0.6·(dearest − cheapest)); `LossConfig.build(bounds)` resolves it against the installed table.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fbnas.errors import FbnasError
from fbnas.io import show
from fbnas.registry import Registry
from fbnas.settings import NOT_ADDED, Fields, read_setting, setting, settings_of


@dataclass
class LossTerms:
    total: torch.Tensor
    ce: torch.Tensor
    cost_term: torch.Tensor  # the factor (multiplicative losses) or the addend (additive ones)


class CostLoss(nn.Module):
    """Base class: cross-entropy (with optional label smoothing) combined with a cost term.

    A loss is one subclass registered in LOSSES under its `loss.kind`: `keys` are the `loss:`
    keys it reads (in the order the resolved config lists them; each a `setting` of
    LossConfig), `defaults` the kind's own defaults for some of them, `from_config` builds it
    from a LossConfig and the space's cost bounds."""

    on_expected = False  # the cost term takes Σ softmax(θ)·LAT instead of the sampled Σ m·LAT
    keys: tuple[str, ...] = ("label_smoothing",)
    defaults: ClassVar[dict[str, Any]] = {}  # key -> this kind's default, where not LossConfig's

    @classmethod
    def from_config(cls, c: LossConfig, bounds: tuple[float, float] | None) -> CostLoss:
        """The loss `c` describes (`bounds`: the space's cheapest and dearest cost)."""
        return cls(resolve_target(c.target, bounds), c.lam, c.label_smoothing)

    @classmethod
    def check_config(cls, c: LossConfig, f: Fields) -> None:
        """Raise naming the key if the values read are inconsistent for this kind."""

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
        return self.with_ce(self.ce(logits, targets), cost)

    def with_ce(self, ce: torch.Tensor, cost: torch.Tensor) -> LossTerms:
        """The loss of an already computed cross-entropy (or an estimator standing for it)."""
        term = self.cost_term(cost)
        return LossTerms(self.combine(ce, term), ce, term)


LOSSES: Registry[type[CostLoss]] = Registry("loss kind", "loss.kind")


@LOSSES.register("ce")
class CELoss(CostLoss):
    """No cost term: L = CE (a search that ignores the cost, for comparison)."""

    @classmethod
    def from_config(cls, c: LossConfig, bounds: tuple[float, float] | None) -> CostLoss:
        return cls(c.label_smoothing)

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(cost)

    def combine(self, ce, term):
        return ce


def _refuse_at_most(cost: torch.Tensor, limit: float, msg: str) -> None:
    """Refuse a cost <= `limit` (the loss would invert or flatten), where reading it is free:
    on the host. On an accelerator the read would stall every step; there the trainer's
    `check_range` has refused any space whose cheapest architecture is that cheap, and every
    expected cost lies between the cheapest and the dearest."""
    if cost.device.type == "cpu" and bool((cost <= limit).any()):
        raise FbnasError(msg.format(float(cost.min())))


@LOSSES.register("fbnet")
class FBNetLoss(CostLoss):
    """FBNet (Wu et al. 2019, eq. 2): L = CE · α · (log LAT)^β, LAT in microseconds.

    β is an exponent on log LAT (the reference implementation computed α·β·CE·log LAT, which
    makes β a mere scale). log LAT must exceed 1 (LAT > e µs): below that, the power flattens
    or inverts the penalty, so such costs raise an error instead. α multiplies the whole loss,
    so it acts like a learning-rate scale (and Adam, the θ optimizer, is nearly invariant to
    it); β sets the accuracy/cost trade-off. α must be > 0 (α = 0 zeroes the loss: use
    `kind: ce` for a cost-blind search).

    `ref` (set by `LossConfig.build` to the geometric mean of the space's cheapest and dearest
    architecture) divides the term by the constant (log ref)^β, so the loss value stays near
    CE·α whatever β and the unit (β = 16 would otherwise read ~10^11). A constant factor
    changes no minimiser and, under Adam, no step: the search is the paper's.
    """

    keys = ("alpha", "beta", "label_smoothing")

    @classmethod
    def from_config(cls, c: LossConfig, bounds: tuple[float, float] | None) -> CostLoss:
        ref = math.sqrt(bounds[0] * bounds[1]) if bounds and bounds[0] > 0 else None
        return cls(c.alpha, c.beta, c.label_smoothing, ref=ref)

    def __init__(self, alpha: float = 0.2, beta: float = 0.6, label_smoothing: float = 0.0,
                 ref: float | None = None):
        super().__init__(label_smoothing)
        self.alpha, self.beta = alpha, beta
        self.scale = 1.0 if ref is None or ref <= math.e else math.log(ref) ** -beta

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        _refuse_at_most(cost, math.e, "FBNet loss needs LAT > e µs (log LAT > 1); got LAT = "
                        "{:.4g}. Use a latency table in µs, or loss.kind: target / normalized "
                        "/ additive / abs_target")
        return self.alpha * self.scale * torch.log(cost) ** self.beta

    def combine(self, ce, term):
        return ce * term

    def check_range(self, lo: float, hi: float) -> None:
        if lo <= math.e:
            raise FbnasError(f"loss.kind fbnet: the cheapest architecture costs {lo:.4g} <= e "
                             "(log LAT <= 1 inverts or flattens the penalty); use a table in µs "
                             "or another loss.kind")


@LOSSES.register("normalized")
class NormalizedLoss(CostLoss):
    """Normalised multiplicative: L = CE · (log LAT / log T)^β, T the target cost (T > 1)."""

    keys = ("beta", "target", "label_smoothing")

    @classmethod
    def from_config(cls, c: LossConfig, bounds: tuple[float, float] | None) -> CostLoss:
        target = resolve_target(c.target, bounds)
        if not target > 1:
            raise FbnasError(f"loss.target: normalized loss needs a target > 1, got "
                             f"{target:.4g}")
        return cls(target, c.beta, c.label_smoothing)

    @classmethod
    def check_config(cls, c: LossConfig, f: Fields) -> None:
        if isinstance(c.target, float) and not c.target > 1.0:
            raise FbnasError(f"{f.at('target')}: must be > 1.0, got {c.target}")

    def __init__(self, target: float, beta: float = 0.6, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        if not target > 1:
            raise FbnasError(f"loss.target: normalized loss needs a target > 1, got {target}")
        self.target, self.beta = target, beta

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        _refuse_at_most(cost, 1.0, "normalized loss needs LAT > 1; got {:.4g}")
        return (torch.log(cost) / math.log(self.target)) ** self.beta

    def combine(self, ce, term):
        return ce * term

    def check_range(self, lo: float, hi: float) -> None:
        if lo <= 1:
            raise FbnasError(f"loss.kind normalized: the cheapest architecture costs {lo:.4g} "
                             "<= 1, where log LAT <= 0")


class _TargetLoss(CostLoss):
    """Base of the additive losses: CE plus λ times a function of LAT relative to a target T."""

    keys = ("target", "lambda", "label_smoothing")

    def __init__(self, target: float, lam: float = 0.1, label_smoothing: float = 0.0):
        super().__init__(label_smoothing)
        if not target > 0:
            raise FbnasError(f"loss.target: must be > 0, got {target}")
        self.target, self.lam = target, lam

    def combine(self, ce, term):
        return ce + term


@LOSSES.register("additive")
class AdditiveLoss(_TargetLoss):
    """Additive (ProxylessNAS-style): L = CE + λ · (LAT − T) / T."""

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        return self.lam * (cost - self.target) / self.target


@LOSSES.register("abs_target")
class AbsTargetLoss(_TargetLoss):
    """Absolute target (TuNAS `abs` reward): L = CE + λ · |LAT / T − 1|."""

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        return self.lam * torch.abs(cost / self.target - 1.0)


@LOSSES.register("target")
class TargetLoss(_TargetLoss):
    """Latency target (TuNAS's absolute reward on the expected cost):
    L = CE + λ · |E[LAT] / T − 1|, E[LAT] = Σ softmax(θ)·LAT. Its scale depends on neither
    the unit nor the range: a 10% miss costs 0.1·λ, either side."""

    on_expected = True
    defaults: ClassVar[dict[str, Any]] = {"lambda": 1.0}  # scripts/search/target.py

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        return self.lam * torch.abs(cost / self.target - 1.0)


@LOSSES.register("hinge")
class HingeLoss(_TargetLoss):
    """Latency budget (one-sided): L = CE + λ · max(0, E[LAT] / T − 1), E[LAT] as in
    TargetLoss: no penalty at or under T."""

    on_expected = True
    defaults: ClassVar[dict[str, Any]] = {"lambda": 1.0}

    def cost_term(self, cost: torch.Tensor) -> torch.Tensor:
        return self.lam * torch.relu(cost / self.target - 1.0)


TIME_UNITS = {"us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}
_TARGET = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|µs|ms|s|x)\s*$")


def parse_target(raw: Any, where: str) -> tuple[float, str]:
    """(value, unit) of a `loss.target`: a number ('' : the table's unit), `1.2ms` / `900us`
    (a time, converted to µs by `resolve_target`) or `0.6x` (a position in the space's range).
    A malformed one raises naming `where`."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise FbnasError(f"{where}: expected a number or a string such as 1.2ms, 900us or "
                         f"0.6x, got {show(raw)}")
    if isinstance(raw, str):
        m = _TARGET.match(raw)
        if m is None:
            raise FbnasError(f"{where}: cannot read {show(raw)}; write a number in the table's "
                             "unit, a time such as 1.2ms or 900us, or a position in the space's "
                             "latency range such as 0.6x")
        value, unit = float(m.group(1)), m.group(2)
    else:
        value, unit = float(raw), ""
    if not math.isfinite(value) or value < 0 or (value == 0 and unit != "x"):
        raise FbnasError(f"{where}: must be > 0 (or 0x, the cheapest), got {show(raw)}")
    return value, unit


def resolve_target(raw: Any, bounds: tuple[float, float] | None, where: str = "loss.target"
                   ) -> float:
    """T in the table's unit (µs for latency): a number as is, a time converted, `Fx` as
    cheapest + F·(dearest − cheapest) of `bounds` (needed for `x`)."""
    value, unit = parse_target(raw, where)
    if unit in TIME_UNITS:
        return value * TIME_UNITS[unit]
    if unit == "x":
        if bounds is None:
            raise FbnasError(f"{where}: {show(raw)} is relative to the space's range, which is "
                             "known only once a cost table is installed")
        lo, hi = bounds
        return lo + value * (hi - lo)
    return value


def _as_target(raw: Any, where: str) -> float | str:
    """`loss.target` as written (checked now; resolved against the table by `build`)."""
    parse_target(raw, where)
    return float(raw) if isinstance(raw, int) else raw


@dataclass(frozen=True)
class LossConfig:
    """The `loss:` section, typed: `kind` picks the formula (a class registered in LOSSES) and
    the keys it reads (its `keys`, each a `setting` here); keys of other kinds are errors.
    Built once into a CostLoss by `build`."""

    kind: str = setting("fbnet", "str", choices=LOSSES)
    alpha: float = setting(0.2, "float", gt=0.0)
    beta: float = setting(0.6, "float", gt=0.0)
    # as written: a number, `1.2ms`, `900us`, `0.6x`
    target: float | str | None = setting(None, "raw", required=True, convert=_as_target)
    lam: float = setting(0.1, "float", key="lambda", min=0.0)
    label_smoothing: float = setting(0.0, "float", min=0.0, max=0.99)

    @classmethod
    def from_dict(cls, d: Any, where: str = "loss") -> LossConfig:
        f = Fields({} if d is None else d, where)
        declared = settings_of(cls)
        kind = read_setting(f, declared["kind"])
        loss_cls = LOSSES.get(kind)
        kw: dict[str, Any] = {"kind": kind}
        # label_smoothing first, then the kind's own keys
        for key in sorted(loss_cls.keys, key=lambda k: k != "label_smoothing"):
            fd = declared[key]
            kw[fd.name] = read_setting(f, fd, loss_cls.defaults.get(key, NOT_ADDED))
        c = cls(**kw)
        loss_cls.check_config(c, f)
        f.done()
        return c

    @property
    def time_target(self) -> bool:
        """Whether the target is written as a time (needs a latency table)."""
        return self.target is not None and parse_target(self.target, "loss.target")[1] in (
            TIME_UNITS)

    def to_dict(self) -> dict[str, Any]:
        """The resolved section: `kind` and the keys it reads, defaults filled in."""
        declared = settings_of(type(self))
        return {"kind": self.kind, **{k: getattr(self, declared[k].name)
                                      for k in LOSSES.get(self.kind).keys}}

    def build(self, bounds: tuple[float, float] | None = None) -> CostLoss:
        """The loss; `bounds` (the space's cheapest and dearest cost under the installed
        table) resolve an `0.6x` target and set the FBNet formula's scale reference."""
        return LOSSES.get(self.kind).from_config(self, bounds)


def build_loss(cfg: LossConfig | Any, where: str = "loss") -> CostLoss:
    """Build a loss from a LossConfig, or from a config mapping {kind, alpha, beta, target,
    lambda, label_smoothing} (validated as the `loss:` section is)."""
    if not isinstance(cfg, LossConfig):
        cfg = LossConfig.from_dict(cfg, where)
    return cfg.build()
