"""One sweep point's work (fbnas/sweep/_point.py), a function of its config alone: a search
that is done is re-read, not run again; a retrain that is done is re-read from its results."""

from __future__ import annotations

from conftest import digits_run_config

from fbnas.config import config_from_dict
from fbnas.sweep._point import retrain_config, retrain_point, search_done, search_point


def test_a_point_searches_once_then_rereads_and_retrains_once(tmp_path):
    d = digits_run_config(retrain={"epochs": 1, "warmup_epochs": 0, "device": "cpu"})
    d["run"]["dir"] = str(tmp_path / "search")
    cfg = config_from_dict(d, "tiny.yaml")
    assert not search_done(cfg)
    arch = search_point(cfg)
    assert search_done(cfg)
    ckpt = tmp_path / "search" / "checkpoint.pt"
    mtime = ckpt.stat().st_mtime_ns
    assert search_point(cfg).ops == arch.ops  # finished: re-read, nothing trained again
    assert ckpt.stat().st_mtime_ns == mtime

    rcfg = retrain_config(d, "tiny.yaml", tmp_path / "retrain")
    assert rcfg.run.dir == str(tmp_path / "retrain") and not rcfg.retrain.measure_latency
    first = retrain_point(rcfg, arch, {"point": "p0"})
    assert first["sweep"] == {"point": "p0"} and 0.0 <= first["top1"] <= 1.0
    results = tmp_path / "retrain" / "results.json"
    mtime = results.stat().st_mtime_ns
    assert retrain_point(rcfg, arch, {"point": "p0"}) == first  # done: its results re-read
    assert results.stat().st_mtime_ns == mtime
