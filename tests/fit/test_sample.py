"""`fbnas sample` (fbnas/fit/sample.py): --hard gives the run's recorded architecture (as the
search fitted it), --refit fits again and names what changed, the near-target bundle's
round trip and pick."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import digits_run_config, run_bundle_standalone

from fbnas._cli import main
from fbnas.arch import Architecture
from fbnas.backends.fake import FakeTimer
from fbnas.config import config_from_dict
from fbnas.latency import LatencyTable
from fbnas.latency.measure import reference_scale
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger

from .measured import fake_run, run_search, slow_networks


@pytest.mark.slow  # moved from the fast tier: a search and three commands, 2 s
def test_sample_hard_gives_the_runs_architecture_and_refit_says_what_changed(
        tmp_path, monkeypatch, capsys):
    """`fbnas sample RUN --hard` writes what `fbnas train` returned (arch_hard.yaml) without
    timing anything; `--refit` fits again, timing networks, and names the layers that differ."""
    cfg = fake_run(tmp_path)
    slow_networks(monkeypatch, 1.15)
    run_search(cfg, tmp_path)
    run, out = tmp_path / "run", tmp_path / "s"
    timed = []
    prepare = FakeTimer.prepare
    monkeypatch.setattr(FakeTimer, "prepare",
                        lambda self, *a, **k: timed.append(1) or prepare(self, *a, **k))
    # the run's record, changed in layer 0: --hard must give it as it is
    recorded = Architecture.load(run / "arch_hard.yaml")
    cands = cfg.space.layer_candidates()
    other = next(op for op in cands[0] if op != recorded.ops[0])
    changed = Architecture(recorded.macro, [other, *recorded.ops[1:]], recorded.name,
                           recorded.space, dict(recorded.meta))
    changed.save(run / "arch_hard.yaml")
    capsys.readouterr()
    assert main(["sample", str(run), "--hard", "--out", str(out)]) == 0
    sampled = Architecture.load(out / "arch_hard.yaml")
    assert list(sampled.ops) == list(changed.ops) and timed == []
    assert sampled.meta["measured"] == recorded.meta["measured"]
    assert "the run's architecture" in capsys.readouterr().out
    assert main(["sample", str(run), "--hard", "--refit", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    refit = Architecture.load(out / "arch_hard.yaml")
    assert timed and list(refit.ops) == list(recorded.ops) and "measured" in refit.meta
    assert f"differs from the run's arch_hard.yaml (layer 0: {other} -> {recorded.ops[0]}" in said
    assert main(["sample", str(run), "--fit-measure", "on", "--out", str(out)]) == 2
    assert "--fit-measure goes with --refit" in capsys.readouterr().err


# ---- a device fbnas cannot run on: --near-target bundle, the device's results, --pick --------
@pytest.mark.slow
def test_near_target_bundle_round_trip_and_pick(tmp_path, monkeypatch, capsys):
    pytest.importorskip("executorch")
    cfg = fake_run(tmp_path, fit_measure="off")
    t, _ = run_search(cfg, tmp_path)
    run = tmp_path / "run"
    table = LatencyTable.load(run / "cost_table.json")
    assert main(["sample", str(run), "--near-target", "3", "--bundle",
                 str(tmp_path / "nb")]) == 2  # a fake table: not what a bundle measures
    assert "timed with 'fake'" in capsys.readouterr().err
    table.meta.update(imported_from="phone/results.json", backend="executorch")
    table.save(run / "cost_table.json")
    bundle = tmp_path / "nb"
    assert main(["sample", str(run), "--near-target", "3", "--bundle", str(bundle)]) == 0
    man = json.loads((bundle / "manifest.json").read_text())
    nets = [p for p in man["programs"] if p["kind"] == "network"]
    assert len(nets) == 3 and man["purpose"]["near_target"]["run"] == str(run.resolve())
    target = man["purpose"]["near_target"]["target"]
    results = run_bundle_standalone(bundle)  # fbnas unimportable to the runner
    assert all(p["key"] in results["entries"] for p in nets)
    # what the device "measured": near_1 8% over the target, near_2 and near_3 inside
    scale_us = reference_scale(results["ref_times_s"]) * 1e6
    for p, miss in zip(nets, (0.08, -0.01, 0.02), strict=True):
        results["entries"][p["key"]]["ratios"] = [target * (1 + miss) / scale_us] * 3
    (bundle / "results.json").write_text(json.dumps(results))
    out = tmp_path / "picked"
    assert main(["sample", str(run), "--pick", str(bundle / "results.json"), "--out",
                 str(out)]) == 0
    picked = Architecture.load(out / "arch_picked.yaml")
    ops = {p["key"]: Architecture.from_dict(p["arch"], "manifest").ops for p in nets}
    assert list(picked.ops) == list(ops["network near_2"])  # the more probable of the two inside
    assert picked.meta["measured"] == pytest.approx(target * 0.99, rel=1e-3)
    # results of another bundle are refused in one line, and nothing is written
    other = tmp_path / "other"
    other.mkdir()
    mine = results["bundle"]
    man["bundle_id"], results["bundle"] = "0" * 16, "0" * 16
    (other / "manifest.json").write_text(json.dumps(man))
    (other / "results.json").write_text(json.dumps(results))
    results["bundle"] = mine
    capsys.readouterr()
    assert main(["sample", str(run), "--pick", str(other / "results.json"), "--out",
                 str(tmp_path / "p2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "near-target bundle is" in err[0]
    assert not (tmp_path / "p2").exists()
    # none inside the band: says by how much the nearest missed, writes nothing
    for p in nets:
        results["entries"][p["key"]]["ratios"] = [target * 1.2 / scale_us] * 3
    (bundle / "results.json").write_text(json.dumps(results))
    assert main(["sample", str(run), "--pick", str(bundle / "results.json"), "--out",
                 str(tmp_path / "p3")]) == 2
    assert "+20.0%" in capsys.readouterr().err and not (tmp_path / "p3").exists()


def test_sample_hard_fits_as_the_search_did(tmp_path):
    d = digits_run_config(search={"epochs": 2, "warmup_epochs": 1, "theta_lr": 0.5})
    d["loss"] = {"kind": "target", "target": "0.3x", "lambda": 3.0}
    t = SearchTrainer(config_from_dict(d, "test"), tmp_path / "run")
    try:
        t.train()
    finally:
        close_logger(t.log)
    run = tmp_path / "run"
    assert main(["sample", str(run), "--hard", "--out", str(tmp_path / "s")]) == 0
    searched = yaml.safe_load((run / "arch_hard.yaml").read_text())
    sampled = yaml.safe_load((tmp_path / "s" / "arch_hard.yaml").read_text())
    assert searched["meta"]["fitted_layers"] > 0  # the plain argmax would differ
    assert sampled["ops"] == searched["ops"]
