"""τ schedules and warm-up paths (fbnas/trainer.py: TauSchedule, warmup_paths)."""

from __future__ import annotations

import math

import torch
from conftest import digits_run_config

from fbnas.config import config_from_dict
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger


def _trainer(tmp_path, **sections):
    cfg = config_from_dict(digits_run_config(**sections), "test")
    return SearchTrainer(cfg, tmp_path / "run")


def test_fair_warmup_trains_every_candidate_once_per_step(tmp_path):
    t = _trainer(tmp_path, search={"warmup_sampling": "fair", "epochs": 2, "warmup_epochs": 1})
    try:
        paths = t._warmup_paths()
        sizes = [len(th) for th in t.net.theta]
        assert len(paths) == max(sizes)
        for layer, n in enumerate(sizes):
            assert sorted(p[layer][0] for p in paths[:n]) == list(range(n))
        theta0 = [th.detach().clone() for th in t.net.theta]
        w0 = [p.detach().clone() for p in t.net.weight_parameters()]
        x, y = next(iter(t.data.w_loader))
        out = t.weight_step(x, y)
        assert set(out) == {"ce", "acc", "cost"} and math.isfinite(out["ce"])
        assert all(torch.equal(a, b) for a, b in zip(theta0, t.net.theta, strict=True))
        assert any(not torch.equal(a, b) for a, b in zip(w0, t.net.weight_parameters(),
                                                           strict=True))
        t.epoch = 1  # after the warm-up: the search mode's own sampling
        assert t._warmup_paths() is None
    finally:
        close_logger(t.log)
