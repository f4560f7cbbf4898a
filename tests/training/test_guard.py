"""The deferred non-finite check (`run.nan_check: deferred`, fbnas.training._guard): the same search
as the per-step check, the last good state saved on a stop, and no host read in the step.

test_trainer.py and test_faults.py run their NaN/inf tests under both checks; these tests
compare the two directly."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest
import torch
from conftest import digits_run_config, fit_through_a_bad_step, nan_gradient

from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.trainer import SearchTrainer
from fbnas.training._guard import NonFiniteGuard, deferred_wanted, fused_missing
from fbnas.training.checkpoint import load_checkpoint
from fbnas.training.logs import close_logger
from fbnas.training.loop import NonFiniteLoss

TINY = digits_run_config(data={"limit": 240, "batch_size": 12},
                         search={"epochs": 3, "warmup_epochs": 1, "w_lr": 0.05,
                                 "theta_lr": 0.05},
                         run={"checkpoint_every_steps": 0})


def _trainer(tmp_path: Path, name: str, check: str, loss: dict | None = None,
             **search) -> SearchTrainer:
    d = copy.deepcopy(TINY)
    d["search"].update(search)
    d["loss"] = loss or d["loss"]
    d["run"].update(dir=str(tmp_path / name), nan_check=check)
    return SearchTrainer(config_from_dict(d), tmp_path / name)


def _fit(t: SearchTrainer) -> SearchTrainer:
    try:
        t.train()
    finally:
        close_logger(t.log)
    return t


def test_auto_defers_on_cuda_only_and_never_under_fp16():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not deferred_wanted("auto", cpu, "float32")
    assert deferred_wanted("auto", cuda, "float32") and deferred_wanted("auto", cuda, "bf16")
    assert not deferred_wanted("auto", cuda, "fp16")
    assert deferred_wanted("deferred", cpu, "float32")
    assert not deferred_wanted("step", cuda, "float32")


@pytest.mark.parametrize("mode, warmup", [  # the fair warm-up in the slow tier
    ("full", "mode"), ("reinforce", "mode"), pytest.param("full", "fair", marks=pytest.mark.slow)])
def test_a_deferred_search_equals_the_checked_one(tmp_path, mode, warmup):
    """Fused optimizers with the device-side skip against the per-step check: θ and every
    epoch's figures agree to float rounding (the kernels differ, not the algorithm: their
    weights part by ~1e-9 within a few steps, which the fair warm-up's three passes a step
    amplify to ~1e-3 in θ by the third epoch, so two epochs are compared; on an AMD EPYC host
    (2026-11-25) to 9.1e-4 already in the second, where θ's entries are ~7e-2: the fair
    warm-up's bound is 2e-3 absolute)."""
    rtol, atol, rel = (0.0, 2e-3, 1e-2) if warmup == "fair" else (1e-5, 1e-6, 1e-4)
    a = _fit(_trainer(tmp_path, "step", "step", mode=mode, warmup_sampling=warmup, epochs=2))
    b = _fit(_trainer(tmp_path, "deferred", "deferred", mode=mode, warmup_sampling=warmup,
                      epochs=2))
    assert b.guard.deferred and not a.guard.deferred
    assert all(g["fused"] for g in b.w_opt.param_groups + b.theta_opt.param_groups)
    for ta, tb in zip(a.net.theta, b.net.theta, strict=True):
        torch.testing.assert_close(ta, tb, rtol=rtol, atol=atol)
    for ra, rb in zip(a.history[1:], b.history[1:], strict=True):  # after the warm-up
        for k in ("w_ce", "w_acc", "theta_loss", "argmax_path_acc"):
            assert rb[k] == pytest.approx(ra[k], rel=rel, abs=1e-6), k


def test_a_run_checked_per_step_resumes_deferred(tmp_path):
    """run.nan_check may change on resume: the saved (unfused) optimizers load into fused
    kernels and the run ends where an uninterrupted deferred run does."""
    whole = _fit(_trainer(tmp_path, "whole", "deferred", mode="reinforce"))
    first = _trainer(tmp_path, "part", "step", mode="reinforce")
    try:
        first._run_epochs(2)
    finally:
        close_logger(first.log)
    d = copy.deepcopy(TINY)
    d["search"].update(mode="reinforce")
    d["run"].update(dir=str(tmp_path / "part"), nan_check="deferred")
    rest = _fit(SearchTrainer(config_from_dict(d), tmp_path / "part", resume=True))
    assert rest.guard.deferred and all(g["fused"] for g in rest.w_opt.param_groups)
    for ta, tb in zip(whole.net.theta, rest.net.theta, strict=True):
        torch.testing.assert_close(tb, ta, rtol=1e-5, atol=1e-6)


def test_a_deferred_stop_saves_the_state_from_before_the_bad_step(tmp_path):
    """An inf CE at weight step 3: the deferred check keeps computing until it reads the
    flags, but applies nothing from step 3 on, so its checkpoint holds the per-step check's
    parameters and momentum, at the same position."""
    saved, calls = {}, {}
    for check in ("step", "deferred"):
        t = _trainer(tmp_path, check, check, epochs=2)
        orig, calls[check] = t.loss.ce, 0

        def ce(logits, y, orig=orig, check=check):
            calls[check] += 1
            out = orig(logits, y)
            return out * float("inf") if calls[check] == 3 else out

        t.loss.ce = ce
        try:
            with pytest.raises(NonFiniteLoss, match=r"ce at epoch 1/2, w step 3"):
                t.train()
        finally:
            close_logger(t.log)
        saved[check] = load_checkpoint(tmp_path / check / "checkpoint.pt", kind="search")
    assert calls["step"] == 3 and calls["deferred"] > 3  # it did run past the bad step
    a, b = saved["step"], saved["deferred"]
    assert (b["epoch"], b["phase"], b["step"]) == (a["epoch"], a["phase"], a["step"]) \
        == (0, "w", 2)
    assert b["partial"]["weight"] == a["partial"]["weight"] == 2  # the applied steps
    for k, p in a["model"].items():  # BN running statistics kept moving: parameters only
        if k in b["model"] and "running" not in k and "num_batches" not in k:
            torch.testing.assert_close(b["model"][k], p, rtol=1e-5, atol=1e-6)
    mom_a = [s["momentum_buffer"] for s in a["w_opt"]["state"].values()]
    mom_b = [s["momentum_buffer"] for s in b["w_opt"]["state"].values()]
    assert len(mom_a) == len(mom_b) > 0
    for x, y in zip(mom_a, mom_b, strict=True):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6)


def test_a_deferred_skip_counts_and_leaves_the_means_of_the_good_steps(tmp_path):
    """Two non-finite θ steps skipped on the device: counted once polled, and the phase's
    mean is over the finite steps alone (a NaN would poison it)."""
    t = _trainer(tmp_path, "r", "deferred", nan_policy="skip", epochs=2)
    orig, n = t.loss.cost_term, itertools.count(1)

    def bad(cost):
        out = orig(cost)
        return out * float("nan") if next(n) in (1, 3) else out

    t.loss.cost_term = bad
    _fit(t)
    assert t.skipped_steps == 2
    rec = t.history[1]
    assert all(torch.isfinite(torch.tensor(rec[k])) for k in rec if k.startswith("theta_")
               and isinstance(rec[k], float))
    assert all(torch.isfinite(p).all() for p in t.model.parameters())


class _HostReads:
    """Counts reads of tensor values on the host (bool, int, float, item, tolist)."""

    NAMES = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist")

    def __init__(self, monkeypatch):
        self.n = 0
        for name in self.NAMES:
            real = getattr(torch.Tensor, name)

            def counted(t, *a, real=real, **kw):
                self.n += 1
                return real(t, *a, **kw)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("check, per_step", [("deferred", 0), ("step", 1)])
def test_the_full_mode_step_reads_nothing_back_under_the_deferred_check(
        tmp_path, monkeypatch, check, per_step):
    """The step path of `full` mode with the deferred check reads no tensor value on the host
    (on a GPU, each such read waits for the device); the per-step check reads at least one a
    step, which shows the counter sees them. (The FBNet and normalized losses also refuse a
    cost <= e / 1 by reading it, on CPU tensors alone: test_loss.py.)"""
    t = _trainer(tmp_path, "r", check, loss={"kind": "target", "target": "0.5x"}, epochs=2,
                 warmup_epochs=0)
    x = torch.randn(12, 1, 8, 8)
    y = torch.randint(0, 10, (12,))
    t.weight_step(x, y)  # first calls (optimizer state creation) outside the count
    t.theta_step(x, y)
    reads = _HostReads(monkeypatch)
    for _ in range(3):
        t.weight_step(x, y)
        t.theta_step(x, y)
    monkeypatch.undo()
    close_logger(t.log)
    if per_step:
        assert reads.n >= 6
    else:
        assert reads.n == 0


def test_one_poll_reads_the_flags_and_starts_again():
    """The guard alone: the first bad step and its terms, the count, then a clean slate."""

    class _Single:
        distributed = False

    g = NonFiniteGuard(True, "skip", torch.device("cpu"), _Single())
    ok, nan = torch.tensor(1.0), torch.tensor(float("nan"))
    assert not bool(g.check({"a": ok, "b": ok}, 0))
    assert bool(g.check({"a": ok, "b": nan}, 1))
    assert bool(g.check({"a": nan, "b": ok}, 2))
    f = g.poll()
    assert (f.count, f.first, f.terms) == (2, 1, ["b"])
    assert g.poll() is None
    stop = NonFiniteGuard(True, "stop", torch.device("cpu"), _Single())
    assert bool(stop.check({"a": nan}, 4))
    assert bool(stop.check({"a": ok}, 5))  # latched: every later update is skipped too
    assert stop.poll().first == 4


def test_an_unknown_nan_check_is_refused(tmp_path):
    d = copy.deepcopy(TINY)
    d["run"]["nan_check"] = "later"
    with pytest.raises(FbnasError, match=r"run.nan_check"):
        config_from_dict(d)


def test_a_torch_without_the_fused_skip_is_probed_and_refused(tmp_path, monkeypatch):
    """`fused_missing` probes what the deferred check relies on: where fused SGD is missing,
    or ignores found_inf, `run.nan_check: deferred` is refused in one line (auto falls back
    to the per-step check, on CUDA, the only place it defers)."""
    real = torch.optim.SGD

    class NoFused(real):
        def __init__(self, params, fused=None, **kw):
            if fused:
                raise RuntimeError("fused=True is not supported here")
            super().__init__(params, **kw)

    class Ignores(real):
        def step(self, closure=None):
            kept = self.__dict__.pop("found_inf", None)  # as if the kernel never read it
            try:
                return super().step(closure)
            finally:
                self.found_inf = kept

    assert fused_missing(torch.device("cpu")) is None
    monkeypatch.setattr(torch.optim, "SGD", Ignores)
    assert "does not honour found_inf" in fused_missing(torch.device("cpu"))
    monkeypatch.setattr(torch.optim, "SGD", NoFused)
    assert "SGD(fused=True): fused=True is not supported" in fused_missing(torch.device("cpu"))
    with pytest.raises(FbnasError, match=r"^run.nan_check: deferred needs fused optimizers .*"
                                         r"use step$"):
        _trainer(tmp_path, "r", "deferred")
    t = _trainer(tmp_path, "s", "step")  # the per-step check needs no fused kernel
    close_logger(t.log)
    assert not t.guard.deferred


@pytest.mark.parametrize("make", [torch.optim.SGD, torch.optim.AdamW])
def test_resumed_state_takes_the_parameters_layout_for_the_fused_kernels(make):
    """A checkpoint written with contiguous weights, resumed with channels_last (allowed on
    resume): load_state_dict keeps the saved buffers' layout, which the fused kernels misread
    (they assume parameter, gradient and state share strides); keep_fused re-lays them out, so
    a fused step equals the unfused one."""
    from fbnas.training._guard import keep_fused

    torch.manual_seed(0)
    kw = {"lr": 0.1, "momentum": 0.9} if make is torch.optim.SGD else {"lr": 0.1}
    w = torch.nn.Parameter(torch.randn(4, 3, 3, 3))
    old = make([w], **kw)
    for _ in range(2):
        w.grad = torch.randn_like(w)
        old.step()
    saved = copy.deepcopy(old.state_dict())
    start = w.detach().contiguous(memory_format=torch.channels_last)
    grad = torch.randn(4, 3, 3, 3).contiguous(memory_format=torch.channels_last)
    after = {}
    for fused in (False, True):
        p = torch.nn.Parameter(start.clone(memory_format=torch.channels_last))
        opt = make([p], fused=True, **kw) if fused else make([p], **kw)
        opt.load_state_dict(copy.deepcopy(saved))
        keep_fused(opt, fused)
        for v in opt.state[p].values():
            if isinstance(v, torch.Tensor) and v.shape == p.shape:
                assert v.stride() == p.stride()
        if "step" in opt.state[p]:
            assert opt.state[p]["step"].dtype == torch.float32
            assert opt.state[p]["step"].device == (p.device if fused else torch.device("cpu"))
        p.grad = grad.clone(memory_format=torch.channels_last)
        opt.step()
        after[fused] = p.detach()
    torch.testing.assert_close(after[True], after[False], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("check", ["step", "deferred"])
@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_a_finite_loss_with_a_nan_gradient_is_caught_before_the_update(tmp_path, check,
                                                                        policy):
    """The loss alone would let this step through and put NaN into every weight it reaches:
    the gradients' norm is checked too, so the step stops (or is skipped) like a NaN loss."""
    t = _trainer(tmp_path, "r", check, nan_policy=policy, epochs=2)
    orig, calls = t.loss.ce, itertools.count(1)

    def ce(logits, y):
        out = orig(logits, y)
        return nan_gradient(out) if next(calls) == 3 else out

    t.loss.ce = ce
    fit_through_a_bad_step(
        t, policy, r"non-finite gradient \(the loss was finite\) at epoch 1/2, w step 3",
        (0, "w", 2))


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: what this checks is that a CUDA step never waits")
def test_on_cuda_a_full_mode_step_never_synchronises_and_a_bad_one_stops(tmp_path):
    """On a GPU, `auto` defers; under torch's sync debug mode set to "error", any host read
    in 3 full-mode weight + θ steps raises. Then a NaN loss stops the run as on the CPU."""
    t = _trainer(tmp_path, "r", "auto", loss={"kind": "target", "target": "0.5x"}, epochs=2,
                 warmup_epochs=0, device="cuda")
    assert t.guard.deferred
    x = torch.randn(12, 1, 8, 8, device="cuda")
    y = torch.randint(0, 10, (12,), device="cuda")
    t.weight_step(x, y)
    t.theta_step(x, y)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            t.weight_step(x, y)
            t.theta_step(x, y)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    close_logger(t.log)
    u = _trainer(tmp_path, "nan", "auto", epochs=2, device="cuda")
    orig, calls = u.loss.ce, itertools.count(1)
    u.loss.ce = lambda logits, y: orig(logits, y) * (float("nan") if next(calls) == 3 else 1.0)
    fit_through_a_bad_step(u, "stop", r"ce at epoch 1/2, w step 3", (0, "w", 2))
