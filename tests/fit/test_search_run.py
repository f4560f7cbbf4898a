"""SearchRun: a search run directory opened once, read as every reader read it before; RunFiles
names the files once; results.json's one schema (the writer and the reader agree)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest
import torch

from fbnas.arch import Architecture, sample_hard
from fbnas.errors import FbnasError
from fbnas.fit.search_run import SearchRun
from fbnas.fit.select import refit
from fbnas.runs import files as run_files
from fbnas.runs.files import RunFiles
from fbnas.runs.results import FIELDS, load_results, results_record, write_results
from tests.fit.measured import fake_run, run_search

PACKAGE = Path(__file__).resolve().parents[2] / "fbnas"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished search (config, trainer, its arch file as saved), searched once."""
    tmp = tmp_path_factory.mktemp("search")
    cfg = fake_run(tmp)
    trainer, saved = run_search(cfg, tmp)
    return tmp / "run", cfg, trainer, saved


def _copy(finished, tmp_path) -> Path:
    """A copy of the finished run that a test may damage."""
    return Path(shutil.copytree(finished[0], tmp_path / "run"))


def test_a_finished_run_opens_once_with_everything_it_wrote(finished):
    run_dir, cfg, trainer, saved = finished
    run = SearchRun.open(run_dir)
    assert run.epoch == cfg.search.epochs and run.config.space.macro == cfg.space.macro
    assert all(torch.equal(a, b.detach()) for a, b in zip(run.theta, trainer.net.theta,
                                                           strict=True))
    assert run.table is not None and run.table.fingerprint() == trainer.costs.table.fingerprint()
    assert run.costs.rows == trainer.costs.rows and run.target == pytest.approx(
        trainer.loss.target)
    assert list(run.arch.ops) == saved["ops"]
    assert run.search_seconds == pytest.approx(sum(h["seconds"] for h in trainer.history))
    net = run.supernet()  # the checkpoint's weights (the final pick re-estimates BN after it)
    saved_model = run.state["model"]
    for k, v in net.state_dict().items():
        assert torch.equal(v, saved_model[k]), k
    for a, b in zip(net.weight_parameters(), trainer.net.weight_parameters(), strict=True):
        assert torch.equal(a, b.detach().cpu())
    # the checkpoint file opens the same run
    assert SearchRun.open(run_dir / "checkpoint.pt").dir == run_dir
    # a re-fit by the table alone returns the recorded network (fbnas sample --refit)
    again = refit(run, "off", log=lambda m: None)
    assert again.meta["target"] == pytest.approx(run.target)
    assert again.meta["run"] == str(run.dir)


def test_what_is_missing_or_damaged_is_one_line_naming_the_file(finished, tmp_path):
    with pytest.raises(FbnasError, match="checkpoint.pt"):
        _ = SearchRun.open(tmp_path / "nothing").state
    run_dir = _copy(finished, tmp_path)
    run = SearchRun.open(run_dir)
    run.state["model"]["theta.0"] = torch.zeros(99)
    with pytest.raises(FbnasError, match=r"model.theta.0 does not fit decision 0"):
        _ = run.theta
    # a run without a table or an arch file: no table, no arch, and the costs say why
    RunFiles(run_dir).table.unlink()
    RunFiles(run_dir).arch.unlink()
    bare = SearchRun.open(run_dir)
    assert bare.table is None and bare.arch is None and bare.recorded_pick == ([], None)
    with pytest.raises(FbnasError, match="cost_table.json"):
        _ = bare.costs
    # with no table, a re-fit is θ's argmax
    a = refit(bare, "off", log=lambda m: None)
    assert list(a.ops) == list(sample_hard(bare.config.space, bare.theta).ops)


def test_the_run_files_are_named_in_one_module_only():
    """No module of fbnas/ but runs/files.py spells a run directory's file names."""
    names = {v for k, v in vars(run_files).items() if k.isupper() and isinstance(v, str)}
    assert {"checkpoint.pt", "theta.json", "cost_table.json", "arch_hard.yaml",
            "results.json"} <= names
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "files.py" and path.parent.name == "runs":
            continue
        if path.name in ("bundle_runner.py", "bundle.py"):  # a bundle's own results.json
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value}")
    assert not found, found


def test_a_checkpoint_or_its_run_folder_name_the_same_run(tmp_path):
    """RunFiles.of / checkpoint_of: the one rule of the commands that take either."""
    run = tmp_path / "retrain"
    run.mkdir()
    ckpt = RunFiles(run).checkpoint
    ckpt.write_bytes(b"x")
    elsewhere = tmp_path / "kept" / "best.pt"
    for given in (run, ckpt):
        assert RunFiles.of(given).dir == run and RunFiles.of(given).results == run / "results.json"
        assert RunFiles.checkpoint_of(given) == ckpt
    assert RunFiles.of(elsewhere).dir == elsewhere.parent  # a file not yet there: its folder
    assert RunFiles.checkpoint_of(elsewhere) == elsewhere


def test_results_writer_and_reader_share_one_schema(tmp_path):
    values = {k: None for k in FIELDS}
    values.update(kind="retrain", top1=0.5, arch={"name": "a", "hash": "h", "ops": ["skip"]})
    rec = results_record(**values)
    assert list(rec) == ["fbnas_results", *FIELDS]
    write_results(tmp_path / "results.json", rec)
    row = load_results(tmp_path / "results.json")
    assert row["top1"] == 0.5 and row["arch"]["ops"] == ["skip"]
    with pytest.raises(ValueError, match=r"undeclared keys \['bogus'\]"):
        results_record(**values, bogus=1)
    del values["top1"]
    with pytest.raises(ValueError, match=r"missing keys \['top1'\]"):
        results_record(**values)
    # a value of the wrong kind is a one-line error naming the key
    values["top1"], values["test_ce"] = 0.5, "high"
    write_results(tmp_path / "bad.json", results_record(**values))
    with pytest.raises(FbnasError, match="'test_ce' must be a number"):
        load_results(tmp_path / "bad.json")


def test_an_architecture_file_reads_back_through_the_run(finished):
    run = SearchRun.open(finished[0])
    assert run.arch.hash() == Architecture.load(finished[0] / "arch_hard.yaml").hash()
