"""scripts/: every script runs with its smallest settings and prints its figures (no timing
is asserted), is listed in scripts/README.md, and imports only public fbnas names and
scripts.common (no sys.path edits). Most run in this process through `main(argv)`; those that
start processes anyway (torchrun, another checkout, `fbnas train` / `fbnas sweep`) as
`python -m scripts.NAME`."""

from __future__ import annotations

import ast
import importlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import SMALL_QUICKSTART, digits_run_config, latency_space

ROOT = Path(__file__).resolve().parents[2]
# every script as its module under scripts/, grouped by what it measures: speed.modes, ...
GROUPS = ("speed", "latency", "search")
SCRIPTS = sorted(f"{p.parent.name}.{p.stem}" for g in GROUPS
                 for p in (ROOT / "scripts" / g).glob("*.py") if p.stem != "__init__")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """The tests' digits run config (2 searchable layers, 8x8 grey images, FLOPs cost) with a
    retrain section, the fake timer and the quickstart's loss (a cost target), as a file."""
    d = digits_run_config(latency={"cost": "flops", "device": "fake"},
                          retrain={"epochs": 1, "warmup_epochs": 0, "device": "cpu",
                                   "measure_latency": False})
    d["loss"] = {"kind": "target", "target": "0.5x", "lambda": 1.0}
    path = tmp_path_factory.mktemp("config") / "tiny.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return str(path)


@pytest.fixture(scope="module")
def tiny_latency(tmp_path_factory) -> str:
    """A config of the latency tests' space (5 layers, 4 block signatures, 8x8)."""
    path = tmp_path_factory.mktemp("config") / "latency.yaml"
    path.write_text(yaml.safe_dump(digits_run_config(space=latency_space()), sort_keys=False))
    return str(path)


@pytest.fixture(autouse=True)
def _threads():
    """One thread (a smoke test times nothing; on a busy machine more threads only spin)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def run_main(name: str, argv: list[str], capsys) -> str:
    """scripts.NAME's main(argv) in this process; what it printed. A non-zero return fails."""
    rc = importlib.import_module(f"scripts.{name}").main(argv)
    assert rc in (None, 0), f"scripts.{name} returned {rc}"
    return capsys.readouterr().out


def run_module(name: str, argv: list[str]) -> str:
    """`python -m scripts.NAME ARGV` from the repository root, one thread per process; its
    output (exit status 0 asserted)."""
    r = subprocess.run([sys.executable, "-m", f"scripts.{name}", *argv], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, f"scripts.{name}: exit {r.returncode}\n{r.stderr[-3000:]}"
    return r.stdout


# ---- the codebase ----------------------------------------------------------------------------
def imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every import in a file ('' as the name of a plain `import m`)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out += [(node.module or "", a.name) for a in node.names]
    return out


@pytest.mark.parametrize("name", [*SCRIPTS, "common"])
def test_script_imports_public_names_and_no_other_script(name):
    path = ROOT / "scripts" / f"{name.replace('.', '/')}.py"
    text = path.read_text()
    assert not [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Attribute)
                and n.attr == "path" and getattr(n.value, "id", "") == "sys"], \
        f"{path.name} uses sys.path"
    for module, what in imports(path):
        parts = [*module.split("."), *([what] if what else [])]
        if parts[0] == "fbnas":
            assert not any(p.startswith("_") for p in parts), f"{path.name}: {module}.{what}"
        if parts[0] == "scripts":
            assert parts[:2] == ["scripts", "common"], f"{path.name} imports {module}.{what}"
    assert f"python -m scripts.{name}" in text or name == "common", \
        f"{path.name}: its usage line should say `python -m scripts.{name}`"


def test_every_script_sits_in_its_group():
    """scripts/ holds the shared harness and the three groups, no loose script."""
    loose = sorted(p.name for p in (ROOT / "scripts").glob("*.py")
                   if p.stem not in ("__init__", "common"))
    assert loose == [] and len(SCRIPTS) >= 25


def test_every_script_is_listed_in_the_readme():
    readme = (ROOT / "scripts" / "README.md").read_text()
    missing = [n for n in SCRIPTS if f"`python -m scripts.{n}`" not in readme]
    assert not missing, f"scripts/README.md does not list {missing}"


def test_every_script_has_a_smoke_test():
    text = Path(__file__).read_text()
    assert [n for n in SCRIPTS if f'"{n}"' not in text.split("# ---- smoke tests")[-1]] == []


def test_interleave_alternates_and_spread():
    from scripts.common import Spread, alternate, interleave

    order = []
    times = interleave({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 2,
                       warmup=1)
    assert order == ["a", "b", "b", "a", "a", "b"] and [len(v) for v in times.values()] == [2, 2]
    assert alternate([1, 2, 3], 1) == [3, 2, 1]
    s = Spread.of([1.0, 2.0, 3.0, 4.0, 5.0], inclusive=True)
    assert (s.median, s.lo, s.hi, s.q1, s.q3) == (3.0, 1.0, 5.0, 2.0, 4.0)
    assert s.rel_iqr == pytest.approx(2 / 3) and s.range(".0f") == "3 (1-5)"


# ---- smoke tests (the slow tier: `python -m pytest -q -m slow -n 0`) -------------------------
@pytest.mark.slow
def test_bench_modes(tiny, capsys):
    out = run_main("speed.modes", ["--config", tiny, "--batch", "4", "--repeats", "1",
                                   "--mem-samples", "1"], capsys)
    assert "single_path speed-up over full:" in out and "supernet overhead ratio" in out


def test_bench_mixing(tiny, capsys):
    # counts, checked; two timed rounds of each variant, only checked to be printed. Folded,
    # no multiply over an activation remains (the tiny space has no squeeze-excite) and a θ
    # step keeps less for backward; computed together, fewer BatchNorm calls than one
    # candidate at a time
    out = run_main("speed.mixing", ["--config", tiny, "--input-size", "16", "--batch", "2",
                                    "--time", "2"], capsys)
    five = r"\s+(\S+)" * 5
    for step in ("weight step", "θ step"):
        row = re.search(rf"^{step}\s+mul \(4-d\){five}", out, re.M)
        assert row and int(row[1]) > 0 and int(row[2]) == int(row[3]) == 0, out
        bn = re.search(rf"^{step}\s+batch_norm{five}", out, re.M)
        assert bn and int(bn[1]) == int(bn[2]) > int(bn[3]) > 0, out
        # cheap and recompute: each BatchNorm of the layers run again in backward
        assert int(bn[4]) == int(bn[5]) > int(bn[3]), out
        conv = re.search(rf"^{step}\s+convolution{five}", out, re.M)
        assert conv and int(conv[4]) == int(conv[3]) < int(conv[5]), out  # cheap keeps them
    saved = re.search(rf"^θ step\s+saved MiB{five}\s+(\S+)", out, re.M)
    assert saved and float(saved[6]) < 1.0 and saved[4] == saved[5] == "-", out
    assert "held / peak: run as `python -m scripts.speed.mixing`" in out  # in-process: no RSS
    rows = re.findall(r"^  (unfolded|folded|together|cheap|recompute)\s+median\s+(\S+) ms .* "
                      r"median (\S+) \[(\S+), (\S+)\]$", out, re.M)
    assert [r[0] for r in rows] == ["unfolded", "folded", "together", "cheap", "recompute"], out
    assert all(float(r[1]) > 0 for r in rows) and float(rows[0][2]) == 1.0, out


@pytest.mark.slow
def test_bench_mixing_memory_held_as_a_script():
    """Run as a script (glibc's mmap threshold fixed by re-executing itself): what a forward
    leaves held matches SavedBytes where both apply, and cheap holds less than together."""
    out = subprocess.run([sys.executable, "-m", "scripts.speed.mixing", "--config",
                          "configs/fbnet_imagenet.yaml", "--input-size", "56", "--batch", "4"],
                         cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    five = r"\s+(\S+)" * 5
    for step, rel in (("weight step", 0.02), ("θ step", 0.1)):
        saved = re.search(rf"^{step}\s+saved MiB{five}", out, re.M)
        held = re.search(rf"^{step}\s+held MiB{five}", out, re.M)
        peak = re.search(rf"^{step}\s+peak MiB{five}", out, re.M)
        assert saved and held and peak, out
        for i in (1, 2, 3):
            assert float(held[i]) == pytest.approx(float(saved[i]), rel=rel), out
        assert float(held[4]) < 0.8 * float(held[3]) and float(held[5]) < float(held[4]), out
        assert float(peak[4]) < float(peak[3]), out


@pytest.mark.slow
def test_bench_widths(capsys):
    out = run_main("speed.widths", ["--batch", "4", "--repeats", "1", "--mem-samples", "1",
                                    "--modes", "full,reinforce"], capsys)
    m = re.search(r"^full\s+.*\s(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)$", out,
                  re.M)
    assert m and float(m[1]) > 0 and float(m[2]) > 0 and float(m[3]) > 0, out
    # reinforce scores its θ step's paths without a gradient: nothing kept, no ratio
    assert re.search(r"^reinforce\s+.*\s\d+\.\d+\s+0\.00\s+0\.00\s+-$", out, re.M), out
    assert re.search(r"table of fbnetv2_imagenet: \d+ entries, \d+ without its widths", out)


@pytest.mark.slow
def test_bench_precision(tiny, capsys):
    out = run_main("speed.precision", ["--config", tiny, "--batch", "4", "--repeats", "1",
                                       "--steps", "1"], capsys)
    assert "bf16+channels_last" in out and "θ-grad cos" in out


@pytest.mark.slow
def test_bench_gpu_on_the_cpu_for_another_checkout(tiny, tmp_path):
    # another checkout: a copy of the package (its compiled files too, still valid: copy2
    # keeps the times); the table is made in a child process that imports it
    shutil.copytree(ROOT / "fbnas", tmp_path / "fbnas")
    out = run_module("speed.gpu", ["--code", str(tmp_path), "--config", tiny, "--batch", "4",
                                   "--steps", "1", "--rounds", "1", "--device", "cpu",
                                   "--modes", "full,single_path", "--precisions", "float32",
                                   "--copy-gib", "0.001"])
    assert f"fbnas from {tmp_path}" in out and "single_path, float32" in out
    assert "x bound" in out


@pytest.mark.slow
def test_bench_compile(tiny, capsys, monkeypatch):
    compile_ = torch.compile  # the eager backend: traced by dynamo, not compiled by inductor
    monkeypatch.setattr(torch, "compile", lambda f, **kw: compile_(f, backend="eager"))
    out = run_main("speed.compile", ["--config", tiny, "--op", "ir_k5_e3", "--batch", "4",
                                     "--blocks", "1", "--steps", "1"], capsys)
    assert "compiled / eager throughput: median" in out


@pytest.mark.slow
def test_bench_loader(tiny, capsys):
    # its other parts are the scripts tested here, each started as `python -m scripts.NAME`
    out = run_main("speed.suite", ["--quick", "--skip", "modes", "ddp", "precision", "--config",
                             tiny], capsys)
    assert "search weight loader, 2 worker(s), image folder" in out


@pytest.mark.slow
def test_bench_ddp():
    out = run_module("speed.ddp", ["--procs", "2", "--sync-every", "2", "--steps", "1",
                                   "--warmup", "1", "--repeats", "1", "--batch", "4",
                                   "--samples", "64"])
    assert out.splitlines()[-1].split()[:2] == ["2", "2"]


@pytest.mark.slow
def test_bench_search_epochs(tiny):
    out = run_module("speed.search_epochs", ["--code", str(ROOT), "--config", tiny,
                                             "--device", "cpu", "--size", "64", "--batch",
                                             "32", "--input-size", "8", "--epochs", "2",
                                             "--repeats", "1"])
    assert "images/s median (min-max)" in out and str(ROOT) in out.splitlines()[-1]


@pytest.mark.slow
def test_compare_runs(tiny):
    out = run_module("search.compare_runs", ["--code", str(ROOT), "--code", str(ROOT), "--config",
                                      tiny, "--modes", "full", "--set", "search.epochs=1",
                                      "--set", "search.warmup_epochs=0", "--set",
                                      "data.limit=64"])
    assert "full: " in out and out.strip().endswith("identical")


@pytest.mark.slow
def test_bench_search_quality(tiny, capsys):
    out = run_main("search.quality", ["weights", "--config", tiny, "--smoke"], capsys)
    assert "separate" in out and "shared" in out
    out = run_main("search.quality", ["search", "--config", tiny, "--modes", "reinforce",
                                            "--smoke"], capsys)
    assert out.splitlines()[-1].startswith("reinforce ")


@pytest.mark.slow
def test_bench_target(tiny, capsys, tmp_path):
    args = ["--config", tiny, "--modes", "full", "--targets", "0.5x", "--seeds", "0",
            "--epochs", "2", "--random", "1", "--rounds", "2", "--set", "latency.cost=latency",
            "--set", f"latency.cache_dir={tmp_path}", "--keep", str(tmp_path / "keep")]
    out = run_main("search.target", args, capsys)
    assert "re-measured right after its search" in out and "random architectures (n=1)" in out
    assert "re-measured at the end, all together: within ±3%: " in out
    assert "end run / right after, median over the networks: " in out
    assert "measured fit: " in out  # the tiny config times on the fake device
    assert "within ±1%; nearest " in out
    log = tmp_path / "keep" / "full-0.5x-0" / "train.log"
    searched = log.read_text()
    assert "epoch 2/2" in searched
    again = run_main("search.target", args, capsys)  # --keep: the search re-fitted, not re-run
    assert log.read_text() == searched and "re-measured at the end, all together" in again
    assert "measured fit: " in again


@pytest.mark.slow
def test_bench_sweep(tiny, tmp_path):
    out = run_module("search.sweep", ["--config", tiny, "--param", "target", "--values", "0.5x",
                                     "--random", "1", "--retrain-epochs", "1", "--out",
                                     str(tmp_path / "sweep")])
    assert "random architectures dominated by a searched one: " in out


@pytest.mark.slow
def test_bench_sweep_on_ray_against_serial(tiny, tmp_path):
    out = run_module("search.sweep", ["--config", tiny, "--param", "target", "--values", "0.5x",
                                     "--sweep-seeds", "0,1", "--random", "0",
                                     "--retrain-epochs", "1", "--threads", "1", "--workers", "2",
                                     "--against-serial", "--out", str(tmp_path / "sweep")])
    assert "target0.5x-seed1" in out and "every point identical: yes" in out


@pytest.mark.slow
def test_theta_signal(tiny, capsys):
    pytest.importorskip("sklearn")  # the digits data
    out = run_main("search.theta_signal", ["--config", tiny, "--warm-steps", "1", "--draws", "1",
                                    "--batch", "8", "--weight-curve", "2"], capsys)
    assert "two_path" in out and "mean CE per" in out


@pytest.mark.slow
def test_bench_latency(tiny_latency, tmp_path, capsys):
    out = run_main("latency.repeatability", ["--config", tiny_latency, "--n-archs", "4", "--rounds",
                                     "2", "--val-rounds", "2", "--probes", "1", "--no-rebuild",
                                     "--no-reference-protocol", "--out-dir", str(tmp_path)],
                   capsys)
    assert "table:  Spearman" in out and (tmp_path / "bench.json").exists()


@pytest.mark.slow
def test_bench_tables(tiny_latency, capsys):
    out = run_main("latency.tables", ["--spaces", tiny_latency, "--builds", "1", "--seeds", "0",
                                    "-n", "6", "--val-rounds", "2", "--rounds", "2",
                                    "--worst", "1"], capsys)
    assert "== medians over builds and seeds" in out and "table S" in out


@pytest.mark.slow
def test_bench_runtimes(tiny_latency, capsys, monkeypatch, tmp_path):
    # eager only: the ExecuTorch and ONNX Runtime tables lower every block (tens of seconds)
    monkeypatch.setenv("FBNAS_EXPORT_CACHE", str(tmp_path))  # the script sets its own
    out = run_main("latency.runtimes", ["--space", tiny_latency, "--runtimes", "cpu", "-n", "3",
                                      "--val-rounds", "2", "--rounds", "2"], capsys)
    assert "cpu: table built" in out and "S/K/MAPE" in out


@pytest.mark.slow
def test_bench_reference(capsys):
    out = run_main("latency.reference", ["--rounds", "2", "--repeats", "1", "--blocks", "1"],
                   capsys)
    assert "least spread:" in out and "stream" in out


@pytest.mark.slow
@pytest.mark.parametrize("formats", ["torchscript,pt2", "onnx"])
def test_bench_export(tiny, formats, capsys):
    if formats == "onnx":
        pytest.importorskip("onnxruntime")  # the optional format (fbnas[onnx])
    out = run_main("latency.export", ["--config", tiny, "--n-archs", "1", "--inputs", "2",
                                    "--formats", formats], capsys)
    assert all(f"{f} " in out.split("\n\n")[-1] for f in formats.split(","))
    assert "all ok: True" in out



@pytest.mark.slow
def test_bench_int8(tmp_path, capsys):
    from fbnas.arch import arch_from_indices
    from fbnas.config import config_from_dict
    from fbnas.retrain import ChildTrainer
    from fbnas.training.logs import close_logger

    d = digits_run_config(latency={"cost": "latency", "device": "fake"},
                          retrain={"epochs": 1, "warmup_epochs": 0, "device": "cpu",
                                   "measure_latency": False})
    d["run"]["dir"] = str(tmp_path / "runs")
    cfg = config_from_dict(d, "tiny.yaml")
    t = ChildTrainer(cfg, arch_from_indices(cfg.space, [1, 0], "c"), tmp_path / "rt")
    try:
        t.train()
    finally:
        close_logger(t.log)
    out = run_main("latency.int8", ["--checkpoint", str(tmp_path / "rt"), "--calibration-images",
                                  "16", "--rounds", "2"], capsys)
    assert all(k in out for k in ("pte int8", "onnx int8", "eager fp32"))
    assert "pte: int8 speed-up over fp32" in out and "onnx: int8 speed-up over fp32" in out


def test_bench_target_counts_a_space_too_big_to_enumerate_from_random_ones(monkeypatch):
    """What the space offers near a target: counted exactly where the space can be
    enumerated, estimated from random architectures beyond (the ImageNet space, 9^22, once
    asked for 26 GiB), and said so."""
    bt = importlib.import_module("scripts.search.target")
    rows = [[1.0, 2.0, 3.0]] * 6  # 729 architectures; sum 12 has 141 of them
    exact = bt._space_near(rows, 0.0, 12.0)
    assert exact.startswith("141 architectures") and "estimated" not in exact
    monkeypatch.setattr(bt, "ENUMERATE", 100)
    monkeypatch.setattr(bt, "DRAWN", 20_000)
    est = bt._space_near(rows, 0.0, 12.0)
    assert "estimated from 20,000 drawn at random of 7.29e+02" in est
    assert abs(float(est.split()[0]) / 141 - 1) < 0.1


@pytest.fixture(scope="module")
def tiny_bench(tiny, tmp_path_factory) -> tuple[str, str]:
    """(config, benchmark) of the tiny config's space: every network, 2 seeds, 1 epoch."""
    from fbnas.bench.build import build_bench
    from fbnas.config import load_config

    out = tmp_path_factory.mktemp("speed.suite") / "tiny.json.gz"
    build_bench(load_config(tiny, ["data.limit=200", "retrain.threads=1"]), out, seeds=(0, 1),
                log=lambda s: None)
    return tiny, str(out)


@pytest.mark.slow
def test_bench_regret(tiny_bench, tmp_path):
    tiny, bench = tiny_bench
    args = ["--config", tiny, "--bench", bench, "--seeds", "0", "--targets", "0.5x",
            "--jobs", "1", "--set", "data.limit=200", "--set", "search.epochs=2",
            "--set", "search.warmup_epochs=1", "--keep", str(tmp_path / "keep")]
    out = run_module("search.regret", args)
    row = out.splitlines()[-1].split()
    assert row[:3] == ["reinforce", "shared", "1"]  # one run of the shipped mode, summarised
    assert 0 <= float(row[3]) <= 100 and 0 <= int(row[4]) <= 1
    again = run_module("search.regret", args)  # --keep: scored again, not searched again
    assert again.splitlines()[-1] == out.splitlines()[-1]
    # the kept run's measured fit, timed by the benchmark's latencies
    sim = run_module("search.fit_sim", ["--bench", bench, "--draws", "2",
                                       str(tmp_path / "keep" / "sweep")])
    m = re.search(r"^1 runs, 2 draws each \(sigma 1.0%\): median regret ([0-9.]+) pt", sim, re.M)
    assert m and 0 <= float(m[1]) <= 100


@pytest.mark.slow
def test_ranking_epochs(tiny_bench, tmp_path, capsys):
    tiny, bench = tiny_bench
    out_file = tmp_path / "ranking.jsonl"
    argv = ["--config", tiny, "--bench", bench, "--targets", "0.5x", "--epochs", "2,3",
            "--near", "0.5", "--set", "data.limit=200",
            "--variant", "one-path:search.uniform_paths=0", "--out", str(out_file)]
    out = run_main("search.ranking_epochs", argv, capsys)
    rows = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert [(r["variant"], r["epochs"]) for r in rows] == [
        ("as-is", 2), ("as-is", 3), ("one-path", 2), ("one-path", 3)]
    # τ is NaN where every path reads the same accuracy (a tiny supernet after 2 epochs)
    assert all(r["networks"] >= 2 and (math.isnan(r["tau"]) or -1 <= r["tau"] <= 1)
               and 0 <= r["recall10"] <= 1 for r in rows), rows
    assert "mean over targets and seeds" in out and "one-path      3 epochs: tau" in out
    again = run_main("search.ranking_epochs", argv, capsys)  # resumes: nothing searched again
    assert again.splitlines()[-4:] == out.splitlines()[-4:]


def test_the_pilots_normal_model_recovers_the_truths_gap_that_few_percentiles_miss():
    """Networks whose truths spread normally (sd 4 pt) under seed noise (sd 1.5 pt): the
    normal model's gap is the truths' 0.803 x 4 pt, and its interval holds it."""
    from scripts.search.pilot_task import Z95_MINUS_Z80, summary

    rng = np.random.default_rng(5)
    truths = 80 + 4 * rng.standard_normal(400)
    rows = [{"name": f"n{i}", "seed": sd, "test": (t + 1.5 * rng.standard_normal()) / 100}
            for i, t in enumerate(truths) for sd in (0, 1)]
    s = summary(rows, [0, 1])
    assert s["se"] == pytest.approx(1.5 / math.sqrt(2), rel=0.1)
    assert s["model_gap"] == pytest.approx(Z95_MINUS_Z80 * 4, rel=0.1)
    lo, hi = s["model_interval"]
    assert lo < Z95_MINUS_Z80 * 4 / s["se"] < hi
    # no spread beyond the noise: no gap
    flat = [{**r, "test": (80 + 1.5 * rng.standard_normal()) / 100} for r in rows]
    assert summary(flat, [0, 1])["model_gap"] < 0.2 * Z95_MINUS_Z80 * 4


@pytest.mark.slow
def test_pilot_task(tiny, tmp_path, capsys):
    out_file = tmp_path / "pilot.jsonl"
    argv = ["--config", tiny, "--networks", "3", "--seeds", "0,1", "--band", "0.6",
            "--set", "data.limit=100", "--out", str(out_file)]
    out = run_main("search.pilot_task", argv, capsys)
    assert "networks 3, seeds 2: RMS seed sd" in out and "criterion" in out
    assert "normal model: truths' sd" in out
    assert len(out_file.read_text().splitlines()) == 6
    again = run_main("search.pilot_task", argv, capsys)  # resumes: nothing left to train
    assert len(out_file.read_text().splitlines()) == 6
    assert again.splitlines()[-3:-1] == out.splitlines()[-3:-1]


@pytest.mark.slow
def test_recipe_convergence(tiny, tmp_path, capsys):
    out_file = tmp_path / "convergence.jsonl"
    argv = ["--config", tiny, "--networks", "2", "--seeds", "0,1", "--band", "0.6",
            "--epochs", "2", "--set", "data.limit=100", "--out", str(out_file)]
    out = run_main("search.recipe_convergence", argv, capsys)
    assert "2 networks x 2 seeds = 4 pairs" in out and "paired 4-2 epochs:" in out
    assert "2 epochs converged" in out
    assert len(out_file.read_text().splitlines()) == 12  # 2 networks x 2 seeds x 3 recipes
    again = run_main("search.recipe_convergence", argv, capsys)  # resumes: nothing left to train
    assert len(out_file.read_text().splitlines()) == 12
    assert again.splitlines()[-3:-1] == out.splitlines()[-3:-1]


@pytest.mark.slow
def test_bench_reproduce(tiny_bench, capsys):
    import random

    from fbnas.bench.table import Bench

    tiny, bench = tiny_bench
    out = run_main("search.reproduce", ["--config", tiny, "--bench", bench, "--n", "1",
                                       "--seed", "0", "--set", "data.limit=200"], capsys)
    assert out.splitlines()[-1] in ("within 2 seed-sd (test and val): 0 of 1",
                                    "within 2 seed-sd (test and val): 1 of 1")
    b = Bench.load(bench)  # seed 0 is the benchmark's own: the fresh run is its entry
    k = random.Random(0).sample(sorted(b), 1)[0]
    test = float(out.splitlines()[-2].split()[-6])
    assert test == pytest.approx(100 * b.networks[k]["runs"]["0"]["1"]["test_acc"], abs=0.006)


# SMALL_QUICKSTART (ops.yaml) with its second stage's widths searched: the width
# script's whole path (both searches, the retrains, the side-by-side timing) on a table of a
# few entries, where the benchmark's width space times about 3,500 samples first.
SMALL_WIDTHS = """base: ops.yaml
space:
  name: quickstart_small_widths
  width_divisor: 4
  stages:
    - {channels: 8, repeats: 1, stride: 1}
    - {channels: 16, repeats: 1, stride: 2, widths: [0.5, 1.0]}
"""


@pytest.mark.slow
def test_bench_width_search(tmp_path, capsys):
    (tmp_path / "ops.yaml").write_text(SMALL_QUICKSTART, encoding="utf-8")
    (tmp_path / "widths.yaml").write_text(SMALL_WIDTHS, encoding="utf-8")
    out = run_main("search.width_search", [
        "--bench", "none", "--retrain-seeds", "0", "--ops-config", str(tmp_path / "ops.yaml"),
        "--config", str(tmp_path / "widths.yaml"),
        "--seeds", "0", "--targets", "0.5x", "--jobs", "2", "--keep", str(tmp_path / "keep"),
        "--set", "search.epochs=2", "--set", "search.warmup_epochs=1", "--set", "data.limit=200",
        "--set", "retrain.epochs=1", "--set", "retrain.warmup_epochs=0",
        "--set", "search.fit_measure=off", "--set", "retrain.measure_latency=false",
        "--set", f"latency.cache_dir={tmp_path / 'tables'}"], capsys)
    assert re.search(r"^\s+0\s+0.5x\s+\d+\.\d\s+0\.\d+\s+\d+\.\d\s+0\.\d+\s+[-+]\d", out, re.M), out
    assert re.search(r"dominate .*: [01]/1; median accuracy difference", out)



@pytest.mark.slow
def test_duel(tiny_bench, tmp_path, capsys):
    tiny, bench = tiny_bench
    argv = ["--config", tiny, "--bench", bench, "--targets", "0.5x", "--seeds", "0",
            "--retrain-seeds", "7,8,9", "--out", str(tmp_path / "duel"), "--resamples", "200",
            "--set", "data.limit=200", "--set", "search.epochs=1",
            "--set", "search.warmup_epochs=0", "--set", "search.fit_tolerance=0.5"]
    from fbnas._cli import main as fbnas_main

    def duel(args):
        assert fbnas_main(["bench", "duel", *args]) == 0
        return capsys.readouterr().out

    out = duel(argv)
    row = next(ln.split() for ln in out.splitlines() if ln.startswith("  0.5x    0"))
    assert 0 <= float(row[5]) <= 1 and 0 <= float(row[6]) <= 1  # the picks' test accuracy
    assert 0 <= float(row[-2]) <= 100 and 0 <= float(row[-1]) <= 100  # percentiles
    assert re.search(r"^ +0\.5x +1 +[+-][0-9.]+ \[", out, re.M), out
    report = json.loads((tmp_path / "duel" / "duel.json").read_text())
    assert report["summary"]["0.5x"]["pairs"] == 1
    again = duel(argv)  # resumed: the pair is not run again
    assert again == out
    assert fbnas_main(["bench", "duel", *argv, "--retrain-seeds", "0,1"]) == 2
    assert "fresh seeds" in capsys.readouterr().err


def test_band_ranking(tiny, tmp_path, capsys):
    """A tiny search, a pairs file whose random side trained three networks of its band (test
    accuracy made to follow θ's log-probability): τ of θ's log-probability reads +1."""
    from fbnas._cli import main as fbnas_main
    from fbnas.arch import log_prob
    from fbnas.fit.search_run import SearchRun
    from scripts.search.band_ranking import band

    run_dir = tmp_path / "run"
    assert fbnas_main(["train", "--config", tiny, "--set", f"run.dir={run_dir}"]) == 0
    run = SearchRun.open(run_dir)
    by_lp = {round(log_prob(run.theta, i), 9): i for i in band(run, 0.5)}  # distinct ones
    nets = [by_lp[k] for k in sorted(by_lp)][-3:]
    assert len(nets) == 3
    trained = [{"indices": list(i), "test_acc": 0.1 * (k + 1)} for k, i in enumerate(nets)]
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps({"pairs": {"0.5x/seed0": {
        "target": "0.5x", "seed": 0, "random": {"trained": trained}}}}))
    out = run_main("search.band_ranking", [str(run_dir), "--pairs", str(pairs), "--band", "0.5"],
                   capsys)
    assert re.search(r"3 with trained truth", out), out
    assert re.search(r"θ log-prob\s+Kendall τ \+1\.000", out), out
    # (the tiny supernet reads one accuracy on every path: τ undefined, printed as nan)
    assert re.search(r"path acc\s+Kendall τ [+-](\d\.\d+|nan)\s+Spearman", out), out
    assert "the supernet's first among them: percentile" in out
