"""search.mode (full / single_path / two_path) and search.checkpoint_activations."""

import contextlib
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_SPACE, count_candidate_calls, digits_run_config

from fbnas import supernet as supernet_mod
from fbnas.config import SearchConfig, config_from_dict
from fbnas.errors import FbnasError
from fbnas.search.modes import MODES, get_mode, theta_modes
from fbnas.search_space import SearchSpace
from fbnas.supernet import Supernet
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger

COSTS = [[1.0, 5.0, 2.0], [3.0, 8.0, 1.0], [2.0, 4.0, 9.0]]
PATHS_PER_LAYER = {"single_path": 1, "two_path": 2, "full": 3, "reinforce": 1}
# modes whose θ gradient flows through the relaxation m (a scored mode estimates it instead)
RELAXED = [m for m in MODES.choices() if not get_mode(m).score_paths]

# the tiny search of tests/test_trainer.py
TINY = digits_run_config(data={"limit": 300}, search={"w_lr": 0.05, "theta_lr": 0.05})


def make_cfg(tmp_path, **search):
    d = copy.deepcopy(TINY)
    d["search"].update(search)
    d["run"]["dir"] = str(tmp_path / "run")
    return config_from_dict(d, "tiny.yaml")


def random_theta(net: Supernet) -> None:
    with torch.no_grad():
        for t in net.theta:
            t.copy_(torch.randn(len(t)))


@pytest.mark.parametrize("mode", MODES.choices())
def test_only_the_sampled_candidates_run(tiny_space, mode):
    net = Supernet(tiny_space, COSTS, mode=mode)
    random_theta(net)
    calls = count_candidate_calls(net)
    for _ in range(5):
        for c in calls:
            c[:] = [0] * len(c)
        p = net.sample_path(tau=1.0)
        net(torch.randn(2, 3, 16, 16), m=p.m, active=p.active, cost_m=p.cost_m)
        for li, c in enumerate(calls):
            assert sum(c) == PATHS_PER_LAYER[mode] and max(c) == 1, (li, c)
            if p.active is not None:
                assert [i for i, n in enumerate(c) if n] == sorted(p.active[li])
        # the same through forward's own sampling
        for c in calls:
            c[:] = [0] * len(c)
        net(torch.randn(2, 3, 16, 16), tau=1.0)
        assert all(sum(c) == PATHS_PER_LAYER[mode] for c in calls)


@pytest.mark.parametrize("mode", ["single_path", "two_path"])
def test_weights_of_the_sampled_paths(tiny_space, mode):
    net = Supernet(tiny_space, COSTS, mode=mode)
    random_theta(net)
    p = net.sample_path(tau=0.7)
    for t, m, act, cm in zip(net.theta, p.m, p.active, p.cost_m, strict=True):
        off = [i for i in range(len(t)) if i not in act]
        assert all(float(m.detach()[i]) == 0.0 for i in off)
        if mode == "single_path":
            assert m.tolist() == F.one_hot(torch.tensor(act[0]), 3).float().tolist()
            assert cm is m
        else:
            assert len(set(act)) == 2
            torch.testing.assert_close(m[act], torch.softmax(t.detach()[act], -1))
            torch.testing.assert_close(cm, torch.softmax(t.detach(), -1))


def test_single_path_forward_equals_full_hard_forward(tiny_space):
    """Same one-hot weights: computing only the sampled path gives the full mode's logits."""
    net = Supernet(tiny_space, COSTS).eval()
    random_theta(net)
    x = torch.randn(2, 3, 16, 16)
    p = net.sample_path(tau=1.0, mode="single_path")
    part, c_part = net(x, m=p.m, active=p.active)
    full, c_full = net(x, m=[m.detach() for m in p.m])
    torch.testing.assert_close(part, full)
    assert float(c_part.detach()) == pytest.approx(float(c_full))


@pytest.mark.parametrize("mode", RELAXED)
def test_theta_gets_a_gradient_from_the_loss(tiny_space, mode):
    """Every layer's θ gets a CE gradient, except in single_path where the sampled candidate
    of a shared-shortcut layer is the identity `skip` (x + 0: nothing to learn from)."""
    net = Supernet(tiny_space, COSTS, mode=mode)
    skip = tiny_space.layer_candidates()[0].index("skip")
    seen_identity = False
    for _ in range(8):
        random_theta(net)
        net.zero_grad(set_to_none=True)
        p = net.sample_path(tau=1.0)
        logits, _ = net(torch.randn(4, 3, 16, 16), m=p.m, active=p.active, cost_m=p.cost_m)
        F.cross_entropy(logits, torch.tensor([0, 1, 2, 3])).backward()
        for li, (t, op) in enumerate(zip(net.theta, net.mixed, strict=True)):
            if mode == "single_path" and op.shortcut and p.active[li] == [skip]:
                seen_identity = True
                assert t.grad is None or not t.grad.any(), li
                continue
            assert t.grad is not None and torch.isfinite(t.grad).all()
            assert t.grad.abs().sum() > 0, (li, p.active)
    assert seen_identity or mode != "single_path"  # the exception was exercised


def _mix_reference(op, x, m):
    """Σ_i m_i · b_i(x) with each candidate's own shortcut: the unfactored mixture."""
    return sum(mi * b(x) for mi, b in zip(m, op.candidates, strict=True))


def test_shared_shortcut_layers_are_the_shape_keeping_ones(tiny_space):
    net = Supernet(tiny_space, COSTS)
    assert [op.shortcut for op in net.mixed] == [True, False, True]  # 8->8, 8->16 s2, 16->16


@pytest.mark.parametrize("mode", ["full", "two_path"])
def test_shared_shortcut_keeps_value_and_theta_gradient_of_the_plain_mixture(tiny_space,
                                                                             mode):
    """x + Σ m_i f_i(x) equals Σ m_i (x + f_i(x)) when Σ m_i = 1, and so does the θ gradient
    (the x term's gradient is x · Σ_i ∂m_i/∂θ = 0): full and two_path are unchanged by it."""
    net = Supernet(tiny_space, COSTS, mode=mode).eval()
    random_theta(net)
    op = net.mixed[0]
    x = torch.randn(2, 8, 8, 8)
    for _ in range(3):
        p = net.sample_path(tau=0.8)
        m = p.m[0]
        got = op(x, m, None if p.active is None else p.active[0])
        want = _mix_reference(op, x, m)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        g = torch.randn_like(got)
        (g_got,) = torch.autograd.grad((got * g).sum(), net.theta[0], retain_graph=True)
        (g_want,) = torch.autograd.grad((want * g).sum(), net.theta[0])
        torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-5)


def test_single_path_theta_learns_in_shortcut_layers_where_bn_hid_the_plain_mixture(
        tiny_space):
    """single_path computes one candidate: with the plain mixture m_i · b_i(x) the CE only sees
    m_i as a scale of layer 0's whole output, which layer 1's conv + BatchNorm (batch
    statistics) undoes, so θ_0's straight-through gradient is ~0; with the shared shortcut
    x + m_i · f_i(x) it is not."""
    net = Supernet(tiny_space, COSTS, mode="single_path").train()
    random_theta(net)
    x, y = torch.randn(16, 3, 16, 16), torch.randint(0, 5, (16,))
    norms = {True: [], False: []}
    for shared in (True, False):
        net.mixed[0].shortcut = shared
        torch.manual_seed(3)
        for _ in range(12):
            p = net.sample_path(tau=1.0)
            if p.active[0] == [2]:  # skip: no branch, nothing to compare
                continue
            logits, _ = net(x, m=p.m, active=p.active)
            (g,) = torch.autograd.grad(F.cross_entropy(logits, y), net.theta[0])
            norms[shared].append(float(g.norm()))
    assert norms[True] and len(norms[True]) == len(norms[False])  # the same draws, paired
    for shared, plain in zip(norms[True], norms[False], strict=True):
        assert shared > 0 and plain < 1e-2 * shared, (shared, plain)


@pytest.mark.parametrize("mode", MODES.choices())
def test_cost_gradient_reaches_every_theta_entry(tiny_space, mode):
    net = Supernet(tiny_space, COSTS, mode=mode)
    random_theta(net)
    for _ in range(3):
        p = net.sample_path(tau=1.0)
        cost = net.expected_cost(p.cost_m)
        grads = torch.autograd.grad(cost, net.arch_parameters())
        for g in grads:
            assert (g != 0).all(), (mode, g)


def test_two_path_samples_without_replacement_from_softmax_theta():
    """P(i is one of the two) = p_i + Σ_{j≠i} p_j p_i / (1 − p_j) for sampling w/o replacement.
    The n draws are one sample of n layers that all hold this θ (layers draw independently)."""
    from scipy import stats  # 0.6 s: not at collection

    torch.manual_seed(7)
    theta = torch.tensor([1.5, 0.0, -1.0])
    n = 4000
    pairs = {(0, 1): 0, (0, 2): 0, (1, 2): 0}
    with torch.no_grad():
        for active in get_mode("two_path").sample([theta.clone() for _ in range(n)], 1.0,
                                                  False).active:
            pairs[tuple(active)] += 1
    p = torch.softmax(theta.double(), -1).tolist()

    def pair_prob(i, j):
        return p[i] * p[j] / (1 - p[i]) + p[j] * p[i] / (1 - p[j])

    expected = np.array([pair_prob(i, j) for i, j in pairs]) * n
    assert expected.sum() == pytest.approx(n)
    assert stats.chisquare(list(pairs.values()), expected)[1] > 0.01, (pairs, expected)


def test_bad_mode_is_an_error_naming_the_key(tiny_space):
    d = copy.deepcopy(TINY)
    d["search"]["mode"] = "three_path"
    choices = ", ".join(MODES.choices())
    with pytest.raises(FbnasError, match=rf"search\.mode: must be one of {choices}; "
                                         r"got 'three_path'"):
        config_from_dict(d, "tiny.yaml")
    d["search"]["mode"] = "single_path"
    d["search"]["checkpoint_activations"] = "yes"
    with pytest.raises(FbnasError, match=r"search\.checkpoint_activations: expected true, "
                                         "false or cheap, got 'yes'"):
        config_from_dict(d, "tiny.yaml")
    d["search"]["checkpoint_activations"] = 1
    with pytest.raises(FbnasError, match=r"search\.checkpoint_activations: expected true, "
                                         "false or cheap, got 1"):
        config_from_dict(d, "tiny.yaml")
    with pytest.raises(FbnasError, match=r"search\.mode: unknown search mode 'sampled' \(choose "
                                         r"from full, single_path, two_path"):
        Supernet(tiny_space, mode="sampled")


def test_config_defaults_and_round_trip():
    """The defaults are the recommended search (shared weights, θ by score function, single
    weight paths and a uniform one beside them); the tests' configs pin FBNet's own."""
    s = SearchConfig()
    assert (s.mode, s.weights, s.weight_sampling, s.uniform_paths) == (
        "reinforce", "shared", "single_path", 1)
    cfg = config_from_dict(copy.deepcopy(TINY))
    assert cfg.search.mode == "full" and cfg.search.checkpoint_activations is False
    d = copy.deepcopy(TINY)
    d["search"].update(mode="two_path", checkpoint_activations=True)
    cfg = config_from_dict(d)
    again = config_from_dict(cfg.resolved())
    assert again.search.mode == "two_path" and again.search.checkpoint_activations is True
    d["search"]["checkpoint_activations"] = "cheap"
    again = config_from_dict(config_from_dict(d).resolved())
    assert again.search.checkpoint_activations == "cheap"


# ---- activation checkpointing ---------------------------------------------------------------

def _step(net: Supernet, x, y, p):
    logits, cost = net(x, m=p.m, active=p.active, cost_m=p.cost_m)
    loss = F.cross_entropy(logits, y) + 0.01 * cost
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("how", [True, "cheap"])
@pytest.mark.parametrize("mode", MODES.choices())
def test_checkpointing_gives_the_same_loss_grads_and_bn_statistics(tiny_space, mode, how):
    torch.manual_seed(0)
    plain = Supernet(tiny_space, COSTS, mode=mode)
    random_theta(plain)
    ckpt = copy.deepcopy(plain)
    ckpt.checkpoint_activations = how
    assert ckpt.checkpoint_activations == how and not plain.checkpoint_activations
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 5, (8,))
    for step in range(2):
        torch.manual_seed(100 + step)
        p_plain = plain.sample_path(tau=1.0)
        torch.manual_seed(100 + step)
        p_ckpt = ckpt.sample_path(tau=1.0)
        assert p_plain.active == p_ckpt.active
        plain.zero_grad(set_to_none=True)
        ckpt.zero_grad(set_to_none=True)
        la, lb = _step(plain, x, y, p_plain), _step(ckpt, x, y, p_ckpt)
        torch.testing.assert_close(la, lb, rtol=0, atol=1e-6)
        for (name, a), b in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
            assert (a.grad is None) == (b.grad is None), name
            if a.grad is not None:
                torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-6, msg=name)
        for (name, a), b in zip(plain.named_buffers(), ckpt.buffers(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
        with torch.no_grad():  # move the weights so the second step sees new activations
            for a, b in zip(plain.parameters(), ckpt.parameters(), strict=True):
                if a.grad is not None:
                    a -= 0.1 * a.grad
                    b -= 0.1 * b.grad
    nbt = [int(b.num_batches_tracked) for b in ckpt.modules()
           if isinstance(b, torch.nn.BatchNorm2d) and int(b.num_batches_tracked)]
    assert nbt and set(nbt) <= {1, 2}  # once per forward that used the layer, never recomputed
    plain.eval()
    ckpt.eval()
    xe = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        top = [int(t.argmax()) for t in plain.theta]
        torch.testing.assert_close(plain(xe, m=plain.path(top)[0])[0],
                                   ckpt(xe, m=ckpt.path(top)[0])[0], rtol=0, atol=1e-6)


def test_checkpointing_recomputes_and_the_bn_guard_is_what_keeps_statistics(tiny_space,
                                                                          monkeypatch):
    """Without the guard the recompute in backward would update BN statistics a second time
    (so the test above would catch a broken guard)."""
    net = Supernet(tiny_space, COSTS, checkpoint_activations=True)
    calls = count_candidate_calls(net)
    m = [torch.tensor([0.2, 0.3, 0.5])] * 3
    x = torch.randn(4, 3, 16, 16)
    logits, _ = net(x, m=m)
    assert all(c == [1, 1, 1] for c in calls)
    logits.sum().backward()
    # recomputed in backward, each candidate at most once; where the recompute stops is
    # torch's early stop (once backward has every tensor it needs again: the identity `skip`
    # under a shared shortcut saves nothing, and with m_i folded into the last BatchNorm
    # fewer tensors are saved after a layer's first candidate)
    assert [op.shortcut for op in net.mixed] == [True, False, True]
    assert all(c[0] == 2 and set(c) <= {1, 2} for c in calls), calls
    first_bn = net.mixed[0].candidates[0].pw[1]
    assert int(first_bn.num_batches_tracked) == 1
    monkeypatch.setattr(supernet_mod, "_bn_stats_frozen", lambda _m: contextlib.nullcontext())
    net(x, m=m)[0].sum().backward()
    assert int(first_bn.num_batches_tracked) == 3  # this forward, and again in the recompute


def test_no_checkpointing_in_eval_or_without_grad(tiny_space):
    net = Supernet(tiny_space, COSTS, checkpoint_activations=True)
    calls = count_candidate_calls(net)
    m = [torch.tensor([0.2, 0.3, 0.5])] * 3
    with torch.no_grad():
        net(torch.randn(2, 3, 16, 16), m=m)
    net.eval()
    net(torch.randn(2, 3, 16, 16), m=m)[0].sum().backward()
    assert all(c == [2, 2, 2] for c in calls)


# ---- the trainer ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", theta_modes())
def test_trainer_steps_compute_only_the_sampled_paths(tmp_path, mode):
    t = SearchTrainer(make_cfg(tmp_path, mode=mode), tmp_path / "run")
    try:
        assert t.model.mode == mode
        calls = count_candidate_calls(t.model)
        x, y = next(iter(t.data.w_loader))
        theta0 = [p.detach().clone() for p in t.model.arch_parameters()]
        out = t.weight_step(x, y)
        assert set(out) == {"ce", "acc", "cost"}
        # the step's figures stay on the device (float64, detached): no host sync per step
        assert all(isinstance(v, torch.Tensor) and v.dtype == torch.float64
                   and not v.requires_grad for v in out.values())
        assert all(sum(c) == PATHS_PER_LAYER[mode] for c in calls)
        assert all(p.grad is None for p in t.model.arch_parameters())
        for c in calls:
            c[:] = [0] * len(c)
        t.w_opt.zero_grad(set_to_none=True)
        out = t.theta_step(x, y)
        assert set(out) == {"loss", "ce", "cost_term", "acc", "cost"}
        # a scored mode's θ step runs `score_paths` single paths, forward only
        per_step = PATHS_PER_LAYER[mode] * max(1, get_mode(mode).score_paths)
        assert all(sum(c) == per_step for c in calls)
        assert all(p.grad is None for p in t.model.weight_parameters())
        for a, b in zip(theta0, t.model.arch_parameters(), strict=True):
            assert not torch.equal(a, b)  # the cost term moves every layer's θ
    finally:
        close_logger(t.log)


def test_uniform_paths_train_the_sampled_path_and_n_uniform_ones(tmp_path):
    """search.uniform_paths: N (TF-NAS bi-sampling for N = 1): a weight step runs 1 + N
    single paths, one candidate each per layer, and θ gets no gradient."""
    t = SearchTrainer(make_cfg(tmp_path, mode="reinforce", uniform_paths=2), tmp_path / "run")
    try:
        calls = count_candidate_calls(t.model)
        x, y = next(iter(t.data.w_loader))
        out = t.weight_step(x, y)
        assert set(out) == {"ce", "acc", "cost"}
        assert all(sum(c) == 3 for c in calls), calls
        assert all(p.grad is None for p in t.model.arch_parameters())
    finally:
        close_logger(t.log)


def test_uniform_paths_need_single_path_weight_steps(tmp_path):
    with pytest.raises(FbnasError, match=r"search\.uniform_paths: 1 needs single-path weight "
                                         r"steps"):
        make_cfg(tmp_path, mode="full", uniform_paths=1)


@pytest.mark.parametrize("mode,ckpt", [("full", False), ("reinforce", False),
                                       ("two_path", False), ("reinforce", True)])
def test_a_tiny_search_runs_end_to_end(tmp_path, mode, ckpt):
    cfg = make_cfg(tmp_path, mode=mode, checkpoint_activations=ckpt)
    t = SearchTrainer(cfg, cfg.run.dir)
    try:
        result = t.train()
    finally:
        close_logger(t.log)
    assert t.model.checkpoint_activations is ckpt
    assert len(result["history"]) == 2 and len(result["arch"]) == 2
    last = result["history"][-1]
    assert last["theta_active"] and np.isfinite(last["theta_loss"])
    assert 0.0 <= last["argmax_path_acc"] <= 1.0
    assert (tmp_path / "run" / "arch_hard.yaml").is_file()
    assert any(not torch.equal(th, torch.zeros_like(th)) for th in t.model.arch_parameters())


def test_checkpointed_search_ends_where_the_plain_one_does(tmp_path):
    """Same seed, same data: with and without checkpointing the search gives the same θ."""
    runs = []
    for ckpt in (False, True):
        cfg = make_cfg(tmp_path / str(ckpt), mode="two_path", checkpoint_activations=ckpt)
        t = SearchTrainer(cfg, cfg.run.dir)
        try:
            t.train()
        finally:
            close_logger(t.log)
        runs.append(t.model)
    for a, b in zip(runs[0].arch_parameters(), runs[1].arch_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for (name, a), b in zip(runs[0].named_buffers(), runs[1].buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("skips", [(True, True), (True, False)], ids=["all-skip", "one-skip"])
def test_theta_step_when_a_sampled_identity_leaves_theta_out_of_the_graph(tmp_path, skips):
    """A θ mode that computes only the sampled candidate (here single_path's sampler, which
    search.mode refuses but a registered mode may do the same) + `loss.kind: ce`: a layer whose
    sampled candidate is the identity under a shared shortcut contributes x + 0, so its θ (or,
    all-skip, every θ) is not in the loss's graph; the θ step must still run, giving that θ a
    zero gradient."""
    d = digits_run_config(
        space={"stages": [{"channels": 8, "repeats": 2, "stride": 1}]},
        loss={"kind": "ce", "alpha": None, "beta": None}, search={"mode": "two_path"})
    for k in ("alpha", "beta"):
        d["loss"].pop(k)
    d["run"]["dir"] = str(tmp_path / "run")
    t = SearchTrainer(config_from_dict(d, "tiny.yaml"), tmp_path / "run")
    t.net.mode = "single_path"
    try:
        assert [op.shortcut for op in t.model.mixed] == [True, True]
        skip = t.model.mixed[0].op_names.index("skip")
        with torch.no_grad():
            for t_l, is_skip in zip(t.model.theta, skips, strict=True):
                t_l.fill_(-8.0)
                t_l[skip if is_skip else 0] = 8.0  # that candidate is sampled (1 - 1e-7)
        seen = []
        t.theta_opt.step = lambda: seen.append([p.grad.clone() for p in t.model.theta])
        x, y = next(iter(t.data.theta_loader))
        out = t.theta_step(x, y)
        assert np.isfinite(float(out["loss"]))
        (grads,) = seen
        for g, is_skip in zip(grads, skips, strict=True):
            assert bool(g.any()) is not is_skip, (skips, grads)
    finally:
        close_logger(t.log)


@pytest.mark.parametrize("mode", ["full", "single_path", "two_path"])
def test_batched_sampling_with_layers_of_different_sizes(mode):
    """All layers are sampled in one padded op: a layer's padding never gets weight, a
    one-candidate layer always runs its op, and each layer's weights have its own length and
    sum to 1 with gradients reaching its own θ."""
    d = copy.deepcopy(TINY_SPACE)
    d["stages"] = [{"channels": 8, "repeats": 1, "stride": 1, "candidates": ["ir_k3_e1"]},
                   {"channels": 16, "repeats": 2, "stride": 2,
                    "candidates": ["ir_k3_e1", "ir_k5_e3", "skip"]}]
    net = Supernet(SearchSpace.from_dict(d), mode=mode)
    with torch.no_grad():
        net.theta[1].copy_(torch.tensor([0.0, 2.0, -1.0]))
    seen = set()
    for _ in range(200):
        p = net.sample_path(tau=1.0)
        assert [len(m) for m in p.m] == [1, 3, 3]
        for m in p.m:
            m = m.detach()
            assert torch.isfinite(m).all() and float(m.sum()) == pytest.approx(1.0, abs=1e-6)
        if p.active is not None:
            assert p.active[0] == [0]
            assert all(0 <= i < 3 for a in p.active[1:] for i in a)
            seen.update(tuple(a) for a in p.active[1:])
        else:  # full: every candidate runs; the sample's largest weight moves
            seen.add(int(p.m[1].argmax()))
    assert len(seen) > 1  # the samples vary
    p = net.sample_path(tau=1.0)
    sum((m * torch.arange(1.0, len(m) + 1)).sum() for m in p.cost_m).backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in net.theta[1:])
