"""A MixedOp folds each candidate's weight m_i into the candidate's last BatchNorm (issue 52
item 2): the same values, gradients and running statistics as multiplying the output, without
a multiply over the activation or a copy of it kept for backward."""

import copy

import pytest
import torch
from conftest import TINY_SPACE, assert_same_grads_and_buffers
from torch.utils._python_dispatch import TorchDispatchMode

from fbnas.search.modes import MODES
from fbnas.search_space import SearchSpace
from fbnas.supernet import Supernet

# FBNet's kinds of candidate: plain, grouped with shuffle, squeeze-excite, cascaded, skip;
# a stride-1 layer that keeps its shape (the shared shortcut) and stride-2 ones (skip projects)
SPACE = {**TINY_SPACE, "in_channels": 3,
         "candidates": ["ir_k3_e1", "ir_k5_e3", "ir_k3_e1_g2", "ir_k3_e3_se", "ir_k33_e1",
                        "skip"]}


def _unfolded(net: Supernet) -> Supernet:
    """A copy that multiplies each candidate's output by m_i, as before the fold."""
    ref = copy.deepcopy(net)
    for op in ref.mixed:
        op.folds = [False] * len(op.folds)
    return ref


def _step(net: Supernet, x: torch.Tensor, mode: str, seed: int):
    torch.manual_seed(seed)
    s = net.sample_path(1.5, mode=mode)
    logits, cost = net(x, m=s.m, active=s.active, cost_m=s.cost_m)
    (logits.pow(2).sum() + cost).backward()
    return logits.detach()


@pytest.mark.parametrize("weights", ["separate", "shared"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_folding_m_into_the_last_batchnorm_changes_nothing(weights, channels_last):
    net = Supernet(SearchSpace.from_dict(SPACE), weights=weights).double()
    with torch.no_grad():
        for t in net.theta:
            t.copy_(torch.randn(t.shape, dtype=t.dtype))
    assert any(op.shortcut and all(op.folds) for op in net.mixed)  # the shared shortcut
    assert any(not op.shortcut and all(op.folds) for op in net.mixed)  # skip's projection
    ref = _unfolded(net)
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    if channels_last:
        net, ref = (n.to(memory_format=torch.channels_last) for n in (net, ref))
        x = x.contiguous(memory_format=torch.channels_last)
    for seed, mode in enumerate(MODES.choices()):
        net.zero_grad(), ref.zero_grad()
        got, want = _step(net, x, mode, seed), _step(ref, x, mode, seed)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=mode)
        assert_same_grads_and_buffers(net, ref, mode)
    assert net.state_dict().keys() == ref.state_dict().keys()


class _Muls(TorchDispatchMode):
    """Counts multiplies whose result is an activation (4-d)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mul, torch.ops.aten.mul_) \
                and isinstance(out, torch.Tensor) and out.dim() == 4:
            self.n += 1
        return out


def test_full_mode_mixes_without_multiplying_an_activation():
    net = Supernet(SearchSpace.from_dict(SPACE))
    x = torch.randn(2, 3, 16, 16)
    counts = []
    for n in (net, _unfolded(net)):
        with _Muls() as c:
            n(x, tau=1.0)[0].sum().backward()
        counts.append(c.n)
    # what is left: squeeze-excite's gate (x · gate) in each layer, forward and backward
    ses = len(net.mixed)
    branches = sum(len(op.candidates) - (1 if op.shortcut else 0) for op in net.mixed)
    assert counts[0] <= 3 * ses
    assert counts[1] >= counts[0] + branches  # m_i · f_i(x), once per branch, gone
