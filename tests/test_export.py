"""`fbnas export`: TorchScript and ONNX files that compute what the eager child network does."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import TINY_SPACE

from fbnas._cli import main
from fbnas.arch import arch_from_indices, build_child
from fbnas.backends import FORMATS
from fbnas.backends.export import (
    check_equivalence,
    export_child,
    exported_metadata,
    load_exported,
)
from fbnas.errors import FbnasError
from fbnas.search_space import SearchSpace
from fbnas.training.checkpoint import load_child, save_checkpoint

# The ONNX tests need the onnx extra, which the dev extra includes: without it they fail
# (with the one-line error naming the extra) rather than skip.


def _perturbed_child(indices):
    """A tiny child with random BN statistics/affines and a full-scale classifier, so BN is not
    the identity and the logits are O(1), not ~1e-2."""
    arch = arch_from_indices(SearchSpace.from_dict(TINY_SPACE, "tiny"), indices, "tiny_child")
    net = build_child(arch)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.randn(c, generator=g) * 0.1)
            elif isinstance(m, torch.nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.3)
    return arch, net.eval()


@pytest.fixture(scope="module")
def child_ckpt(tmp_path_factory):
    """A retrain run directory holding a child checkpoint (ops ir_k3_e1, ir_k5_e3, skip: the
    skip is a strided projection, the k5 block a residual)."""
    run_dir = tmp_path_factory.mktemp("retrain_run")
    arch, net = _perturbed_child([0, 1, 2])
    save_checkpoint(run_dir / "checkpoint.pt", {"kind": "child", "model": net.state_dict(),
                                                "arch": arch.to_dict(), "config": {}})
    return run_dir


def _inputs(arch, n, seed=123):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, arch.macro.in_channels, *arch.macro.input_size, generator=g)


@pytest.mark.parametrize("fmt", ["torchscript", pytest.param("onnx", marks=pytest.mark.slow)])
def test_export_matches_eager_at_another_batch_size(child_ckpt, tmp_path, fmt):
    arch, model, _ = load_child(child_ckpt)
    out = tmp_path / f"child.{'ts' if fmt == 'torchscript' else 'onnx'}"
    rec = export_child(model, arch, fmt, out, batch=2)
    assert out.is_file() and rec["bytes"] == out.stat().st_size > 0
    assert rec["check"]["ok"] and rec["check"]["samples"] == 2 + 5  # batch 2 and batch 5
    assert not list(tmp_path.glob(".*unverified")), "temporary file left behind"

    # Independently of export_child's own check: batch 7 (the export example had 2).
    x = _inputs(arch, 7)
    with torch.no_grad():
        ref = model(x)
        got = load_exported(out)(x.clone())
    assert got.shape == (7, TINY_SPACE["num_classes"])
    assert ref.abs().max() > 0.1, "eager outputs are near zero: the comparison would be vacuous"
    rtol, atol = FORMATS.get(fmt).tolerance
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)
    assert torch.equal(got.argmax(1), ref.argmax(1))

    res = check_equivalence(model, out, fmt, [x, _inputs(arch, 3, seed=9)])
    assert res["ok"] and res["samples"] == 10 and res["argmax_agreement"] == 1.0
    assert res["max_abs_diff"] <= atol

    # The file names its architecture.
    meta = exported_metadata(out)
    assert meta["arch_hash"] == arch.hash() and meta["arch_name"] == "tiny_child"
    assert meta["arch"]["ops"] == arch.to_dict()["ops"]


def test_check_equivalence_detects_a_different_model(child_ckpt, tmp_path):
    arch, model, _ = load_child(child_ckpt)
    out = tmp_path / "m.ts"
    export_child(model, arch, "torchscript", out)
    with torch.no_grad():
        model.blocks[1].pwl[1].running_mean.add_(0.5)  # BN statistic of one residual block
    res = check_equivalence(model, out, "torchscript", _inputs(arch, 4))
    assert not res["ok"] and res["max_abs_diff"] > FORMATS.get("torchscript").tolerance[1]


def test_failed_verification_writes_nothing(child_ckpt, tmp_path, monkeypatch):
    arch, model, _ = load_child(child_ckpt)
    out = tmp_path / "m.ts"
    out.write_bytes(b"previous export")
    monkeypatch.setattr(FORMATS.get("torchscript"), "tolerance", (0.0, -1.0))  # none can pass
    with pytest.raises(FbnasError, match=r"m\.ts: the exported torchscript model differs"):
        export_child(model, arch, "torchscript", out)
    assert out.read_bytes() == b"previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ts"]


def test_onnx_legacy_exporter_for_old_opsets_and_as_fallback(child_ckpt, tmp_path,
                                                             monkeypatch):
    arch, model, _ = load_child(child_ckpt)
    rec = export_child(model, arch, "onnx", tmp_path / "o17.onnx", opset=17)
    assert rec["opset"] == 17 and rec["method"] == "torch.onnx.export(dynamo=False)"
    assert rec["check"]["ok"]

    real = torch.onnx.export

    def dynamo_fails(*a, **kw):
        if kw.get("dynamo"):
            raise RuntimeError("unsupported op\nsecond line")
        return real(*a, **kw)

    monkeypatch.setattr(torch.onnx, "export", dynamo_fails)
    rec = export_child(model, arch, "onnx", tmp_path / "fb.onnx", batch=2)
    assert rec["method"] == "torch.onnx.export(dynamo=False)" and rec["check"]["ok"]
    assert rec["fallback_reason"] == "dynamo exporter: unsupported op"
    assert rec["check"]["samples"] == 2 + 5  # the legacy export's batch axis is dynamic too
    assert exported_metadata(tmp_path / "fb.onnx")["arch_hash"] == arch.hash()


@pytest.mark.slow
def test_cli_exports_onnx_next_to_the_checkpoint(child_ckpt, capsys):
    assert main(["export", "--checkpoint", str(child_ckpt), "--format", "onnx"]) == 0
    out = child_ckpt / "model.onnx"
    assert out.is_file()
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{out}: onnx ")
    assert "max abs diff" in lines[0]
    arch, model, _ = load_child(child_ckpt)
    assert exported_metadata(out)["arch_hash"] == arch.hash()


def test_cli_comma_list_and_out_directory(child_ckpt, tmp_path, capsys):
    ckpt_file = child_ckpt / "checkpoint.pt"
    rc = main(["export", "--checkpoint", str(ckpt_file), "--format", "torchscript,torchscript",
               "--out", str(tmp_path) + "/", "--no-verify", "--batch", "4"])
    assert rc == 0
    assert (tmp_path / "model.ts").is_file()
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "not verified" in lines[0]  # duplicates collapse


def test_cli_missing_checkpoint_is_a_one_line_error(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert main(["export", "--checkpoint", str(missing), "--format", "torchscript"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fbnas export: error: ")
    assert str(missing) in err[0]


@pytest.mark.parametrize("argv, needle", [
    (["--format", "tflite"], "'tflite'"),
    (["--format", "torchscript", "--batch", "0"], "--batch"),
    (["--format", "torchscript,onnx", "--out", __file__], "--out: "),  # a file, not a folder
])
def test_cli_bad_arguments(child_ckpt, capsys, argv, needle):
    assert main(["export", "--checkpoint", str(child_ckpt), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_missing_onnx_extra_names_it(child_ckpt, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` now raises ImportError
    arch, model, _ = load_child(child_ckpt)
    out = tmp_path / "m.onnx"
    with pytest.raises(FbnasError, match=r"onnx.*pip install 'fbnas\[onnx\]'") as e:
        export_child(model, arch, "onnx", out)
    assert "\n" not in str(e.value)
    assert not out.exists()
    # The CLI checks every format before exporting any, so torchscript is not half done.
    rc = main(["export", "--checkpoint", str(child_ckpt), "--format", "torchscript",
               "--format", "onnx", "--out", str(tmp_path)])
    assert rc == 2
    assert "fbnas[onnx]" in capsys.readouterr().err
    assert not (tmp_path / "model.ts").exists()


def test_pt2_export_keeps_a_dynamic_batch_and_names_its_architecture(child_ckpt, tmp_path):
    arch, model, _ = load_child(child_ckpt)
    out = tmp_path / "child.pt2"
    rec = export_child(model, arch, "pt2", out, batch=2)
    assert rec["check"]["ok"] and rec["check"]["samples"] == 2 + 5 and rec["dynamic_batch"]
    x = _inputs(arch, 7)
    with torch.no_grad():
        ref = model(x)
        got = load_exported(out)(x.clone())
    rtol, atol = FORMATS.get("pt2").tolerance
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)
    meta = exported_metadata(out)
    assert meta["arch_hash"] == arch.hash() and meta["record"]["format"] == "pt2"


@pytest.mark.slow
def test_pte_export_runs_in_executorch_like_eager(child_ckpt, tmp_path):
    arch, model, _ = load_child(child_ckpt)
    out = tmp_path / "child.pte"
    rec = export_child(model, arch, "pte", out, batch=1)
    assert rec["check"]["ok"] and rec["check"]["samples"] == 1 and not rec["dynamic_batch"]
    assert 0.0 < rec["delegated"] <= 1.0
    x = _inputs(arch, 1)
    with torch.no_grad():
        ref = model(x)
    rtol, atol = FORMATS.get("pte").tolerance
    torch.testing.assert_close(load_exported(out)(x.clone()), ref, rtol=rtol, atol=atol)
    with pytest.raises(FbnasError, match="holds no fbnas metadata"):
        exported_metadata(out)


@pytest.mark.slow
def test_cli_exports_pt2_and_pte_and_measure_times_them_with_an_arch(child_ckpt, tmp_path,
                                                                      capsys):
    assert main(["export", "--checkpoint", str(child_ckpt), "--format", "pt2,pte",
                 "--out", str(tmp_path) + "/"]) == 0
    out = capsys.readouterr().out
    assert "model.pt2: pt2" in out and "model.pte: pte" in out
    arch, _, _ = load_child(child_ckpt)
    arch.save(tmp_path / "arch.yaml")
    rc = main(["latency", "measure", "--arch", str(tmp_path / "arch.yaml"),
               "--model", str(tmp_path / "model.pt2"), str(tmp_path / "model.pte"),
               "--allocator", "system", "--rounds", "4"])
    got = capsys.readouterr()
    assert rc == 0, got.err
    assert "model.pt2" in got.out and "model.pte" in got.out
