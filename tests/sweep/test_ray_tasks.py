"""`fbnas sweep --workers N`: the sweep's points as Ray tasks, equal to the serial sweep's,
resumable after a killed worker, a failed point reported without stopping the others.

One local Ray of 2 CPUs for the module (its start-up paid once); the sweep uses it as given.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import needs

from fbnas._cli import main
from fbnas.arch import Architecture
from fbnas.config import config_from_dict
from fbnas.latency.resolve import resolve_costs
from fbnas.sweep.ray_tasks import KILL_ENV

from .test_driver import TINY

ARGS = ["--beta", "0,4", "--random", "1", "--threads", "1"]
SEARCHES = ("search-beta0", "search-beta4")
RETRAINS = ("retrain-beta0", "retrain-beta4", "retrain-ref-all_k3_e6", "retrain-ref-all_k5_e6",
            "retrain-random1")
SAME = ("label", "kind", "arch_hash", "predicted_us", "top1", "top5", "val_top1", "ops")


@pytest.fixture(scope="module")
def ray_session():
    ray = needs("ray", "ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("ray_sweep")
    d = {**TINY, "run": {**TINY["run"], "dir": str(tmp / "runs/tiny")},
         "latency": {**TINY["latency"], "cache_dir": str(tmp / "cache")}}
    cfg = tmp / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(d))
    return cfg


@pytest.fixture(scope="module")
def serial(config) -> Path:
    out = config.parent / "serial"
    assert main(["sweep", "--config", str(config), "--out", str(out), *ARGS]) == 0
    return out


def assert_same_sweep(a: Path, b: Path) -> None:
    """Same architectures, bit-identical θ and child weights, the same figures per point."""
    for d in SEARCHES:
        arch_a, arch_b = (Architecture.load(x / d / "arch_hard.yaml") for x in (a, b))
        assert arch_a.ops == arch_b.ops
        assert (a / d / "theta.json").read_text() == (b / d / "theta.json").read_text()
    for d in SEARCHES + RETRAINS:
        ma = torch.load(a / d / "checkpoint.pt", weights_only=False)["model"]
        mb = torch.load(b / d / "checkpoint.pt", weights_only=False)["model"]
        assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma), d
    rows_a, rows_b = (list(csv.DictReader((x / "sweep.csv").open())) for x in (a, b))
    assert [{k: r[k] for k in SAME} for r in rows_a] == [{k: r[k] for k in SAME} for r in rows_b]


@pytest.mark.slow
def test_ray_sweep_equals_the_serial_one(config, serial, ray_session, capsys):
    out = config.parent / "ray"
    assert main(["sweep", "--config", str(config), "--out", str(out), "--workers", "2",
                 *ARGS]) == 0
    printed = capsys.readouterr().out
    for line in ("search beta0 started", "search beta4 finished in", "retrain random1 started",
                 "retrain ref-all_k3_e6 finished in", "timing the children here",
                 "random architectures dominated"):
        assert line in printed
    assert_same_sweep(serial, out)
    # the points ran in Ray workers, not in this process
    pids = re.findall(r"\(pid (\d+) on ", printed)
    assert len(pids) == 7 and str(os.getpid()) not in pids


@pytest.mark.slow
def test_killed_worker_and_failed_point_then_resume(config, serial, ray_session, capsys,
                                                    monkeypatch):
    out = config.parent / "killed"
    argv = ["sweep", "--config", str(config), "--out", str(out), "--workers", "2",
            "--retries", "0", *ARGS]
    # beta4's search SIGKILLs its worker at its first checkpoint; ref-all_k3_e6's retrain
    # meets a damaged checkpoint
    monkeypatch.setenv(KILL_ENV, "search-beta4")
    (out / "retrain-ref-all_k3_e6").mkdir(parents=True)
    (out / "retrain-ref-all_k3_e6/checkpoint.pt").write_text("garbage")
    assert main(argv) == 1
    printed = capsys.readouterr().out
    assert "search beta4 failed: its worker (pid" in printed and "died" in printed
    assert "retrain ref-all_k3_e6 failed: " in printed and "corrupted" in printed
    # the other points went on and finished
    assert "retrain beta0 finished in" in printed and "retrain ref-all_k5_e6 finished in" in printed
    assert "re-run the same command to retry beta4, ref-all_k3_e6, random architectures" in printed
    assert not (out / "sweep.csv").exists()
    assert (out / "search-beta4/checkpoint.pt").is_file()  # killed mid-search, after epoch 1
    assert not (out / "search-beta4/arch_hard.yaml").exists()
    done = {d: (out / d / "checkpoint.pt").stat().st_mtime_ns
            for d in ("search-beta0", "retrain-beta0", "retrain-ref-all_k5_e6")}

    monkeypatch.delenv(KILL_ENV)
    (out / "retrain-ref-all_k3_e6/checkpoint.pt").unlink()
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "search beta4 resuming from its checkpoint" in printed
    assert "search beta0 finished earlier" in printed
    assert "retrain beta0 finished earlier" in printed
    assert "resumed" in (out / "search-beta4/train.log").read_text()
    # finished points were not computed again
    assert {d: (out / d / "checkpoint.pt").stat().st_mtime_ns for d in done} == done
    assert_same_sweep(serial, out)


@pytest.mark.slow
def test_a_killed_worker_is_retried_from_its_checkpoint(config, serial, ray_session, capsys,
                                                        monkeypatch):
    out = config.parent / "retried"
    monkeypatch.setenv(KILL_ENV, "retrain-beta0")  # --retries 1 (the default)
    assert main(["sweep", "--config", str(config), "--out", str(out), "--workers", "2",
                 *ARGS]) == 0
    printed = capsys.readouterr().out
    assert "retrain beta0 resuming from its checkpoint (a retry: its worker died)" in printed
    assert "resumed" in (out / "retrain-beta0/train.log").read_text()
    assert_same_sweep(serial, out)


def test_without_ray_one_line_says_how_to_install(config, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    assert main(["sweep", "--config", str(config), "--beta", "1", "--workers", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "fbnas sweep: error: --workers 2 needs Ray: pip install 'fbnas[ray]'"


@pytest.mark.slow
def test_serial_sweep_does_not_import_ray():
    code = ("import sys; from fbnas._cli import build_parser; import fbnas._cli.sweep; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ray_sweep_flags_are_checked(config, capsys):
    needs("ray", "ray")  # the Ray flags are read once Ray imports
    for flags, msg in ((["--workers", "0"], "--workers: must be >= 1"),
                       (["--workers", "2", "--retries", "-1"], "--retries: must be >= 0"),
                       (["--workers", "2", "--gpus-per-task", "-0.5"], "--gpus-per-task"),
                       (["--workers", "2", "--threads", "0"], "--threads: must be >= 1"),
                       (["--seeds", "1,x"], "--seeds"), (["--seeds", "1,1"], "--seeds")):
        assert main(["sweep", "--config", str(config), "--beta", "1", *flags]) == 2
        assert msg in capsys.readouterr().err


@pytest.mark.slow
def test_measured_fits_are_timed_by_the_driver_once_the_searches_are_done(
        config, ray_session, monkeypatch, capsys):
    """With a latency target the search tasks fit by the table alone; the driver times each
    searched network (here 15% slower than its table says, in the driver's process only; the
    table's probes, which end-to-end figures are anchored to, as the table says) and re-fits
    it before any retrain starts, and the CSV shows the target beside the figures."""
    from fbnas.arch import ChildNet
    from fbnas.backends.fake import FakeTimer

    prepare = FakeTimer.prepare

    def slower(self, module, input_chw, label=""):
        run = prepare(self, module, input_chw, label)
        if isinstance(module, ChildNet) and "probe" not in label:
            run.cost_s *= 1.15
        return run

    d = yaml.safe_load(config.read_text())
    d["loss"] = {"kind": "target", "target": "0.5x", "lambda": 1.0}
    target_cfg = config.parent / "tiny-target.yaml"
    target_cfg.write_text(yaml.safe_dump(d))
    honest = config_from_dict(d, str(target_cfg))
    resolve_costs(honest.space, honest.latency, save=False)  # the honest table first
    monkeypatch.setattr(FakeTimer, "prepare", slower)
    out = config.parent / "ray-target"
    assert main(["sweep", "--config", str(target_cfg), "--out", str(out), "--workers", "2",
                 "--targets", "0.4x,0.7x", "--random", "0", "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert printed.index("search target0.7x finished") < printed.index(
        "search target0.4x: measured fit") < printed.index("retrain target0.4x started")
    assert printed.index("retrain ref-all_k3_e6 started") > printed.index(
        "search target0.7x: measured fit")
    rows = {r["label"]: r for r in csv.DictReader((out / "sweep.csv").open())}
    for label in ("target0.4x", "target0.7x"):
        run = out / f"search-{label}"
        meta = Architecture.load(run / "arch_hard.yaml").meta
        first = meta["fit_rounds"][0]
        assert first["measured"] == pytest.approx(first["predicted"] * 1.15, rel=0.02)
        assert "measured fit round" not in (run / "train.log").read_text()  # not in the task
        assert float(rows[label]["target_us"]) == pytest.approx(meta["target"])
