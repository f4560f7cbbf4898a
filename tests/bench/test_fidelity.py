"""`fbnas fidelity`: supernet estimates against stand-alone retraining, ranked."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import digits_run_config

from fbnas._cli import main
from fbnas.arch import Architecture


def _search(tmp_path):
    run = tmp_path / "search"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(digits_run_config(
        retrain={"epochs": 2, "warmup_epochs": 1, "device": "cpu"},
        run={"dir": str(run)}, search={"bn_calib_samples": 64})))
    assert main(["train", "--config", str(cfg)]) == 0
    return run


def test_fidelity_ranks_supernet_estimates_against_retraining(tmp_path, capsys):
    run = _search(tmp_path)
    assert main(["fidelity", str(run), "-n", "4", "--seed", "1"]) == 0
    rep = json.loads((run / "fidelity" / "fidelity.json").read_text())
    pts = rep["points"]
    assert rep["n"] == 4 and len({p["hash"] for p in pts}) == 4
    hard = Architecture.load(run / "arch_hard.yaml")
    assert pts[0]["ops"] == list(hard.ops)  # the search's own pick comes first
    for p in pts:
        assert 0 <= p["supernet_val_acc"] <= 1 and 0 <= p["standalone_val_top1"] <= 1
    acc_sets = ({p["supernet_val_acc"] for p in pts}, {p["standalone_val_top1"] for p in pts})
    if all(len(s) > 1 for s in acc_sets):
        assert -1 <= rep["kendall_tau"] <= 1 and -1 <= rep["spearman"] <= 1
    else:  # 2 epochs on 200 images can leave every network at the same accuracy
        assert rep["kendall_tau"] is None and rep["spearman"] is None
    # CE on both sides resolves what accuracy on a few hundred images cannot
    for p in pts:
        assert p["supernet_val_ce"] > 0 and p["standalone_val_ce"] > 0
    assert -1 <= rep["kendall_tau_ce"] <= 1 and 0 <= rep["kendall_p_ce"] <= 1
    out = capsys.readouterr().out
    assert "Kendall tau" in out and "Spearman" in out and "by val CE" in out
    # a second run reads the retrains back instead of redoing them
    stamps = {p: p.stat().st_mtime_ns for p in (run / "fidelity").glob("retrain-*/results.json")}
    assert len(stamps) == 4
    assert main(["fidelity", str(run), "-n", "4", "--seed", "1"]) == 0
    assert stamps == {p: p.stat().st_mtime_ns for p in stamps}
    again = json.loads((run / "fidelity" / "fidelity.json").read_text())
    same = [(p["supernet_val_acc"], p["standalone_val_top1"]) for p in again["points"]]
    assert same == [(p["supernet_val_acc"], p["standalone_val_top1"]) for p in pts]
    assert again["kendall_tau"] == rep["kendall_tau"]


@pytest.mark.slow  # moved from the fast tier: a search and six retrains, 1 s
def test_fidelity_retrain_seeds_average_and_give_the_noise_ceiling(tmp_path, capsys):
    run = _search(tmp_path)
    assert main(["fidelity", str(run), "-n", "3", "--retrains", "2"]) == 0
    rep = json.loads((run / "fidelity" / "fidelity.json").read_text())
    assert rep["retrain_seeds"] == 2
    for p in rep["points"]:
        (a0, c0), (a1, c1) = p["standalone_seeds"]
        assert p["standalone_val_top1"] == (a0 + a1) / 2
        assert abs(p["standalone_val_ce"] - (c0 + c1) / 2) < 1e-12
        # seed 0 keeps the single-seed run's folder; seed 1 is retrained with retrain.seed + 1
        assert (run / "fidelity" / f"retrain-{p['hash'][:12]}" / "results.json").is_file()
        assert (run / "fidelity" / f"retrain-{p['hash'][:12]}-s1" / "results.json").is_file()
    assert -1 <= rep["retrain_vs_retrain_tau_ce"] <= 1
    assert "noise ceiling (retrain seed 0 vs 1)" in capsys.readouterr().out
    assert main(["fidelity", str(run), "--retrains", "0"]) == 2


def test_fidelity_bad_input_is_one_line(tmp_path, capsys):
    assert main(["fidelity", str(tmp_path / "nowhere")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    run = _search(tmp_path)
    capsys.readouterr()  # the search's own log
    assert main(["fidelity", str(run), "-n", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "-n must be >= 3" in err[0]
