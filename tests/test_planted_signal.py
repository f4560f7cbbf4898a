"""θ ranks operations by accuracy: a planted candidate that outputs zeros in layers without a
shortcut must lose probability under a cost-blind search (`loss.kind: ce`), with both weight
options: strongly in `reinforce` (the quickstart's mode), weakly through the relaxations of
`full` and `two_path` (issue 25's planted-signal test)."""

import copy

import pytest
import torch
from conftest import digits_run_config
from torch import nn

from fbnas.blocks import register_block
from fbnas.blocks.registry import BLOCKS
from fbnas.config import config_from_dict
from fbnas.run import close_logger
from fbnas.trainer import SearchTrainer


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


def _search(tmp_path, mode, weights, epochs=6):
    d = digits_run_config(
        space=PLANTED, data={"limit": 1000, "batch_size": 32, "val_fraction": 0.0},
        loss={"kind": "ce"},
        search={"mode": mode, "weights": weights, "epochs": epochs, "warmup_epochs": 2,
                "w_lr": 0.2, "theta_lr": 0.1, "tau0": 2.0, "seed": 0})
    for k in ("alpha", "beta"):
        d["loss"].pop(k, None)
    d["run"]["dir"] = str(tmp_path / "run")
    t = SearchTrainer(config_from_dict(copy.deepcopy(d), "planted.yaml"), tmp_path / "run")
    try:
        t.fit()
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
def test_relaxations_move_theta_away_from_the_zero_op_weakly(tmp_path, zero_op, mode,
                                                             weights):
    """Through a relaxation the zero op only rescales the mixture, which the next BatchNorm
    undoes, so what θ hears is weak (docs/search_modes.md): on average over the layers the
    zero op still loses probability, and it is the argmax of no layer. (`single_path`'s
    straight-through gradient is 0 for it in these layers without a shortcut: GDAS cannot see
    it, which is why the quickstart searches with `reinforce`.)"""
    probs = _search(tmp_path, mode, weights, epochs=9)
    assert sum(p[2] for p in probs) / len(probs) < 0.32, probs
    for layer, p in enumerate(probs):
        assert p[2] < max(p[:2]), (layer, probs)


def _theta_grads(tmp_path, mode: str) -> list[torch.Tensor]:
    """θ's gradients of one θ step (loss.kind: ce) on the planted space's first θ batch."""
    d = digits_run_config(
        space=PLANTED, data={"limit": 400, "batch_size": 32, "val_fraction": 0.0},
        loss={"kind": "ce"}, search={"mode": mode, "epochs": 2, "warmup_epochs": 1, "seed": 0})
    for k in ("alpha", "beta"):
        d["loss"].pop(k, None)
    d["run"]["dir"] = str(tmp_path / mode)
    t = SearchTrainer(config_from_dict(copy.deepcopy(d), "planted.yaml"), tmp_path / mode)
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
