"""A layer's candidates computed together where they read the same input (issue 52 item 3,
fbnas.blocks.batched): the same outputs, gradients, running statistics and counts as one
candidate at a time, in float64, with fewer BatchNorm and convolution calls."""

import copy

import pytest
import torch
from conftest import TINY_SPACE, assert_same_grads_and_buffers
from torch.utils._python_dispatch import TorchDispatchMode

from fbnas.search.modes import MODES
from fbnas.search_space import SearchSpace
from fbnas.supernet import MixedOp, Supernet

# plain IRF of two kernels (batched), a grouped one with shuffle (alone), squeeze-excite and
# cascaded ones (batched up to their first depthwise stage), skip; stride 1 and 2 layers
SPACE = {**TINY_SPACE, "in_channels": 3,
         "candidates": ["ir_k3_e1", "ir_k5_e3", "ir_k3_e3", "ir_k5_e1", "ir_k3_e1_g2",
                        "ir_k3_e3_se", "ir_k33_e1", "skip"]}
FBNET = ["ir_k3_e1", "ir_k3_e1_g2", "ir_k3_e3", "ir_k3_e6", "ir_k5_e1", "ir_k5_e1_g2",
         "ir_k5_e3", "ir_k5_e6", "skip"]


def _one_by_one(net: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(net)
    for op in ref.modules():
        if isinstance(op, MixedOp):
            op.batches = None
    return ref


def _net(weights: str, channels_last: bool, ckpt: bool = False):
    torch.manual_seed(0)
    net = Supernet(SearchSpace.from_dict(SPACE), weights=weights,
                   checkpoint_activations=ckpt).double()
    with torch.no_grad():
        for t in net.theta:
            t.copy_(torch.randn(t.shape, dtype=t.dtype))
    assert all(op.batches is not None and op.batches.depthwise for op in net.mixed)
    ref = _one_by_one(net)
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    if channels_last:
        net, ref = (n.to(memory_format=torch.channels_last) for n in (net, ref))
        x = x.contiguous(memory_format=torch.channels_last)
    return net, ref, x


def _step(net, x, mode: str, seed: int, frozen: bool = False):
    torch.manual_seed(seed)
    s = net.sample_path(1.5, mode=mode)
    for p in net.weight_parameters():
        p.requires_grad_(not frozen)
    logits, cost = net(x, m=s.m, active=s.active, cost_m=s.cost_m)
    (logits.pow(2).sum() + cost).backward()
    for p in net.weight_parameters():
        p.requires_grad_(True)
    return logits.detach()


def _every_step_alike(net, ref, x, label: str = "") -> None:
    """Every mode's weight step and θ step (weights frozen) of `net` and `ref`: outputs, every
    gradient, θ's, running mean / var and num_batches_tracked equal."""
    for seed, mode in enumerate(MODES.choices()):
        for frozen in (False, True):
            net.zero_grad(), ref.zero_grad()
            got = _step(net, x, mode, seed, frozen)
            want = _step(ref, x, mode, seed, frozen)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=mode)
            assert_same_grads_and_buffers(net, ref, f"{label} {mode} frozen={frozen}")


@pytest.mark.parametrize("weights", ["separate", "shared"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_candidates_computed_together_change_nothing(weights, channels_last):
    """Every mode's weight step and θ step (weights frozen), then an eval forward: outputs,
    every gradient, θ's, running mean / var and num_batches_tracked equal; keys unchanged."""
    net, ref, x = _net(weights, channels_last)
    _every_step_alike(net, ref, x)
    net.eval(), ref.eval()
    with torch.no_grad():
        outs = []
        for n in (net, ref):
            torch.manual_seed(7)
            outs.append(n(x, tau=1.0)[0])
        torch.testing.assert_close(*outs, rtol=1e-12, atol=1e-12)
    assert net.state_dict().keys() == ref.state_dict().keys()


@pytest.mark.parametrize(("weights", "channels_last"), [("separate", False), ("shared", True)])
def test_cheap_recompute_changes_nothing(weights, channels_last):
    """search.checkpoint_activations: cheap (the convolutions' outputs kept, the rest
    recomputed in backward) against the same supernet storing everything: every mode's weight
    and θ step, outputs, gradients, running statistics and counts equal."""
    net, _, x = _net(weights, channels_last)
    ref = copy.deepcopy(net)
    net.checkpoint_activations = "cheap"
    assert net.checkpoint_activations == "cheap" and ref.checkpoint_activations is False
    _every_step_alike(net, ref, x, "cheap")


def test_recalibration_and_checkpointed_steps_keep_each_candidates_statistics():
    """BatchNorm re-estimated over the relaxation (a cumulative average: momentum None) and
    a step under activation checkpointing (statistics updated once, in the real forward)."""
    net, ref, x = _net("separate", False, ckpt=True)
    m = [torch.softmax(t.detach(), -1) for t in net.theta]
    for n in (net, ref):
        n.recalibrate_bn([x[:2], x[2:]], m, None)
    assert_same_grads_and_buffers(net, ref, "recalibrated")
    assert int(net.mixed[0].candidates[0].pw[1].num_batches_tracked) == 2
    for n in (net, ref):
        n.train()
    net.zero_grad(), ref.zero_grad()
    torch.testing.assert_close(_step(net, x, "full", 0), _step(ref, x, "full", 0),
                               rtol=1e-12, atol=1e-12)
    assert_same_grads_and_buffers(net, ref, "checkpointed")


class _Calls(TorchDispatchMode):
    """Counts BatchNorm and convolution calls (forward only)."""

    def __init__(self):
        super().__init__()
        self.bn = self.conv = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if "batch_norm" in name and "backward" not in name:
            self.bn += 1
        elif name in ("convolution", "mkldnn_convolution", "_convolution") or (
                "conv" in name and "backward" not in name and "depthwise" in name):
            self.conv += 1
        return func(*args, **(kwargs or {}))


def test_fbnets_candidates_take_fewer_batchnorm_calls():
    """One layer of FBNet's nine candidates, every one computed: 8 BatchNorm calls instead
    of 24 (67% fewer: the six plain expansions one, their depthwise stages one per kernel
    size, the eight projections one; the two grouped candidates' expansions and depthwise
    stages alone), and fewer convolutions."""
    op = MixedOp(FBNET, 16, 16, 1).train()
    x, m = torch.randn(2, 16, 8, 8), torch.softmax(torch.randn(len(FBNET)), 0)
    counts = []
    for o in (op, _one_by_one(op)):
        with _Calls() as c:
            o(x, m)
        counts.append((c.bn, c.conv))
    (bn, conv), (bn_ref, conv_ref) = counts
    assert bn_ref == 24 and bn == 8
    assert 1 - bn / bn_ref >= 0.40
    assert conv < conv_ref
