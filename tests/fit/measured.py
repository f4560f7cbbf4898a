"""What the measured-fit tests share: a 5-layer space timed on the fake device, a search run
on it under a cost target, whole networks made slower than the table says."""

from __future__ import annotations

import yaml
from conftest import digits_run_config

from fbnas.arch import Architecture, ChildNet
from fbnas.backends.fake import FakeTimer
from fbnas.config import config_from_dict
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger

FIT_SPACE = {
    "name": "fit", "input_size": 8, "in_channels": 1, "num_classes": 10,
    "stem": {"channels": 8, "stride": 1},
    "candidates": ["ir_k3_e1", "ir_k3_e3", "ir_k5_e3", "ir_k3_e6", "skip"],
    "stages": [{"channels": 8, "repeats": 2, "stride": 1},
               {"channels": 16, "repeats": 3, "stride": 2}],
    "head": {"channels": 16},
}


def fake_run(tmp_path, **search):
    """A search on the fake device under a 0.6x target, returning θ's fit (final_pick:
    theta; the measured fit starting from the final pick: tests/fit/test_onto_target.py)."""
    d = digits_run_config(
        space=FIT_SPACE,
        latency={"cost": "latency", "device": "fake", "cache_dir": str(tmp_path / "cache")},
        loss={"kind": "target", "target": "0.6x", "lambda": 1.0},
        search={"epochs": 2, "warmup_epochs": 1, "theta_lr": 0.5, "final_pick": "theta",
                **search})
    for k in ("alpha", "beta"):
        d["loss"].pop(k, None)
    d["run"]["dir"] = str(tmp_path / "run")
    return config_from_dict(d, "test.yaml")


def slow_networks(monkeypatch, factor: float) -> None:
    """Whole networks take `factor` times what the fake device's table entries add up to,
    except the table's probes (its context model was fitted to them: a table off by one factor
    on every network would have been corrected at its build, and an end-to-end figure is
    anchored to them)."""
    prepare = FakeTimer.prepare

    def slower(self, module, input_chw, label=""):
        run = prepare(self, module, input_chw, label)
        if isinstance(module, ChildNet) and "probe" not in label:
            run.cost_s *= factor
        return run

    monkeypatch.setattr(FakeTimer, "prepare", slower)


def run_search(cfg, tmp_path):
    t = SearchTrainer(cfg, tmp_path / "run")
    try:
        t.train()
    finally:
        close_logger(t.log)
    path = tmp_path / "run" / "arch_hard.yaml"
    saved = yaml.safe_load(path.read_text())
    saved["ops"] = list(Architecture.load(path).ops)  # one op per searchable layer
    return t, saved
