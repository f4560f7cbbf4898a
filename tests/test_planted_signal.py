"""θ ranks operations by accuracy: a planted bad candidate must lose probability under a
cost-blind search (`loss.kind: ce`), with both weight options (issue 25's planted-signal test,
made able to fail for its reason in issue 39).

- `reinforce` compares single paths' accuracy: a candidate that outputs zeros loses.
- The relaxations (`full`, `two_path`) cannot hear a zero candidate in a layer without a
  shortcut that feeds a conv + BatchNorm: the mixture's scale is invisible downstream, so
  ⟨∂L/∂y, y⟩ = 0 and ∂L/∂θ_zero = m_zero·(⟨∂L/∂y, 0⟩ − ⟨∂L/∂y, y⟩) = 0, and the layer's θ
  gradients sum to 0: the zero op's probability gets no CE signal at first order (asserted
  below). Their planted candidate is one they can hear: a real block whose output is sent to
  the wrong images (rolled by one along the batch), worse but not zero."""

import copy

import pytest
import torch
from conftest import digits_run_config
from torch import nn

from fbnas.blocks import build_block, register_block
from fbnas.blocks.registry import BLOCKS
from fbnas.config import config_from_dict
from fbnas.search.modes import get_mode
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger


class Zero(nn.Module):
    """A crippled candidate: zeros of the layer's output shape, whatever comes in. In a layer
    without a shortcut (the channels change) a path through it carries nothing upwards."""

    def __init__(self, c_out: int, stride: int):
        super().__init__()
        self.c_out, self.stride = c_out, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        s = self.stride
        return x.new_zeros(n, self.c_out, (h + s - 1) // s, (w + s - 1) // s)


class Misrouted(nn.Module):
    """A crippled candidate that is not zero: an `ir_k3_e1` block whose output goes to the
    next image of the batch (rolled by one), so what it adds belongs to another picture."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.block = build_block("ir_k3_e1", c_in, c_out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x).roll(1, dims=0)


@pytest.fixture
def misrouted_op():
    register_block("test_misrouted")(lambda c_in, c_out, stride: Misrouted(c_in, c_out, stride))
    yield "test_misrouted"
    BLOCKS.unregister("test_misrouted")


@pytest.fixture
def zero_op():
    register_block("test_zero")(lambda c_in, c_out, stride: Zero(c_out, stride))
    yield "test_zero"
    BLOCKS.unregister("test_zero")


# 8x8 digits, two searchable layers that change the channel count (no shortcut); the
# crippled op is the last candidate
PLANTED = {
    "name": "planted", "input_size": 8, "in_channels": 1, "num_classes": 10,
    "stem": {"channels": 8, "stride": 1},
    "candidates": ["ir_k3_e1", "ir_k3_e3", "test_zero"],
    "stages": [{"channels": 16, "repeats": 1, "stride": 1},
               {"channels": 24, "repeats": 1, "stride": 2}],
    "head": {"channels": 32},
}


def _search(tmp_path, mode, weights, epochs=6, bad="test_zero"):
    space = {**PLANTED, "candidates": [*PLANTED["candidates"][:2], bad]}
    d = digits_run_config(
        space=space, data={"limit": 1000, "batch_size": 32, "val_fraction": 0.0},
        loss={"kind": "ce"},
        search={"mode": mode, "weights": weights, "epochs": epochs, "warmup_epochs": 2,
                "w_lr": 0.2, "theta_lr": 0.1, "tau0": 2.0, "seed": 0})
    for k in ("alpha", "beta"):
        d["loss"].pop(k, None)
    d["run"]["dir"] = str(tmp_path / "run")
    t = SearchTrainer(config_from_dict(copy.deepcopy(d), "planted.yaml"), tmp_path / "run")
    try:
        t.train()
    finally:
        close_logger(t.log)
    return [p.tolist() for p in t.model.probabilities()]


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["separate", "shared"])
def test_reinforce_moves_theta_away_from_a_candidate_that_outputs_zeros(tmp_path, zero_op,
                                                                         weights):
    """The score function compares the accuracy of single paths: the zero op loses in every
    layer, from 1/3 to below 1/4, and is nowhere the argmax."""
    probs = _search(tmp_path, "reinforce", weights)
    for layer, p in enumerate(probs):
        assert p[2] < 0.25, (layer, probs)
        assert p[2] < max(p[:2]), (layer, probs)


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["separate", "shared"])
@pytest.mark.parametrize("mode", ["full", "two_path"])
def test_relaxations_move_theta_away_from_a_misrouted_candidate(tmp_path, misrouted_op, mode,
                                                               weights):
    """A candidate whose output belongs to other images loses in every layer, from 1/3 to
    below 1/4, and is nowhere the argmax."""
    probs = _search(tmp_path, mode, weights, epochs=9, bad=misrouted_op)
    for layer, p in enumerate(probs):
        assert p[2] < 0.25, (layer, probs)
        assert p[2] < max(p[:2]), (layer, probs)


@pytest.mark.parametrize("mode", ["full", "two_path"])
def test_relaxations_hear_no_ce_of_a_zero_candidate_behind_batchnorm(tmp_path, zero_op, mode):
    """Why the relaxations' planted candidate is not the zero op: in these layers its θ's CE
    gradient is 0 and the layer's θ gradients sum to 0 (BatchNorm's scale invariance), while
    the other candidates' θ do hear CE."""
    grads = _theta_grads(tmp_path, mode)
    size = max(float(g.abs().max()) for g in grads if g is not None)
    assert size > 1e-5
    for g in grads:
        if g is None:
            continue
        assert abs(float(g[2])) < 1e-3 * size, grads  # the zero op: nothing
        assert abs(float(g.sum())) < 1e-3 * size, grads  # no first-order shift toward it


def _theta_grads(tmp_path, mode: str) -> list[torch.Tensor]:
    """θ's gradients of one θ step (loss.kind: ce) on the planted space's first θ batch, the
    paths drawn by `mode`'s sampler (single_path's too, which search.mode refuses)."""
    d = digits_run_config(
        space=PLANTED, data={"limit": 400, "batch_size": 32, "val_fraction": 0.0},
        loss={"kind": "ce"}, search={"mode": "full" if get_mode(mode).refused else mode,
                                     "epochs": 2, "warmup_epochs": 1, "seed": 0})
    for k in ("alpha", "beta"):
        d["loss"].pop(k, None)
    d["run"]["dir"] = str(tmp_path / mode)
    t = SearchTrainer(config_from_dict(copy.deepcopy(d), "planted.yaml"), tmp_path / mode)
    t.net.mode = mode
    try:
        for x, y in t.data.w_loader:  # a few weight steps, so the paths compute something
            t.weight_step(x, y)
        x, y = next(iter(t.data.theta_loader))
        t.theta_opt.zero_grad()
        t.model.train()
        p = t._sample()
        logits, _ = t.model(x, m=p.m, active=p.active, cost_m=p.cost_m)
        ce = torch.nn.functional.cross_entropy(logits, y)
        return list(torch.autograd.grad(ce, t.net.arch_parameters(), allow_unused=True))
    finally:
        close_logger(t.log)


def test_single_path_hears_no_ce_behind_batchnorm(tmp_path, zero_op):
    """Why `single_path` is not in the planted tests: a layer that feeds a convolution and a
    BatchNorm (every searchable layer here) is invariant to the scale of its output, and the
    straight-through estimator only rescales the one sampled output (by m = 1 in value), so
    ∂CE/∂θ = ⟨∂CE/∂y, y⟩·∂m/∂θ = 0 up to BatchNorm's eps: GDAS's θ hears the cost term and
    nothing of CE in such a chain (docs/search_modes.md). The same step in `full` does."""
    single = _theta_grads(tmp_path, "single_path")
    full = _theta_grads(tmp_path, "full")
    size = max(float(g.abs().max()) for g in full if g is not None)
    assert size > 1e-5  # full's θ hears CE ...
    # ... single_path's at least 100x less (BatchNorm's eps; 1e-11 to 1e-7 here)
    assert all(g is None or float(g.abs().max()) < 1e-2 * size for g in single), single
