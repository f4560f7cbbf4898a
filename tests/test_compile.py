"""search.compile: every supernet block compiled in place; a compiled search computes what the
eager one does, in every mode (the aot_eager backend here: the same graphs as inductor's
front end, without code generation, so the test stays fast on a CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_same_grads_and_buffers, digits_run_config, randomise_bn

from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.supernet import Supernet
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger


def _run(tmp_path, name: str, mode: str, compile_: bool) -> SearchTrainer:
    d = digits_run_config(search={"epochs": 3, "warmup_epochs": 1, "mode": mode,
                                  "compile": compile_, "compile_backend": "aot_eager"})
    d["run"]["dir"] = str(tmp_path / name)
    cfg = config_from_dict(d, "tiny.yaml")
    t = SearchTrainer(cfg, cfg.run.dir)
    try:
        t.train()
    finally:
        close_logger(t.log)
    return t


@pytest.mark.parametrize("mode", ["full", "reinforce", "two_path"])
@pytest.mark.slow  # about 20 s a mode; the fast tier checks the backend setting below
def test_a_compiled_search_computes_what_the_eager_one_does(tmp_path, mode):
    from torch._dynamo.utils import counters

    eager = _run(tmp_path, "eager", mode, False)
    torch._dynamo.reset()  # graphs of an earlier test's blocks (same shapes) would be reused
    graphs = counters["stats"]["unique_graphs"]
    comp = _run(tmp_path, "compiled", mode, True)
    assert counters["stats"]["unique_graphs"] > graphs  # dynamo did capture the blocks
    blocks = [comp.model.stem, comp.model.head,
              *(b for op in comp.model.mixed for b in op.candidates)]
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in blocks)
    # each candidate through its compiled forward, none computed together
    assert all(op.batches is None for op in comp.model.mixed)
    assert any(op.batches is not None for op in eager.model.mixed)
    # compiled in place: the checkpoint's keys are the eager model's
    assert list(comp.model.state_dict()) == list(eager.model.state_dict())
    for a, b in zip(eager.model.arch_parameters(), comp.model.arch_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for he, hc in zip(eager.history, comp.history, strict=True):
        assert he["w_ce"] == pytest.approx(hc["w_ce"], rel=1e-4)


def test_an_unknown_backend_is_one_line_naming_the_key(tmp_path):
    d = digits_run_config(search={"compile": True, "compile_backend": "no-such-backend"})
    d["run"]["dir"] = str(tmp_path / "r")
    cfg = config_from_dict(d, "tiny.yaml")
    with pytest.raises(FbnasError, match=r"search.compile_backend: 'no-such-backend' is not a "
                                         r"torch.compile backend .*inductor") as e:
        SearchTrainer(cfg, cfg.run.dir)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "r").exists()  # refused before the run directory was made


@pytest.mark.parametrize("how", ["cheap", True])
@pytest.mark.slow  # 20-30 s a setting: dynamo traces every block in backward's recompute too
def test_compiled_blocks_under_checkpointing_give_the_eager_gradients(tiny_space, how):
    """search.compile with search.checkpoint_activations: each compiled block recomputed (true)
    or its convolutions' outputs kept (cheap): loss, every weight gradient, θ's and the
    BatchNorm statistics equal the eager, unrecomputed supernet's in float64."""
    torch._dynamo.reset()
    ref = Supernet(tiny_space).double().train()
    randomise_bn(ref)
    net = copy.deepcopy(ref)
    net.compile_blocks("aot_eager")
    net.checkpoint_activations = how
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    ms = [[torch.softmax(torch.randn(len(op.candidates), dtype=torch.float64), 0)
           .requires_grad_() for op in ref.mixed]]
    ms.append([m.detach().clone().requires_grad_() for m in ms[0]])
    losses = []
    for model, m in ((net, ms[0]), (ref, ms[1])):
        logits, _ = model(x, m=m)
        losses.append(logits.logsumexp(1).sum())
        losses[-1].backward()
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-12, atol=1e-12)
    assert_same_grads_and_buffers(net, ref, f"compiled, checkpoint_activations={how}")
    for a, b in zip(ms[0], ms[1], strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)
