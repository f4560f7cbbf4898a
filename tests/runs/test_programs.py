"""A run's exported programs in its results.json: `fbnas export` records what it wrote into
the run folder, `fbnas eval --model` the program's test accuracy, `fbnas latency measure
--model` its latency, and `fbnas runs` shows them beside the eager model's figures."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import DIGITS_SPACE, digits_run_config, one_line_error

from fbnas._cli import main
from fbnas.arch import arch_from_indices, build_child
from fbnas.runs.index import COLUMNS, PROGRAM_COLUMNS, columns_for
from fbnas.runs.results import (
    load_results,
    record_program,
    record_program_anywhere,
    results_record,
    write_results,
)
from fbnas.search_space import SearchSpace
from fbnas.training.checkpoint import save_checkpoint


@pytest.fixture
def run(tmp_path):
    """A retrain run folder: a digits child's checkpoint (with its config) and results.json."""
    cfg = digits_run_config()
    arch = arch_from_indices(SearchSpace.from_dict(DIGITS_SPACE, "tiny"), [0, 1], "child")
    torch.manual_seed(0)
    net = build_child(arch).eval()
    d = tmp_path / "rt"
    d.mkdir()
    save_checkpoint(d / "checkpoint.pt", {"kind": "child", "model": net.state_dict(),
                                          "arch": arch.to_dict(), "config": cfg})
    fields = dict.fromkeys(("kind", "run_dir", "created", "arch", "space", "dataset", "device",
                            "latency_device", "target_us", "predicted_us",
                            "latency_table", "measured_us", "measured_iqr",
                            "top1", "top5", "test_ce", "val_top1", "val_ce", "params", "flops",
                            "epochs", "train_seconds", "images_per_s", "init_from",
                            "search_run", "search_seconds", "search_trainings", "sweep",
                            "programs"))
    fields.update(kind="retrain", run_dir=str(d), top1=0.5, space="tiny",
                  arch={"name": "child", "hash": arch.hash(), "ops": list(arch.ops)})
    write_results(d / "results.json", results_record(**fields))
    return d


def _programs(run_dir):
    return load_results(run_dir / "results.json")["programs"]


def test_export_eval_and_runs_show_a_program(run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--checkpoint", str(run), "--format", "torchscript"]) == 0
    assert "recorded in the run's results.json as model.ts" in capsys.readouterr().out
    p = _programs(run)["model.ts"]
    assert p["format"] == "torchscript" and p["quantization"] == "none"
    assert p["bytes"] == (run / "model.ts").stat().st_size and p["top1"] is None

    # the program's accuracy, as eval reads it, lands in the run; it equals the eager model's
    assert main(["eval", "--checkpoint", str(run), "--json", str(tmp_path / "e.json")]) == 0
    assert main(["eval", "--checkpoint", str(run), "--model", str(run / "model.ts"),
                 "--json", str(tmp_path / "p.json")]) == 0
    eager = json.loads((tmp_path / "e.json").read_text())
    prog = json.loads((tmp_path / "p.json").read_text())
    p = _programs(run)["model.ts"]
    assert p["top1"] == prog["top1"] == eager["top1"] and p["test_ce"] == pytest.approx(
        eager["ce"], abs=1e-5)

    # the validation split is not the test figure: nothing recorded
    assert main(["eval", "--checkpoint", str(run), "--model", str(run / "model.ts"),
                 "--split", "val"]) == 0
    assert _programs(run)["model.ts"]["top1"] == prog["top1"]

    capsys.readouterr()
    assert main(["runs", str(run)]) == 0
    head, row = capsys.readouterr().out.splitlines()[:2]
    assert "torchscript fp32 top1 %" in head and "pte int8 top1 %" not in head
    assert f"{100 * prog['top1']:.2f}" in row.split()[-1]

    # a new export at the path replaces the entry: the old program's figures are gone
    assert main(["export", "--checkpoint", str(run), "--format", "torchscript"]) == 0
    assert _programs(run)["model.ts"]["top1"] is None


def test_a_file_the_run_did_not_export_is_not_recorded(run, tmp_path):
    before = (run / "results.json").read_text()
    assert record_program(run / "results.json", tmp_path / "elsewhere.pte", top1=0.9) is None
    assert record_program(run / "results.json", run / "model.pte", top1=0.9) is None
    assert record_program(tmp_path / "none" / "results.json", run / "x.pte", fresh=True,
                          format="pte") is None
    assert record_program(run / "results.json", tmp_path / "out" / "model.pte", fresh=True,
                          format="pte") is None  # written outside the run folder
    assert (run / "results.json").read_text() == before


def test_latency_is_recorded_in_the_run_above_the_program(run):
    sub = run / "int8" / "model_int8.pte"
    sub.parent.mkdir()
    assert record_program(run / "results.json", sub, fresh=True, format="pte",
                          quantization="int8", bytes=10) == "int8/model_int8.pte"
    where = record_program_anywhere(sub, measured_us=93.0, measured_iqr=0.02, timer="cpu")
    assert where == f"{run / 'results.json'}: int8/model_int8.pte"
    row = load_results(run / "results.json")
    assert COLUMNS["pte_int8_us"].get(row) == 93.0
    assert COLUMNS["pte_fp32_us"].get(row) is None
    shown = columns_for([row])
    assert "pte_int8_us" in shown and "pte_int8_top1" not in shown  # no accuracy yet
    assert set(PROGRAM_COLUMNS) >= {"pte_int8_top1", "onnx_int8_us", "pte_fp32_top1"}
    with pytest.raises(ValueError, match="undeclared"):
        record_program(run / "results.json", sub, speed=1)


def test_bad_programs_entry_is_one_line_naming_the_key(run):
    f = run / "results.json"
    d = json.loads(f.read_text())
    d["programs"] = {"model.pte": {"format": "pte", "top1": "high"}}
    f.write_text(json.dumps(d))
    one_line_error(lambda: load_results(f), "programs.model.pte.top1", "number")
    d["programs"] = {"model.pte": 3}
    f.write_text(json.dumps(d))
    one_line_error(lambda: load_results(f), "programs.model.pte", "object")
