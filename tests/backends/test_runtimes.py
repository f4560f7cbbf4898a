"""Exported-runtime timers (ExecuTorch/XNNPACK, ONNX Runtime): tables built through the runtime,
the per-call overhead taken off entries, delegation recorded, programs cached by what they
compute, and one-line errors for what a runtime cannot take."""

from __future__ import annotations

import pytest
import torch
from conftest import latency_space, needs

from fbnas.backends import FORMATS, TIMERS
from fbnas.backends import exported as rt
from fbnas.errors import FbnasError
from fbnas.latency import Protocol, build_table, make_timer
from fbnas.latency.build import sample_spanning
from fbnas.latency.config import LatencyConfig
from fbnas.latency.signature import Signature
from fbnas.latency.validate import validate
from fbnas.search_space import SearchSpace

FAST = Protocol(rounds=4, extra_rounds=0, sample_s=0.002, ref_sample_s=0.001, warmup_s=0.005)
SPACE = SearchSpace.from_dict(latency_space())
SIG = Signature("block", "ir_k3_e3", 8, 16, 2, 8, 8)
RUNTIMES = tuple(n for n, c in TIMERS.items() if issubclass(c, rt.ExportedTimer))


PACKAGES = {"executorch": ("executorch", "executorch"), "ort": ("onnxruntime", "onnx")}


def _timer(runtime: str, tmp_path, **kw):
    needs(*PACKAGES[runtime])
    return make_timer(runtime, allocator="system", cache_dir=tmp_path / "exported", **kw)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_runtime_table_is_built_through_the_runtime_with_its_call_overhead_taken_off(
        runtime, tmp_path):
    # two layers of one signature: 9 networks to validate on, 2 blocks to lower (the lowering,
    # not the timing, is this test's cost)
    space = SearchSpace.from_dict(latency_space(
        stages=[{"channels": 8, "repeats": 2, "stride": 1}]))
    lines = []
    table = build_table(space, _timer(runtime, tmp_path), FAST, context_probes=2,
                        log=lines.append)
    assert table.meta["backend"] == runtime and table.meta["runtime"] == runtime
    assert table.meta["runtime_version"] and table.meta["threads"] == 1
    for e in table.entries.values():
        if e.sig.kind == "stem":  # the stem keeps the network's one call
            assert "call_overhead_ratio" not in e.stats
        else:
            assert e.stats["call_overhead_ratio"] > 0
            assert 0 <= e.stats["ratio"]
        if runtime == "executorch":
            assert 0.0 <= e.stats["delegated"] <= 1.0
    assert any("call overhead" in s for s in lines)
    # whole networks are timed in the same runtime, so validation compares like with like
    archs = sample_spanning(space, 5, table.costs_for(space, "raw")[0])
    rep = validate(space, table, _timer(runtime, tmp_path), archs=archs, protocol=FAST)
    assert len(rep["archs"]) == 5
    assert all(a["measured_us"] > 0 for a in rep["archs"])


@pytest.mark.slow  # lowers through the runtime: the runtimes are the slow tier's
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_runtime_computes_what_eager_computes(runtime, tmp_path):
    torch.manual_seed(1)
    module = SIG.build().eval()
    timer = _timer(runtime, tmp_path)
    with timer:
        run = timer.prepare(module, SIG.input_shape, SIG.key())
        got = timer.run_once(run)
    x = torch.randn(1, *SIG.input_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = module(x)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow  # lowers through ONNX: the runtimes are the slow tier's
def test_programs_are_cached_by_what_they_compute(tmp_path, monkeypatch):
    first = _timer("ort", tmp_path)
    first.prepare(SIG.build(), SIG.input_shape, "a")
    files = sorted((tmp_path / "exported" / "ort").iterdir())
    assert len(files) == 2  # the program and its record

    def no_lowering(*a, **k):
        raise AssertionError("lowered again")

    second = _timer("ort", tmp_path)  # a new process would start like this
    monkeypatch.setattr(second, "_lower", no_lowering)
    second.prepare(SIG.build(), SIG.input_shape, "b")  # same structure: from the cache
    assert sorted((tmp_path / "exported" / "ort").iterdir()) == files
    other = Signature("block", "ir_k3_e1", 8, 16, 2, 8, 8)
    with pytest.raises(AssertionError, match="lowered again"):
        second.prepare(other.build(), other.input_shape, "c")


def test_a_missing_runtime_is_a_one_line_error_naming_the_install(monkeypatch):
    monkeypatch.setattr(rt, "_version", lambda p: None)
    for runtime, extra in (("executorch", "executorch"), ("ort", "onnx")):
        with pytest.raises(FbnasError, match=rf"not installed; pip install 'fbnas\[{extra}\]'"):
            make_timer(runtime)


def test_runtime_timers_refuse_what_they_cannot_time(tmp_path):
    with pytest.raises(FbnasError, match="float32 contiguous"):
        _timer("ort", tmp_path, dtype="float16")
    with pytest.raises(FbnasError, match="float32 contiguous"):
        _timer("executorch", tmp_path, channels_last=True)
    scripted = torch.jit.script(torch.nn.ReLU())
    with pytest.raises(FbnasError, match="cannot take a TorchScript model"):
        _timer("ort", tmp_path).prepare(scripted, (3, 4, 4))


@pytest.mark.slow  # loads ExecuTorch's runtime (3.5 s to import): the slow tier's
def test_a_pte_file_that_is_missing_or_no_program_is_one_line(tmp_path):
    """What `fbnas latency measure --model X.pte` meets: a missing file, a file ExecuTorch
    cannot load, and a program asked for fbnas metadata it has no place for."""
    pte = FORMATS.get("pte")
    with pytest.raises(FbnasError, match=r"none\.pte: no such file"):
        pte.timed_module(tmp_path / "none.pte", None, 1, 1)
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"not a program")
    with pytest.raises(FbnasError, match=r"bad\.pte: cannot load as an ExecuTorch program") as e:
        pte.timed_module(bad, None, 1, 1)
    assert "\n" not in str(e.value)
    with pytest.raises(FbnasError, match="holds no fbnas metadata"):
        pte.metadata(bad)


def test_latency_config_takes_the_runtime_devices():
    cfg = LatencyConfig.from_dict({"device": "executorch", "allocator": "retain"})
    assert cfg.device == "executorch" and cfg.allocator == "retain"
    with pytest.raises(FbnasError, match="latency.*device"):
        LatencyConfig.from_dict({"device": "tflite"})


@pytest.mark.slow
def test_runtimes_are_measured_side_by_side_with_eager(tmp_path):
    """measure_runtimes: each module in eager and each runtime, in one interleaved
    measurement (keys BACKEND:label); a runtime at another thread count is refused."""
    from fbnas.latency.timed_models import measure_runtimes

    torch.manual_seed(0)
    mods = {"a": (SIG.build(), SIG.input_shape),
            "b": (Signature("block", "ir_k3_e1", 8, 8, 1, 8, 8).build(), (8, 8, 8))}
    runtimes = [_timer(r, tmp_path) for r in RUNTIMES]
    m = measure_runtimes(make_timer("cpu", allocator="system"), mods, runtimes, FAST)
    assert set(m.entries) == {f"{b}:{k}" for b in ("cpu", *RUNTIMES) for k in mods}
    assert all(len(st.times) == FAST.rounds and min(st.times) > 0 for st in m.entries.values())
    with pytest.raises(FbnasError, match="ort times 2 thread"):
        measure_runtimes(make_timer("cpu", allocator="system"), mods,
                         [_timer("ort", tmp_path, threads=2)], FAST)
