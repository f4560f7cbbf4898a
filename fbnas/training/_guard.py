"""Non-finite loss checks that do not wait for the device (`run.nan_check`).

A trainer must not apply the update of a step whose loss is NaN or inf. Checked the plain way
(`step`), that is one host read per step: on a GPU the host then waits for the forward pass to
finish before it can queue the backward, and the device idles while it does. `deferred` keeps
the decision on the device:

- each check computes the step's non-finite flags as a device tensor (all-reduced under
  torchrun, so every rank skips alike);
- the optimizer applies or skips the update on the device: the fused SGD / Adam / AdamW kernels
  take a `found_inf` tensor (the protocol `torch.amp.GradScaler` uses) and leave the weights,
  momentum and step counts untouched when it is non-zero;
- the step's figures are masked on the device, so a skipped step adds nothing to the sums;
- under `nan_policy: stop` the first non-finite step latches: it and every later step are
  skipped until the flags are read (`poll`, at most twice a second, at every checkpoint and at
  the end of each phase). The trainer then winds its position back to the bad step, saves —
  the weights, optimizer state and sums are those from before it, as in `step` mode — and
  raises, naming the step and the term. The batches after it were computed and thrown away.

`auto` is `deferred` on CUDA and `step` elsewhere (a CPU step is synchronous anyway, and its
results stay bit-identical to earlier releases); fp16 always uses `step`, since its loss
scaler already drives `found_inf`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fbnas.errors import first_line


def deferred_wanted(setting: str, device: torch.device, precision: str) -> bool:
    """Whether `run.nan_check: setting` keeps the check on the device for this run."""
    if precision == "fp16":
        return False
    if setting == "auto":
        return device.type == "cuda"
    return setting == "deferred"


def fused_missing(device: torch.device) -> str | None:
    """Why this torch cannot skip an update on `device` (None: it can). Probed, not assumed
    from a version: fused SGD, Adam and AdamW must exist there and leave a parameter alone
    under `found_inf` = 1 while updating it under 0."""
    for name in ("SGD", "Adam", "AdamW"):
        make = getattr(torch.optim, name)
        try:
            moved = []
            for skip in (1.0, 0.0):
                p = torch.ones(1, device=device, requires_grad=True)
                p.grad = torch.ones(1, device=device)
                opt = make([p], lr=0.5, fused=True)
                step_unless(opt, torch.tensor(bool(skip), device=device))
                moved.append(float(p.detach().cpu()) != 1.0)
        except (RuntimeError, TypeError, ValueError) as e:
            return f"{name}(fused=True): {first_line(e)}"
        if moved != [False, True]:
            return f"{name}(fused=True) does not honour found_inf"
    return None


def fused_optimizer(make: Any, params: Any, deferred: bool, **kw: Any) -> torch.optim.Optimizer:
    """`make(params, **kw)`, with fused kernels when the check is deferred (they are what skips
    an update on the device)."""
    if not deferred:
        return make(params, **kw)
    opt = make(params, fused=True, **kw)
    _fill_momentum(opt)
    return opt


def keep_fused(opt: torch.optim.Optimizer, deferred: bool) -> None:
    """After `load_state_dict`: this run's kernels and the state they expect, so a checkpoint
    written under one `nan_check`, device or `channels_last` resumes under another.

    `load_state_dict` restores the saved groups' flags, places Adam's step counters by the
    *saved* flags (a non-fused run's on the CPU, where fused CUDA kernels refuse them) and
    keeps each buffer's saved memory layout (where fused kernels, which assume parameter,
    gradient and state share strides, compute wrong values on the CPU and refuse on CUDA)."""
    for g in opt.param_groups:
        g["fused"] = True if deferred else None
        if deferred:
            g["foreach"] = None
        for p in g["params"]:
            st = opt.state.get(p)
            if not st:
                continue
            for k, v in list(st.items()):
                if not isinstance(v, torch.Tensor):
                    continue
                if k == "step":  # fused: a float32 counter on the parameter's device
                    st[k] = v.to(p.device if deferred else "cpu", torch.float32)
                elif v.shape == p.shape and v.stride() != p.stride():
                    st[k] = torch.empty_like(p).copy_(v)  # the parameter's layout
    if deferred:
        _fill_momentum(opt)


def _fill_momentum(opt: torch.optim.Optimizer) -> None:
    """Zero SGD momentum buffers for the parameters that have none yet. The fused kernel wants
    all of a group's buffers or none (the sampled search modes reach candidates one at a time),
    and on a first step it skips it would leave them uninitialised. Starting from 0 is exact:
    with no dampening, 0·momentum + grad is the first step's buffer."""
    if not isinstance(opt, torch.optim.SGD):
        return
    for g in opt.param_groups:
        if g["momentum"] and not g["dampening"]:
            for p in g["params"]:
                if opt.state[p].get("momentum_buffer") is None:
                    opt.state[p]["momentum_buffer"] = torch.zeros_like(
                        p, memory_format=torch.preserve_format)


@dataclass
class Finding:
    """What a poll found: `count` non-finite steps since the last poll, the first of them at
    `first` (0-based step in the phase), with the terms that were not finite there."""

    count: int
    first: int
    terms: list[str]


class NonFiniteGuard:
    """One trainer's non-finite checks (see the module docstring). `deferred` False: `check`
    reads the flags at once and returns whether the step may be applied."""

    def __init__(self, deferred: bool, policy: str, device: torch.device, dist: Any):
        self.deferred, self.policy, self.device, self.dist = deferred, policy, device, dist
        self._names: list[str] = []
        self._reset()

    def _reset(self) -> None:
        self._count = torch.zeros((), dtype=torch.int64, device=self.device)
        self._first = torch.full((), -1, dtype=torch.int64, device=self.device)
        self._first_terms: torch.Tensor | None = None
        self._halted = torch.zeros((), dtype=torch.bool, device=self.device)
        self._pending = False

    def flags(self, terms: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per term, whether it is non-finite on this rank or, under torchrun, on any rank."""
        bad = torch.stack([~torch.isfinite(v.detach()).all() for v in terms.values()])
        if self.dist.distributed:
            flags = bad.to(torch.int32)
            self.dist.all_reduce_max_(flags)
            bad = flags.bool()
        return bad

    def check_now(self, terms: dict[str, torch.Tensor]) -> list[str]:
        """The `step` check: the names of the non-finite terms (one host read)."""
        bad = self.flags(terms).tolist()
        return [k for k, b in zip(terms, bad, strict=True) if b]

    def check(self, terms: dict[str, torch.Tensor], step: int) -> torch.Tensor:
        """The deferred check of step `step`: a device bool, true when its update must be
        skipped (this step is non-finite, or an earlier one latched a stop)."""
        bad = self.flags(terms)
        now = bad.any()
        new_first = (self._first < 0) & now
        if self._first_terms is None or list(terms) != self._names:
            self._names = list(terms)
            self._first_terms = torch.zeros(len(terms), dtype=torch.bool, device=self.device)
        self._first_terms = torch.where(new_first, bad, self._first_terms)
        self._first = torch.where(new_first, step, self._first)
        self._count = self._count + now
        self._pending = True
        if self.policy == "stop":
            self._halted = self._halted | now
            return self._halted
        return now

    def poll(self) -> Finding | None:
        """Read the flags gathered since the last poll (one host read); None when every step
        was finite. Under `skip` the count starts again; under `stop` the trainer stops."""
        if not self._pending:
            return None
        terms = self._first_terms if self._first_terms is not None else torch.zeros(0)
        vals = torch.cat([torch.stack([self._count, self._first]),
                          terms.to(torch.int64)]).tolist()
        names = [k for k, b in zip(self._names, vals[2:], strict=True) if b]
        self._reset()
        if not vals[0]:
            return None
        return Finding(int(vals[0]), int(vals[1]), names)


def non_finite_what(terms: list[str]) -> str:
    """How an error names the non-finite `terms` of a step: its loss terms (a non-finite
    gradient follows from those), or the gradient alone when the loss was finite."""
    loss = [t for t in terms if t != "gradient"]
    return f"loss term {', '.join(loss)}" if loss else "gradient (the loss was finite)"


def grad_norm(params: list[torch.Tensor], clip: float = 0.0) -> torch.Tensor:
    """The total 2-norm of the parameters' gradients (clipped to `clip` when > 0, which
    `clip_grad_norm_` does while computing it): what the non-finite check reads of the
    gradients, since a finite loss can still give a NaN/inf gradient that would corrupt the
    weights. One fused reduction over all gradients where torch has `_foreach_norm`."""
    ps = [p for p in params if p.grad is not None]
    if not ps:  # nothing to read (on the parameters' device, beside the other flags)
        return torch.zeros((), device=params[0].device if params else "cpu")
    if clip:
        return torch.nn.utils.clip_grad_norm_(ps, clip)
    grads = [p.grad for p in ps]
    norms = torch._foreach_norm(grads) if hasattr(torch, "_foreach_norm") else [
        g.norm() for g in grads]
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


def step_unless(opt: torch.optim.Optimizer, skip: torch.Tensor | None) -> None:
    """`opt.step()`, skipped on the device where `skip` is true (fused kernels' `found_inf`)."""
    if skip is None:
        opt.step()
        return
    opt.found_inf = skip.to(torch.float32)  # type: ignore[attr-defined]
    opt.grad_scale = None  # type: ignore[attr-defined]
    try:
        opt.step()
    finally:
        del opt.found_inf, opt.grad_scale  # type: ignore[attr-defined]


def masked(values: dict[str, Any], skip: torch.Tensor | None) -> dict[str, Any]:
    """A step's device figures with a skipped step's set to 0 (NaN-safe)."""
    if skip is None:
        return values
    return {k: torch.where(skip, 0.0, v) if isinstance(v, torch.Tensor) else v
            for k, v in values.items()}

