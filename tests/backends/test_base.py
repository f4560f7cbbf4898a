"""The backend registries: every timer backend and export format reachable by name, unknown
names one line naming the choices, a duplicate refused, and a backend, format or cost kind
added in a test accepted by the config, `make_timer`, export and the CLI without an edit
elsewhere. Also: the backends, export and latency packages import in any order (no cycle)."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY_SPACE, latency_space

from fbnas._cli import main
from fbnas.arch import arch_from_indices, build_child
from fbnas.backends import FORMATS, TIMERS, make_timer
from fbnas.backends.export import (
    check_format,
    export_child,
    format_of,
    load_exported,
    program_name,
)
from fbnas.backends.fake import FakeTimer
from fbnas.backends.torchscript import TorchScriptFormat
from fbnas.errors import FbnasError
from fbnas.latency import LatencyTable, build_cost_table
from fbnas.latency.config import LatencyConfig
from fbnas.latency.kinds import COST_KINDS, CostKind
from fbnas.search_space import SearchSpace
from fbnas.training.checkpoint import save_checkpoint

ROOT = Path(__file__).parents[2]


def test_every_registered_backend_is_reachable_by_name():
    assert {"cpu", "cuda", "xla", "fake", "ort", "executorch"} <= set(TIMERS)
    for name, cls in TIMERS.items():
        assert cls.backend == name  # what its tables record is the name it is chosen by
    assert {"torchscript", "onnx", "pt2", "pte"} <= set(FORMATS)
    for name, fmt in FORMATS.items():
        assert fmt.name == name and check_format(name.upper()) == name
        assert format_of(f"model{fmt.suffix}") == name
        assert program_name(name) == f"model{fmt.suffix}"
        assert program_name(name, "int8") == f"model_int8{fmt.suffix}"
    assert set(COST_KINDS) == {"latency", "flops", "params"}


def test_unknown_names_are_one_line_errors_naming_the_choices(capsys):
    for call, where in ((lambda: make_timer("tpu"), "timer: device"),
                        (lambda: check_format("tflite", "--format"), "--format")):
        with pytest.raises(FbnasError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith(f"{where}: unknown ") and "\n" not in msg
        registry = TIMERS if where.startswith("timer") else FORMATS
        assert msg.endswith(f"(choose from {', '.join(registry)})")
    with pytest.raises(FbnasError, match=r"^latency\.device: must be one of cpu, cuda, "):
        LatencyConfig.from_dict({"device": "tpu"})
    with pytest.raises(SystemExit):
        main(["latency", "build", "--config", "c.yaml", "--table", "o.json", "--device", "tpu"])
    err = capsys.readouterr().err
    assert "invalid choice: 'tpu'" in err and all(repr(n) in err for n in TIMERS)


def test_a_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match="timer backend 'cpu' is already registered"):
        TIMERS.register("cpu", FakeTimer)
    with pytest.raises(ValueError, match="export format 'onnx' is already registered"):
        FORMATS.register("onnx", TorchScriptFormat())
    with pytest.raises(ValueError, match="cost kind 'flops' is already registered"):
        COST_KINDS.register("flops", CostKind("FLOPs", "flops", measured=True))


class ToyTimer(FakeTimer):
    """A new backend as a plugin would add it: one class, one registration."""

    backend = "toy"


@pytest.fixture()
def toy_timer():
    TIMERS.register("toy", ToyTimer)
    yield
    TIMERS.unregister("toy")


def test_a_registered_timer_backend_is_taken_by_config_make_timer_and_cli(toy_timer, tmp_path):
    cfg = LatencyConfig.from_dict({"device": "toy", "allocator": "system"})
    assert type(cfg.make_timer()) is ToyTimer
    assert type(make_timer("toy", threads=1)) is ToyTimer
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"space": latency_space()}))
    out = tmp_path / "toy.json"
    assert main(["latency", "build", "--config", str(config), "--table", str(out), "--device",
                 "toy", "--rounds", "2", "--probes", "0", "--allocator", "system",
                 "--quiet"]) == 0
    assert LatencyTable.load(out).meta["backend"] == "toy"


class ToyFormat(TorchScriptFormat):
    """A new export format: TorchScript under another name and suffix."""

    name = "toyscript"
    suffixes = (".toy",)


@pytest.fixture()
def toy_format():
    FORMATS.register("toyscript", ToyFormat())
    yield
    FORMATS.unregister("toyscript")


def test_a_registered_format_is_taken_by_export_and_the_cli(toy_format, tmp_path):
    arch = arch_from_indices(SearchSpace.from_dict(TINY_SPACE, "tiny"), [0, 1, 2], "toy")
    net = build_child(arch).eval()
    rec = export_child(net, arch, "toyscript", tmp_path / "m.toy")
    assert rec["check"]["ok"] and format_of(tmp_path / "m.toy") == "toyscript"
    x = torch.randn(2, 3, *arch.macro.input_size)
    with torch.no_grad():
        assert torch.allclose(load_exported(tmp_path / "m.toy")(x), net(x), atol=1e-5)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_checkpoint(run_dir / "checkpoint.pt", {"kind": "child", "model": net.state_dict(),
                                                "arch": arch.to_dict(), "config": {}})
    assert main(["export", "--checkpoint", str(run_dir), "--format", "toyscript",
                 "--no-verify"]) == 0
    assert (run_dir / "model.toy").is_file()


def test_a_registered_cost_kind_is_tabulated_and_configured():
    COST_KINDS.register("convs", CostKind("convs", "convs", lambda m, chw: float(
        sum(isinstance(x, torch.nn.Conv2d) for x in m.modules()))))
    try:
        assert LatencyConfig.from_dict({"cost": "convs"}).cost == "convs"
        table = build_cost_table(SearchSpace.from_dict(latency_space()), "convs")
        assert table.unit == "convs" and min(e.value for e in table.entries.values()) >= 0
    finally:
        COST_KINDS.unregister("convs")


@pytest.mark.slow  # a fresh interpreter per order (2 s each); the import rule and the
# package graph's acyclicity are checked statically in the fast tier (tests/test_layers.py)
@pytest.mark.parametrize("order", list(itertools.permutations(
    ["fbnas.backends", "fbnas.backends.export", "fbnas.latency.resolve"])))
def test_the_packages_import_in_any_order_and_leave_scipy_unread(order):
    """(`fbnas.latency` itself imports nothing up front: `latency.resolve` imports the tables,
    their build and the cost models.) Also: scipy.stats (a second's import) is read by the
    functions that use it, not by every process that imports the config, the latency tables
    or the sweep (whose benchmark scoring uses it)."""
    code = "; ".join(f"import {m}" for m in order) + (
        "; import fbnas.config, fbnas.sweep.driver, sys"
        "; sys.exit('scipy.stats imported' if 'scipy.stats' in sys.modules else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr


OPTIONAL = ("onnx", "onnxruntime", "onnxscript", "executorch", "torchao", "torch_xla",
            "matplotlib")


def test_backends_import_only_optional_packages_inside_functions():
    """Everything else is imported at the top, where a cycle would show."""
    for f in sorted((ROOT / "fbnas" / "backends").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.ImportFrom):
                        assert sub.module.split(".")[0] in OPTIONAL, (f.name, sub.module)
                    elif isinstance(sub, ast.Import):
                        assert all(a.name.split(".")[0] in OPTIONAL for a in sub.names), f.name
