"""The search's weight steps: the sandwich rule with in-place distillation (search.sandwich)."""

import contextlib
import copy
import sys

import pytest
import torch
from conftest import count_candidate_calls, digits_run_config, one_line_error

from fbnas.config import config_from_dict
from fbnas.trainer import SearchTrainer, distillation
from fbnas.training.logs import close_logger


def _trainer(tmp_path, **search):
    d = digits_run_config(data={"limit": 200}, latency={"cost": "flops"},
                          search={"mode": "reinforce", "epochs": 2, "warmup_epochs": 1,
                                  **search})
    d["run"]["dir"] = str(tmp_path / "run")
    return SearchTrainer(config_from_dict(copy.deepcopy(d), "s.yaml"), tmp_path / "run")


@pytest.mark.parametrize("uniform", [0, 1])
def test_sandwich_trains_the_dearest_path_besides_the_sampled_ones(tmp_path, uniform):
    t = _trainer(tmp_path, sandwich=True, uniform_paths=uniform)
    try:
        t.epoch = 1  # past the warm-up: the mode's sampled path (and a uniform one)
        calls = count_candidate_calls(t.model)
        dear = t.net.dearest_path()
        costs = [c.tolist() for c in t.net.cost_rows()]
        assert all(c[i] == max(c) for c, i in zip(costs, dear, strict=True))
        x, y = next(iter(t.data.w_loader))
        out = t.weight_step(x, y)
        assert out["ce"] > 0
        for li, c in enumerate(calls):
            assert sum(c) == 2 + uniform, (li, c)  # one candidate per path per layer
            assert c[dear[li]] >= 1, (li, c)
    finally:
        close_logger(t.log)


def test_distillation_is_zero_against_itself_and_pulls_toward_the_teacher():
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(8, 10, generator=g)
    student = torch.randn(8, 10, generator=g, requires_grad=True)
    assert float(distillation(teacher, teacher)) == pytest.approx(0.0, abs=1e-6)
    loss = distillation(student, teacher)
    loss.backward()
    with torch.no_grad():  # a small step down the gradient brings the student closer
        assert float(distillation(student - 0.1 * student.grad, teacher)) < float(loss)


def test_sandwich_needs_single_path_weight_steps(tmp_path):
    one_line_error(lambda: _trainer(tmp_path, mode="full", sandwich=True),
                   "sandwich", "weight_sampling to single_path, or mode to reinforce")


def test_single_path_is_refused_as_the_theta_mode_and_drawn_as_the_weights_paths(tmp_path):
    """The benchmark showed single_path's θ cannot compete (docs/bench.md): as search.mode it is
    a one-line error naming the key and saying what to set instead; as
    search.weight_sampling, beside reinforce's θ, it trains."""
    one_line_error(lambda: _trainer(tmp_path / "theta", mode="single_path"),
                   "search.mode: single_path is not a θ mode",
                   "search.weight_sampling to single_path")
    assert not (tmp_path / "theta" / "run").exists()  # refused before the run folder
    # a finished run of it stays readable (fbnas sample / fidelity / bench score read its config)
    # where a config is read it is refused (the file named); a run's recorded one is read
    d = digits_run_config(search={"mode": "single_path"})
    one_line_error(lambda: config_from_dict(d, "mine.yaml"),
                   "mine.yaml: search.mode: single_path is not a θ mode")
    assert config_from_dict(d, "old_run", finished=True).search.mode == "single_path"
    t = _trainer(tmp_path / "weights", mode="reinforce", weight_sampling="single_path")
    close_logger(t.log)
    assert t.net.mode == "reinforce" and t._weight_mode == "single_path"


def test_a_finished_single_path_run_is_read_but_an_unfinished_one_not_resumed(tmp_path):
    """A run searched with single_path before it was refused: finished, it is still read
    (fbnas sample, a sweep's re-read, bench_fit_sim resume it to read θ); unfinished, resuming
    it says it cannot be and to start a new run."""
    t = _trainer(tmp_path, mode="reinforce")
    try:
        t.train()
    finally:
        close_logger(t.log)
    ck = tmp_path / "run" / "checkpoint.pt"
    state = torch.load(ck, weights_only=True)
    state["config"]["search"]["mode"] = "single_path"
    torch.save(state, ck)
    d = digits_run_config(data={"limit": 200}, latency={"cost": "flops"},
                          search={"mode": "single_path", "epochs": 2, "warmup_epochs": 1})
    d["run"]["dir"] = str(tmp_path / "run")
    # the run's recorded config (as fbnas sample and the sweep read it); a user's file of it
    # is refused where it is read (test above)
    cfg = config_from_dict(copy.deepcopy(d), "s.yaml", finished=True)
    done = SearchTrainer(cfg, tmp_path / "run", resume=True)
    close_logger(done.log)
    assert done.epoch == 2 and done.net.mode == "single_path"
    state["epoch"] = 1
    torch.save(state, ck)
    one_line_error(lambda: SearchTrainer(cfg, tmp_path / "run", resume=True),
                   "search.mode: single_path is not a θ mode (a run searched with it cannot be "
                   "resumed: start a new one)")


@pytest.mark.parametrize("mode", ["full", "two_path"])
def test_a_theta_step_freezes_the_weights_and_gets_the_same_theta_gradient(tmp_path, mode):
    """A relaxation's θ step runs with the weights' requires_grad off (no layer keeps its
    input for a weight gradient): θ's gradient is what the same sample gives with the weights
    live, less is kept for backward, and the weights are live again after it."""
    from fbnas.trainer import frozen_weights
    t = _trainer(tmp_path, mode=mode, weights="shared")
    try:
        x, y = next(iter(t.data.theta_loader))
        net, params = t.net, t.net.weight_parameters()
        kept, grads = [], []
        for freeze in (True, False):
            torch.manual_seed(0)
            p = t._sample()
            box: dict[int, int] = {}

            def keep(v, box=box):
                box[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
                return v
            with (frozen_weights(params) if freeze else contextlib.nullcontext()), \
                    torch.autograd.graph.saved_tensors_hooks(keep, lambda v: v):
                logits, cost = net(x, m=p.m, active=p.active, cost_m=p.cost_m)
                total = t.loss(logits, y, cost).total
                grads.append(torch.autograd.grad(total, list(net.theta), allow_unused=True))
            kept.append(sum(box.values()))
        for a, b in zip(*grads, strict=True):
            torch.testing.assert_close(a, b)
        assert kept[0] < 0.9 * kept[1]
        assert all(q.requires_grad for q in params)
        seen = []
        hook = net.register_forward_pre_hook(
            lambda *_: seen.append(any(q.requires_grad for q in params)))
        t.theta_step(x, y)  # the library's step freezes and restores them too
        hook.remove()
        assert seen == [False]
        assert all(q.requires_grad for q in params) and all(q.grad is None for q in params)
    finally:
        close_logger(t.log)


def test_a_reinforce_theta_step_reads_its_paths_on_the_host_once(tmp_path, monkeypatch):
    """Issue 52: the k scoring paths are drawn, then read at once (one `.tolist()`, not k), and
    their log-probabilities are taken from indices on θ's device (no list copied to it); the
    stem runs once for the k (same input, same weights); θ and the BatchNorm statistics are
    what one draw-forward-read per path gave."""
    from fbnas.search import modes

    t = _trainer(tmp_path, mode="reinforce")
    try:
        x, y = next(iter(t.data.theta_loader))
        k = t.net.search_mode.score_paths
        # the reference: one path drawn, read and scored after another (before issue 52)
        ref = copy.deepcopy(t.net)
        torch.manual_seed(3)
        theta = list(ref.theta)
        ces, logps = [], []
        for _ in range(k):
            p = ref.sample_path(t.tau)
            with torch.no_grad():
                logits, _ = ref(x, m=p.m, active=p.active, cost_m=p.cost_m)
            ces.append(t.loss.ce(logits.float(), y))
            logps.append(modes.path_log_prob(theta, p.active))
        reads = {"tolist": 0, "item": 0, "tensor": 0}

        def counted(name, real):
            def call(*a, **kw):  # fbnas's own reads (not the optimizer's CPU step counter)
                if "/fbnas/" in sys._getframe(1).f_code.co_filename:
                    reads[name] += 1
                return real(*a, **kw)
            return call
        for name in ("tolist", "item"):
            monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
        monkeypatch.setattr(torch, "tensor", counted("tensor", torch.tensor))
        torch.manual_seed(3)
        before = [q.detach().clone() for q in t.net.theta]
        stem_convs = []
        hook = t.net.stem[0].register_forward_hook(lambda *_: stem_convs.append(1))
        t._score_theta_step(x, y, k)
        hook.remove()
        monkeypatch.undo()
        assert len(stem_convs) == 1 and k > 1
        # the paths once, and the non-finite check's flag (run.nan_check step, the CPU's
        # default; deferred on CUDA reads none); no index list copied to the device
        assert reads["tolist"] + reads["item"] <= 2 and reads["tensor"] == 0
        # the same paths, so the same BatchNorm statistics as the one-by-one reference (the
        # stem's updated k times from its one forward), bit for bit
        for a, b in zip(t.net.named_buffers(), ref.named_buffers(), strict=True):
            assert torch.equal(a[1], b[1]), a[0]
        assert any(not torch.equal(a, q) for a, q in zip(before, t.net.theta, strict=True))
    finally:
        close_logger(t.log)
