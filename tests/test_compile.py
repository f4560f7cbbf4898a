"""search.compile: every supernet block compiled in place; a compiled search computes what the
eager one does, in every mode (the aot_eager backend here: the same graphs as inductor's
front end, without code generation, so the test stays fast on a CPU)."""

from __future__ import annotations

import pytest
import torch
from conftest import digits_run_config

from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.trainer import SearchTrainer
from fbnas.training import close_logger


def _run(tmp_path, name: str, mode: str, compile_: bool) -> SearchTrainer:
    d = digits_run_config(search={"epochs": 3, "warmup_epochs": 1, "mode": mode,
                                  "compile": compile_, "compile_backend": "aot_eager"})
    d["run"]["dir"] = str(tmp_path / name)
    cfg = config_from_dict(d, "tiny.yaml")
    t = SearchTrainer(cfg, cfg.run.dir)
    try:
        t.fit()
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
