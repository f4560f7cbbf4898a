import math

import numpy as np
import pytest
import torch

from fbnas.errors import FbnasError
from fbnas.supernet import Supernet


def test_forward_shapes_and_cost(tiny_space):
    costs = [{"ir_k3_e1": 10.0, "ir_k5_e3": 30.0, "skip": 1.0}] * tiny_space.num_layers
    net = Supernet(tiny_space, costs, fixed_cost=5.0)
    logits, cost = net(torch.randn(4, 3, 16, 16), tau=1.0)
    assert logits.shape == (4, 5)
    assert cost.shape == () and 3 * 1.0 + 5 <= cost.item() <= 3 * 30.0 + 5


def test_expected_cost_is_the_hand_computed_sum(tiny_space):
    costs = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [100.0, 200.0, 300.0]]
    net = Supernet(tiny_space, costs, fixed_cost=7.0)
    m = [torch.tensor([0.2, 0.3, 0.5]), torch.tensor([1.0, 0.0, 0.0]),
         torch.tensor([0.1, 0.1, 0.8])]
    expected = (0.2 + 0.6 + 1.5) + 10.0 + (10 + 20 + 240) + 7.0
    _, cost = net(torch.randn(1, 3, 16, 16), m=m)
    assert float(cost) == pytest.approx(expected)
    assert net.cost_bounds() == pytest.approx((1 + 10 + 100 + 7, 3 + 30 + 300 + 7))


def test_arch_and_weight_parameters_are_disjoint_and_complete(tiny_space):
    net = Supernet(tiny_space)
    arch = {id(p) for p in net.arch_parameters()}
    weights = {id(p) for p in net.weight_parameters()}
    assert arch and weights and not arch & weights
    assert arch | weights == {id(p) for p in net.parameters()}
    assert len(arch) == tiny_space.num_layers


def test_hard_samples_are_one_hot_and_pass_gradients(tiny_space):
    costs = [[1.0, 2.0, 3.0]] * 3
    net = Supernet(tiny_space, costs)
    with torch.no_grad():
        for t in net.theta:
            t.copy_(torch.randn(3))
    m = net.sample_weights(tau=0.5, hard=True)
    for mi in m:
        assert sorted(mi.tolist()) == [0.0, 0.0, 1.0]
    logits, cost = net(torch.randn(2, 3, 16, 16), m=m)
    (logits.square().mean() + cost).backward()
    for t in net.theta:
        assert t.grad is not None and t.grad.abs().sum() > 0


def test_hard_sample_frequencies_match_softmax_theta(tiny_space):
    from scipy import stats  # 0.6 s: not at collection

    torch.manual_seed(1234)
    net = Supernet(tiny_space)
    theta = torch.tensor([1.5, 0.0, -1.0])
    with torch.no_grad():
        net.theta[0].copy_(theta)
    n = 6000
    counts = np.zeros(3)
    for _ in range(n):
        counts[int(net.sample_weights(tau=2.0, hard=True)[0].argmax())] += 1
    expected = torch.softmax(theta.double(), -1).numpy() * n
    chi2, p = stats.chisquare(counts, expected)
    assert p > 0.01, (counts, expected)
    # and a clearly wrong distribution is rejected by the same test
    assert stats.chisquare(counts, np.full(3, n / 3))[1] < 1e-6


def test_uniform_theta_has_maximal_entropy(tiny_space):
    net = Supernet(tiny_space)
    ent = net.entropy()
    for e, cands in zip(ent, tiny_space.layer_candidates(), strict=True):
        assert float(e) == pytest.approx(math.log(len(cands)))
    with torch.no_grad():
        net.theta[0].copy_(torch.tensor([5.0, 0.0, 0.0]))
    assert float(net.entropy()[0]) < math.log(3) - 0.1



def test_zero_temperature_is_refused(tiny_space):
    with pytest.raises(FbnasError, match="temperature"):
        Supernet(tiny_space).sample_weights(0.0)


@pytest.mark.parametrize("costs,match", [
    ([[1.0, 2.0, 3.0]] * 2, "2 rows for 3 layers"),
    ([{"ir_k3_e1": 1.0, "skip": 1.0}] * 3, "no cost for op 'ir_k5_e3'"),
    ([[1.0, 2.0]] * 3, "2 costs for 3 candidates"),
    ([[1.0, -2.0, 3.0]] * 3, "negative or non-finite"),
])
def test_bad_cost_tables(tiny_space, costs, match):
    with pytest.raises(FbnasError, match=match):
        Supernet(tiny_space, costs)


def test_module_moves_with_to_and_has_no_cuda_calls(tiny_space):
    import ast
    import inspect

    import fbnas.supernet

    tree = ast.parse(inspect.getsource(fbnas.supernet))
    calls = [n.func.attr for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    assert "cuda" not in calls
    net = Supernet(tiny_space, [[1.0, 2.0, 3.0]] * 3).to(torch.float64)
    logits, cost = net(torch.randn(1, 3, 16, 16, dtype=torch.float64))
    assert logits.dtype == torch.float64


def test_active_paths_match_the_full_sum_with_one_hot_weights(tiny_space):
    net = Supernet(tiny_space).eval()
    x = torch.randn(2, 3, 16, 16)
    m = [torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.0, 0.0, 1.0]),
         torch.tensor([1.0, 0.0, 0.0])]
    full, c_full = net(x, m=m)
    part, c_part = net(x, m=m, active=[[1], [2], [0]])
    torch.testing.assert_close(full, part)
    assert float(c_full) == float(c_part)


def test_bn_recalibration_matches_the_path_statistics(tiny_space):
    torch.manual_seed(0)
    net = Supernet(tiny_space)
    x = torch.randn(512, 3, 16, 16) * 3 + 1
    # BN statistics from training on the mixture of paths ...
    with torch.no_grad():
        for _ in range(5):
            net(x[:64], tau=1.0)
    m = [torch.tensor([0.0, 1.0, 0.0])] * 3
    active = [[1]] * 3
    net.train()
    with torch.no_grad():
        target = net(x, m=m, active=active)[0]  # batch statistics of this path
    net.eval()
    with torch.no_grad():
        before = net(x, m=m, active=active)[0]
    used = net.recalibrate_bn([x[:256], x[256:]], m, active)
    assert used == 512 and not net.training
    with torch.no_grad():
        after = net(x, m=m, active=active)[0]
    err_before = (before - target).abs().max().item()
    err_after = (after - target).abs().max().item()
    assert err_after < 0.05 * err_before
    assert all(b.momentum == 0.1 for b in net.modules() if isinstance(b, torch.nn.BatchNorm2d))
