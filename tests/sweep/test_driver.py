"""`fbnas sweep`: two tiny settings through the CLI, resumable, with CSV, JSON and plot."""

import csv
import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import digits_run_config, one_line_error

from fbnas._cli import main
from fbnas.errors import FbnasError
from fbnas.sweep.driver import SweepPoint, dominated
from fbnas.sweep.grid import parse_values, point_config

TINY = digits_run_config(
    space={"candidates": ["ir_k3_e1", "ir_k3_e6", "ir_k5_e6", "skip"]},
    latency={"cost": "latency", "device": "fake"},
    retrain={"epochs": 2, "warmup_epochs": 1, "device": "cpu"})


@pytest.mark.slow  # moved from the fast tier: 4-6 s, its module has other fast tests
def test_sweep_two_settings_end_to_end_and_resume(tmp_path, capsys):
    d = {**TINY, "run": {**TINY["run"], "dir": str(tmp_path / "runs/tiny")},
         "latency": {**TINY["latency"], "cache_dir": str(tmp_path / "cache")}}
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(d))
    argv = ["sweep", "--config", str(cfg), "--beta", "0,4", "--random", "2"]
    assert main(argv) == 0
    out = tmp_path / "runs/tiny-sweep"
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    kinds = [r["kind"] for r in rows]
    assert kinds == ["search", "search", "reference", "reference", "random", "random"]
    assert [r["label"] for r in rows[:4]] == ["beta0", "beta4", "ref-all_k3_e6", "ref-all_k5_e6"]
    # beta 0 is the cost-blind search
    assert yaml.safe_load((out / "search-beta0/config.yaml").read_text())["loss"]["kind"] == "ce"
    assert yaml.safe_load((out / "search-beta4/config.yaml").read_text())["loss"]["beta"] == 4
    for r in rows:
        assert float(r["measured_us"]) > 0 and float(r["predicted_us"]) > 0
        assert 0 <= float(r["top1"]) <= 1
        res = json.loads((Path(r["run_dir"]) / "results.json").read_text())
        assert res["measured_us"] == pytest.approx(float(r["measured_us"]))
        assert res["sweep"]["label"] == r["label"]
    assert {r["dominated"] for r in rows if r["kind"] == "random"} <= {"True", "False"}
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["random"] == 2 and summary["wall_seconds"] > 0
    assert (out / "sweep.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "random architectures dominated" in printed
    # the runs index lists every retrain of the sweep
    assert main(["runs", str(out), "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) == 6
    # running it again resumes: nothing is searched or retrained twice
    stamp = {p: p.stat().st_mtime_ns for p in out.glob("*/checkpoint.pt")}
    assert main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/checkpoint.pt")} == stamp
    again = list(csv.DictReader((out / "sweep.csv").open()))
    assert [r["top1"] for r in again] == [r["top1"] for r in rows]
    # ... but not with other settings: the finished runs would not be what the sweep says
    capsys.readouterr()
    assert main(argv + ["--set", "search.tau0=3"]) == 2
    assert "search.tau0 was 5.0 in this run, now 3" in capsys.readouterr().err
    assert main(argv + ["--retrain-epochs", "3"]) == 2
    assert "retrain.epochs was 2 in this run, now 3" in capsys.readouterr().err


def test_sweep_values_and_points():
    assert parse_values("0, 0.5,2", "beta") == [0.0, 0.5, 2.0]
    for bad, msg in (("", "at least one"), ("1,x", "'x' is not a number"),
                     ("-1", "must be a finite number >= 0"), ("1,1", "repeated")):
        with pytest.raises(FbnasError, match=msg):
            parse_values(bad, "beta")
    c = point_config(TINY, "lambda", 0.0, "d")
    assert c.loss.to_dict() == {"kind": "ce", "label_smoothing": 0.0}
    with pytest.raises(FbnasError, match="loss.target"):
        point_config({**TINY, "loss": {"kind": "additive", "target": 5}}, "target", 0.0, "d")


def test_dominance_allows_noise_but_not_worse_points():
    def p(ms, acc):
        return SweepPoint("x", "random", results={"measured_us": ms, "top1": acc})
    searched = [p(1.0, 0.90), p(2.0, 0.95)]
    rand = [p(1.02, 0.90), p(1.5, 0.96), p(0.5, 0.80), p(3.0, 0.949), p(None, 0.9)]
    assert dominated(rand, searched, lat_tol=0.03, acc_tol=0.0) == [
        True, False, False, True, False]
    assert dominated([p(0.97, 0.90)], searched, 0.03, 0.0) == [False]
    assert dominated([p(1.0, 0.905)], searched, 0.0, 0.01) == [True]


def test_sweep_cli_errors(tmp_path, capsys):
    assert main(["sweep", "--config", str(tmp_path / "none.yaml"), "--beta", "1"]) == 2
    assert "no such file" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    assert main(["sweep", "--config", str(cfg), "--beta", "1", "--random", "-1"]) == 2
    assert "--random" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sweep", "--config", str(cfg), "--beta", "1", "--alpha", "2"])


def test_interrupted_sweep_exits_130_with_a_resume_hint(tmp_path, capsys, monkeypatch):
    from fbnas.sweep.driver import Sweep
    from fbnas.training.loop import Interrupted

    def stop(self):
        raise Interrupted
    monkeypatch.setattr(Sweep, "run", stop)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    assert main(["sweep", "--config", str(cfg), "--beta", "1", "--out", str(tmp_path / "s")]) == 130
    assert "run the same command again to resume" in capsys.readouterr().err


def test_sweep_targets_as_times_and_range_positions(tmp_path):
    assert parse_values("0.3x, 1.2ms,900", "target") == ["0.3x", "1.2ms", 900.0]
    with pytest.raises(FbnasError, match="--target: cannot read '1.2parsec'"):
        parse_values("1.2parsec", "target")
    base = {**TINY, "loss": {"kind": "target", "target": "0.5x"}}
    c = point_config(base, "target", "0.3x", tmp_path / "s")
    assert c.loss.to_dict()["target"] == "0.3x" and c.loss.kind == "target"


def test_sweep_seeds_are_points_of_their_own(tmp_path):
    from fbnas.sweep.driver import Sweep
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "loss": {"kind": "target", "target": "0.5x"}}))
    sw = Sweep(cfg, "target", ["0.3x", "0.5x"], out=tmp_path / "s", seeds=[0, 7])
    assert [sp.label for sp in sw.plan] == ["target0.3x-seed0", "target0.5x-seed0",
                                            "target0.3x-seed7", "target0.5x-seed7"]
    assert [sp.cfg.search.seed for sp in sw.plan] == [0, 0, 7, 7]
    assert sw.plan[3].cfg.run.dir == str(tmp_path / "s/search-target0.5x-seed7")
    assert [sp.label for sp in Sweep(cfg, "target", ["1ms"]).plan] == ["target1ms"]
    with pytest.raises(FbnasError, match="--seeds"):
        Sweep(cfg, "target", ["1ms"], seeds=[1, 1])


def test_a_sweep_whose_searches_would_run_single_path_as_the_theta_mode_is_refused_up_front(
        tmp_path):
    from fbnas.sweep.driver import Sweep
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "loss": {"kind": "target", "target": "0.5x"},
                                   "search": {**TINY.get("search", {}), "mode": "single_path"}}))
    one_line_error(lambda: Sweep(cfg, "target", ["0.3x"], out=tmp_path / "s"),
                   "search.mode: single_path is not a θ mode")
    assert not (tmp_path / "s").exists()


def test_a_grid_of_any_settings_is_every_combination(tmp_path, capsys, monkeypatch):
    """--grid KEY=V1,V2 for any setting: the points are the product of the axes (the first
    one, or a loss flag, draws the front), each its own labelled run with its settings."""
    from fbnas.sweep.driver import Sweep
    from fbnas.sweep.grid import parse_axis

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "loss": {"kind": "target", "target": "0.5x"}}))
    sw = Sweep(cfg, "target", ["0.3x", "0.8x"], out=tmp_path / "s", seeds=[1],
               grid=[parse_axis("search.mode=two_path,reinforce")])
    assert [sp.label for sp in sw.plan] == [
        "target0.3x-modetwo_path-seed1", "target0.3x-modereinforce-seed1",
        "target0.8x-modetwo_path-seed1", "target0.8x-modereinforce-seed1"]
    assert [(sp.cfg.loss.to_dict()["target"], sp.cfg.search.mode, sp.cfg.search.seed)
            for sp in sw.plan] == [("0.3x", "two_path", 1), ("0.3x", "reinforce", 1),
                                   ("0.8x", "two_path", 1), ("0.8x", "reinforce", 1)]
    assert sw.plan[1].settings == (("search.mode", "reinforce"),)
    two = Sweep(cfg, "target", ["0.3x"], out=tmp_path / "v", grid=[
        parse_axis("search.weights=separate,shared"), parse_axis("search.mode=two_path")])
    assert [sp.label for sp in two.plan] == ["target0.3x-weightsseparate-modetwo_path",
                                             "target0.3x-weightsshared-modetwo_path"]
    assert [(sp.cfg.search.weights, sp.cfg.search.mode) for sp in two.plan] == [
        ("separate", "two_path"), ("shared", "two_path")]
    # a grid without a loss axis: its first axis is the swept one; a 0 weight is still kind ce
    sw = Sweep(cfg, "search.weights", ["separate", "shared"], out=tmp_path / "t",
               grid=[parse_axis("loss.lambda=0,2")])
    assert [sp.label for sp in sw.plan] == ["weightsseparate-lambda0", "weightsseparate-lambda2",
                                            "weightsshared-lambda0", "weightsshared-lambda2"]
    assert sw.plan[0].cfg.loss.kind == "ce" and sw.plan[1].cfg.loss.to_dict()["lambda"] == 2
    assert [sp.cfg.search.weights for sp in sw.plan] == ["separate"] * 2 + ["shared"] * 2
    # what a grid refuses, in one line
    for bad, msg in (("search.mode", "is not KEY=V1,V2"), ("mode=full", "names no section"),
                     ("search.mode=full,full", "repeated value"),
                     ("loss.beta=1,x", "'x' is not a number")):
        with pytest.raises(FbnasError, match=msg):
            parse_axis(bad)
    with pytest.raises(FbnasError, match="a setting swept twice"):
        Sweep(cfg, "target", ["0.3x"], grid=[parse_axis("loss.target=0.5x")])
    with pytest.raises(FbnasError, match="and --seeds"):
        Sweep(cfg, "target", ["0.3x"], seeds=[0], grid=[parse_axis("search.seed=1,2")])
    one_line_error(lambda: Sweep(cfg, "target", ["0.3x"], grid=[parse_axis(
        "search.mode=nonsense")]), "search.mode")
    # the CLI: --grid alone sweeps; nothing to sweep is one line
    from fbnas.training.loop import Interrupted
    seen = {}

    def stop(self):
        seen["plan"] = self.plan
        raise Interrupted
    monkeypatch.setattr(Sweep, "run", stop)
    assert main(["sweep", "--config", str(cfg), "--out", str(tmp_path / "u"), "--grid",
                 "search.seed=3,4", "--grid", "loss.target=0.4x"]) == 130
    assert [sp.label for sp in seen["plan"]] == ["seed3-target0.4x", "seed4-target0.4x"]
    assert main(["sweep", "--config", str(cfg)]) == 2
    assert "give the values to sweep" in capsys.readouterr().err


def test_a_sweeps_folder_reads_as_its_finished_searches(tmp_path):
    """`fbnas bench score SWEEP_DIR` and the scripts take a sweep's folder as its searches."""
    from fbnas.sweep.grid import searched_runs

    sweep, lone = tmp_path / "sweep", tmp_path / "lone"
    for d in ("search-b", "search-a", "search-unfinished", "retrain-a"):
        (sweep / d).mkdir(parents=True)
    for d in ("search-a", "search-b", "retrain-a"):
        (sweep / d / "arch_hard.yaml").write_text("x")
    lone.mkdir()
    assert searched_runs([sweep, lone]) == [sweep / "search-a", sweep / "search-b", lone]
    assert searched_runs([sweep / "search-a"]) == [sweep / "search-a"]


def test_a_grid_axis_outside_search_and_loss_needs_no_retrain(tmp_path):
    """The retrains share one data / retrain / space section: an axis there is refused unless
    the sweep only searches; a refused θ mode is caught at every point of the grid."""
    from fbnas.sweep.driver import Sweep
    from fbnas.sweep.grid import parse_axis

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "loss": {"kind": "target", "target": "0.5x"}}))
    with pytest.raises(FbnasError, match="sweep: retrain.epochs is not a search or loss"):
        Sweep(cfg, "target", ["0.3x"], out=tmp_path / "s",
              grid=[parse_axis("retrain.epochs=1,2")])
    sw = Sweep(cfg, "target", ["0.3x"], out=tmp_path / "s", retrain=False,
               grid=[parse_axis("data.limit=100,200")])
    assert [sp.cfg.data.limit for sp in sw.plan] == [100, 200]
    one_line_error(lambda: Sweep(cfg, "target", ["0.3x"], out=tmp_path / "t", grid=[
        parse_axis("search.mode=single_path,reinforce")]), "single_path is not a θ mode")


@pytest.mark.slow
def test_a_searches_only_sweep_through_the_cli(tmp_path, capsys):
    """`fbnas sweep --grid ... --no-retrain`: every combination searched, nothing retrained,
    each search's predicted latency printed and where to score them said."""
    d = {**TINY, "run": {**TINY["run"], "dir": str(tmp_path / "runs/tiny")},
         "latency": {**TINY["latency"], "cache_dir": str(tmp_path / "cache")},
         "loss": {"kind": "target", "target": "0.5x"}}
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(d))
    out = tmp_path / "s"
    assert main(["sweep", "--config", str(cfg), "--out", str(out), "--grid",
                 "search.mode=two_path,reinforce", "--no-retrain",
                 "--set", "search.fit_measure=off"]) == 0
    said = capsys.readouterr().out
    assert "searches only (--no-retrain): judge them with fbnas bench score" in said
    labels = ["modetwo_path", "modereinforce"]
    for label in labels:
        assert (out / f"search-{label}" / "arch_hard.yaml").is_file()
        assert re.search(rf"^{label}\s+search\s+\d+\.\d+\s+-\s+-\s+\w+", said, re.M)
    assert not list(out.glob("retrain-*"))
    rows = json.loads((out / "sweep.json").read_text())["points"]
    assert [r["label"] for r in rows] == labels and all(r["top1"] is None for r in rows)
