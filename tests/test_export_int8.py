"""`fbnas export --quantize int8` and `fbnas eval --model`: a retrained child exported as an
int8 program (ExecuTorch/XNNPACK, ONNX Runtime QDQ), calibrated on its training images and
checked against its fake-quantized model; the program's accuracy read as the eager model's
is. The fast tier checks the refusals, the calibration images and the batch slicing; the
slow tier quantizes and lowers real programs."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import digits_run_config, one_line_error
from test_export import _perturbed_child

from fbnas._cli import main
from fbnas.arch import arch_from_indices
from fbnas.backends import export as export_mod
from fbnas.backends.export import ExportedModel, export_child
from fbnas.config import config_from_dict
from fbnas.data import build_train_data, calibration_images
from fbnas.retrain import ChildTrainer
from fbnas.training.checkpoint import load_child, save_checkpoint
from fbnas.training.logs import close_logger

TINY = digits_run_config(
    latency={"cost": "latency", "device": "fake"},
    retrain={"epochs": 3, "warmup_epochs": 1, "lr": 0.05, "device": "cpu",
             "measure_latency": False})


@pytest.fixture
def bare_ckpt(tmp_path):
    """A child checkpoint without a config (so without training images)."""
    arch, net = _perturbed_child([0, 1, 2])
    save_checkpoint(tmp_path / "checkpoint.pt", {"kind": "child", "model": net.state_dict(),
                                                 "arch": arch.to_dict(), "config": {}})
    return tmp_path


def test_int8_export_refusals_are_one_line(bare_ckpt, capsys):
    assert main(["export", "--checkpoint", str(bare_ckpt), "--format", "torchscript",
                 "--quantize", "int8"]) == 2
    assert "the torchscript format cannot be quantized; export onnx or pte" in \
        capsys.readouterr().err
    assert main(["export", "--checkpoint", str(bare_ckpt), "--format", "onnx",
                 "--quantize", "int8"]) == 2
    assert "holds no config, so no training images" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(bare_ckpt), "--format", "pte",
                 "--quantize", "int8", "--calibration-images", "0"]) == 2
    assert "--calibration-images: must be >= 1" in capsys.readouterr().err
    assert not list(bare_ckpt.glob("model*"))
    arch, model, _ = load_child(bare_ckpt)
    out = bare_ckpt / "m.pte"
    c, (h, w) = arch.macro.in_channels, arch.macro.input_size
    one_line_error(lambda: export_child(model, arch, "pte", out, quantize="int8",
                                        calibration=torch.zeros(4, c + 1, h, w)),
                   f"calibration images of shape (4, {c + 1}, {h}, {w})",
                   f"the network takes N×{c}×{h}×{w}")
    one_line_error(lambda: export_child(model, arch, "pte", out, quantize="int8"),
                   "needs calibration images")
    x = torch.zeros(2, arch.macro.in_channels, *arch.macro.input_size)
    one_line_error(lambda: export_child(model, arch, "onnx", out, batch=4, quantize="int8",
                                        calibration=x), "2 calibration image(s), fewer than")
    one_line_error(lambda: export_child(model, arch, "pt2", out, quantize="int8",
                                        calibration=x), "the pt2 format cannot be quantized")
    assert not out.exists()


def test_calibration_images_are_the_first_training_images_unaugmented():
    cfg = config_from_dict(copy.deepcopy(TINY), "tiny.yaml")
    m = cfg.space.macro
    got = calibration_images(cfg.data, m.input_size, m.in_channels, m.num_classes,
                             cfg.search.seed, 40)
    assert got.shape == (40, m.in_channels, *m.input_size)
    data = build_train_data(cfg.data, m.input_size, m.in_channels, m.num_classes,
                            cfg.search.seed)
    ds = data.val_loader.dataset  # the training set's eval (unaugmented) view
    want = torch.stack([ds[i][0] for i in sorted(data.train_indices)[:40]])
    assert torch.equal(got, want)
    assert not set(sorted(data.train_indices)[:40]) & set(data.val_indices)


def test_exported_model_runs_a_static_program_in_slices_of_its_batch(monkeypatch):
    seen: list[int] = []

    class Static:
        def input_shape(self):
            return (4, 1, 2, 2)

        def __call__(self, x):
            seen.append(len(x))
            assert len(x) == 4
            return x.flatten(1).sum(1, keepdim=True) * torch.ones(1, 3)

    monkeypatch.setattr(export_mod, "load_exported", lambda path, fmt=None: Static())
    m = ExportedModel("any.pte")
    x = torch.randn(10, 1, 2, 2)
    out = m.eval()(x)
    assert seen == [4, 4, 4] and out.shape == (10, 3)
    torch.testing.assert_close(out[:, 0], x.flatten(1).sum(1))


@pytest.mark.slow
def test_int8_programs_check_against_their_fake_quantized_model_and_eval_reads_them(
        tmp_path, capsys):
    """A retrained digits child exported int8 as .pte and .onnx (64 calibration images),
    each checked against its fake-quantized model; `fbnas eval --model` reads each
    program's test accuracy within a few points of the eager model's."""
    d = copy.deepcopy(TINY)
    d["run"]["dir"] = str(tmp_path / "runs")
    d["latency"]["cache_dir"] = str(tmp_path / "cache")
    cfg = config_from_dict(d, "tiny.yaml")
    arch = arch_from_indices(cfg.space, [1, 0], "tiny_child")
    t = ChildTrainer(cfg, arch, tmp_path / "rt")
    try:
        t.train()
    finally:
        close_logger(t.log)
    run = tmp_path / "rt"
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(run), "--format", "pte,onnx", "--quantize",
                 "int8", "--calibration-images", "64", "--out", str(tmp_path / "x") + "/"]) == 0
    out = capsys.readouterr().out
    assert "pte int8 (64 calibration images)" in out and "onnx int8" in out
    assert main(["eval", "--checkpoint", str(run), "--json", str(tmp_path / "fp32.json")]) == 0
    fp32 = json.loads((tmp_path / "fp32.json").read_text())
    for suffix in ("pte", "onnx"):
        f = tmp_path / "x" / f"model_int8.{suffix}"
        assert main(["eval", "--checkpoint", str(run), "--model", str(f), "--json",
                     str(tmp_path / f"{suffix}.json")]) == 0
        q = json.loads((tmp_path / f"{suffix}.json").read_text())
        assert q["model"] == str(f) and q["n"] == fp32["n"]
        assert abs(q["top1"] - fp32["top1"]) <= 0.05, (suffix, q["top1"], fp32["top1"])

    # into the run folder (the default path): the run records the int8 program and its
    # accuracy, and `fbnas runs` shows it beside the eager model's
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(run), "--format", "pte", "--quantize", "int8",
                 "--calibration-images", "64"]) == 0
    assert (run / "model_int8.pte").is_file() and not (run / "model.pte").exists()
    assert main(["eval", "--checkpoint", str(run), "--model", str(run / "model_int8.pte"),
                 "--json", str(tmp_path / "run_pte.json")]) == 0
    capsys.readouterr()
    assert main(["runs", str(run), "--columns", "top1,pte_int8_top1", "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["top1"] == fp32["top1"]
    assert row["pte_int8_top1"] == json.loads((tmp_path / "run_pte.json").read_text())["top1"]
