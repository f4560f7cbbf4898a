"""One optimizer update, as every trainer step does it, and what a phase sums of its steps.

    with self.stepper.update(Update(opt, params, clip=...)) as u:
        logits = model(x)                 # forward and backward, under the trainer's precision
        self.prec.scale(loss).backward()
        u.terms = {"loss": loss}          # the loss terms to check
    if not u.applied: ...                 # a non-finite step that nan_policy skip skipped

Entering zeroes the gradients (and, for a DDP-wrapped model under local SGD, turns the
gradient all-reduce off for the forward and backward). Leaving, the update:

1. averages the gradients over the ranks when it asks for it (θ, which stays outside DDP), so
   every rank takes the same step;
2. unscales (fp16) and clips them, and takes their total norm;
3. checks the loss terms and the norm for NaN/inf (`run.nan_check`: per step on the host, or
   deferred on the device, fbnas.training._guard) — a non-finite step stops the run or is skipped;
4. applies the optimizer step (through the fp16 loss scaler, or skipped on the device by the
   fused kernels where the deferred check says so), then frees the gradients;
5. counts the step for local SGD (`run.ddp_sync_every`, PeriodicAverager).

`u.skip` is then the deferred check's device flag (None under the per-step check). A step's
figures are a `StepFigures`, summed over a phase by `PhaseSums` on the device and read once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fbnas.training._guard import NonFiniteGuard, grad_norm, masked, step_unless


def metric(t: torch.Tensor) -> torch.Tensor:
    """A step's figure kept on its device (float64, detached): steps return these instead of
    `.item()`, so that a step does not wait for the device; they are read back in one go by
    `host_values` at a phase's end, a checkpoint or a progress-bar refresh."""
    return t.detach().to(torch.float64)


def host_values(d: dict[str, Any]) -> dict[str, Any]:
    """`d` with its tensor values (device-side sums) as Python floats, read in one sync."""
    keys = [k for k, v in d.items() if isinstance(v, torch.Tensor)]
    if not keys:
        return dict(d)
    vals = torch.stack([d[k].reshape(()).to("cpu", torch.float64) for k in keys]).tolist()
    return {**d, **dict(zip(keys, vals, strict=True))}


@dataclass
class Update:
    """What one optimizer update acts on.

    opt / scaler: the optimizer and its fp16 loss scaler's index (fbnas.training.precision).
    params: the parameters whose gradients are checked (and clipped to `clip`, when set).
    average: all-reduce the gradients over the ranks before the check (for parameters outside
        DDP, such as θ); `ddp` / `averager`: the DDP wrapper the forward ran through and the
        local-SGD averager (`run.ddp_sync_every`), when distributed.
    sparse: a policy that keeps what the step did not use as it was (`begin()` at the step's
        start, `step(opt)` a context around the optimizer step; fbnas.blocks.shared.UsedSlices).
    """

    opt: torch.optim.Optimizer
    params: list[torch.Tensor]
    scaler: int = 0
    clip: float | None = None
    average: bool = False
    ddp: Any = None
    averager: Any = None
    sparse: Any = None


class StepFigures(Mapping):
    """A step's figures (device tensors, `metric`) with the step's weight in its phase's means
    (1 per step, or its sample count) and the deferred check's skip flag; reads as a mapping
    of the figures. Empty when the step was not applied."""

    def __init__(self, figures: dict[str, Any] | None = None, weight: float = 1.0,
                 skip: torch.Tensor | None = None, shown: dict[str, Any] | None = None):
        self.figures = masked(dict(figures or {}), skip)
        self.weight, self.skip = weight, skip
        self.shown = dict(shown or {})  # only for the progress bar (e.g. the learning rate)

    def __getitem__(self, k: str) -> Any:
        return self.figures[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self.figures)

    def __len__(self) -> int:
        return len(self.figures)


@dataclass
class PhaseSums:
    """Σ weight·figure over a phase's steps and Σ weight, on the device until read. A step the
    deferred check skipped weighs 0."""

    sums: dict[str, Any] = field(default_factory=dict)
    weight: Any = 0.0

    def add(self, out: StepFigures) -> None:
        if not out:
            return
        w = out.weight if out.skip is None else metric(~out.skip) * out.weight
        for k, v in out.figures.items():
            self.sums[k] = self.sums.get(k, 0.0) + v * w
        self.weight = self.weight + w

    def host(self) -> PhaseSums:
        """The sums as Python floats (one read of the device)."""
        vals = host_values({**self.sums, " weight": self.weight})
        return PhaseSums({k: vals[k] for k in self.sums}, vals[" weight"])

    def means(self) -> dict[str, float]:
        """Each figure's weighted mean (call on `host()`'s result)."""
        return {k: v / max(self.weight, 1) for k, v in self.sums.items()}

    def all_reduce(self, dist: Any) -> PhaseSums:
        """The sums over every rank (host floats)."""
        keys = sorted(self.sums)
        tot = dist.sum_floats([float(self.weight)] + [self.sums[k] for k in keys])
        return PhaseSums(dict(zip(keys, tot[1:], strict=True)), tot[0])

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of a phase in progress (plain floats)."""
        h = self.host()
        return {"sums": h.sums, "weight": h.weight}

    @classmethod
    def from_state(cls, partial: dict[str, Any]) -> PhaseSums:
        """From `state()`'s dict (or a checkpoint of fbnas <= 0.1: a step count with the
        deferred check's skipped steps as the sum `_skipped`, or the sample count `n`)."""
        sums = dict(partial.get("sums") or {})
        sums.pop("seconds", None)
        if "weight" in partial:
            return cls(sums, partial["weight"])
        if "count" in partial:
            return cls(sums, partial["count"] - round(sums.pop("_skipped", 0.0)))
        return cls(sums, sums.pop("n", 0.0))


class Stepper:
    """The update step of one trainer (see the module docstring): its precision, its non-finite
    guard, its process group, and what a non-finite step does (`on_non_finite(terms, step)`:
    log and count it, or save and raise). `position()` is the step's index in its phase."""

    def __init__(self, prec: Any, guard: NonFiniteGuard, dist: Any,
                 on_non_finite: Callable[[list[str], int], None], position: Callable[[], int]):
        self.prec, self.guard, self.dist = prec, guard, dist
        self.on_non_finite, self.position = on_non_finite, position

    def update(self, u: Update) -> UpdateStep:
        return UpdateStep(self, u)

    def grad_terms(self, u: Update) -> dict[str, torch.Tensor]:
        """After backward: unscale (fp16) and clip the gradients as configured, and return
        {"gradient": their total norm} for the check; empty under fp16, whose loss scaler skips
        a step with non-finite gradients (and lowers its scale) itself."""
        if u.clip:
            self.prec.unscale_(u.opt, u.scaler)
        if self.prec.scalers:
            if u.clip:
                nn.utils.clip_grad_norm_(u.params, u.clip)
            return {}
        return {"gradient": grad_norm(u.params, u.clip or 0.0)}

    def check(self, terms: dict[str, torch.Tensor]) -> tuple[bool, torch.Tensor | None]:
        """(apply, skip) for the current step's terms. Per-step check: apply is False for a
        non-finite step that nan_policy skip skips (stop raises in `on_non_finite`); skip is
        None. Deferred: apply is True and skip a device flag for the optimizer."""
        if self.guard.deferred:
            return True, self.guard.check(terms, self.position())
        bad = self.guard.check_now(terms)
        if bad:
            self.on_non_finite(bad, self.position())
            return False, None
        return True, None


class UpdateStep:
    """One update in progress (`Stepper.update`); see the module docstring."""

    def __init__(self, stepper: Stepper, u: Update):
        self.stepper, self.u = stepper, u
        self.terms: dict[str, torch.Tensor] = {}
        self.applied = False
        self.skip: torch.Tensor | None = None
        self._sync = contextlib.ExitStack()

    def __enter__(self) -> UpdateStep:
        u = self.u
        u.opt.zero_grad(set_to_none=True)
        if u.sparse is not None:
            u.sparse.begin()
        if u.averager is not None and u.averager.active:
            self._sync.enter_context(u.ddp.no_sync())
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self._sync.close()
        if exc_type is not None:
            return
        st, u = self.stepper, self.u
        if u.average and st.dist.distributed:
            st.dist.all_reduce_mean([p.grad for p in u.params if p.grad is not None])
        apply, skip = st.check({**self.terms, **st.grad_terms(u)})  # nothing applied yet
        if not apply:
            u.opt.zero_grad(set_to_none=True)
            return
        with contextlib.nullcontext() if u.sparse is None else u.sparse.step(u.opt):
            if skip is None:
                st.prec.step(u.opt, u.scaler)
            else:
                step_unless(u.opt, skip)
        u.opt.zero_grad(set_to_none=True)  # nothing reads them after the step: free them now
        if u.averager is not None:
            u.averager.after_step()
        self.applied, self.skip = True, skip
