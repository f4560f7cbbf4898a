"""latency.quantization (issue 53 item 1): int8 timing is a property of a table, declared in
its meta and its cache key; an fp32 and an int8 table never mix; the exported runtimes lower
int8 programs (ExecuTorch: PT2E + XNNPACK quantizer; ONNX Runtime: static QDQ)."""

from __future__ import annotations

import pytest
import torch
from conftest import digits_run_config, needs, one_line_error

from fbnas.backends import make_timer
from fbnas.config import config_from_dict
from fbnas.latency import Protocol, build_table
from fbnas.latency.build import check_extend
from fbnas.latency.config import LatencyConfig
from fbnas.latency.resolve import cached_table_path, resolve_costs
from fbnas.latency.signature import Signature

from .fakes import FAST, fake, tiny_space


def test_a_timer_that_cannot_quantize_says_which_can():
    msg = one_line_error(lambda: make_timer("cpu", quantization="int8"),
                         "device 'cpu' cannot time int8", "executorch", "ort")
    assert "fake" in msg  # the test device models int8 too
    one_line_error(lambda: make_timer("fake", quantization="int4"),
                   "quantization must be one of none, int8", "'int4'")
    one_line_error(lambda: LatencyConfig.from_dict({"quantization": "int4"}, "c.yaml: latency"),
                   "c.yaml: latency", "quantization")


def test_an_int8_table_says_so_and_an_fp32_table_is_as_before():
    space = tiny_space()
    fp32 = build_table(space, fake(), FAST, context_probes=0)
    int8 = build_table(space, fake(quantization="int8"), FAST, context_probes=0)
    assert "quantization" not in fp32.meta  # its meta, fingerprint and cache key unchanged
    assert int8.meta["quantization"] == "int8"
    assert int8.fingerprint() != fp32.fingerprint()
    # the fake device's int8 convs run faster: every conv-bearing entry is cheaper
    blocks = [k for k, e in fp32.entries.items() if e.sig.kind == "block" and e.sig.op != "skip"]
    assert blocks and all(int8.entries[k].value < fp32.entries[k].value for k in blocks)
    # a table is used only for the quantization it was timed in, in one line naming the flag
    one_line_error(lambda: int8.check_run(quantization="none"),
                   "meta.quantization is 'int8'", "--quantization none")
    one_line_error(lambda: fp32.check_run(quantization="int8"),
                   "meta.quantization is 'none'", "--quantization int8")
    int8.check_run(quantization="int8")
    fp32.check_run(quantization="none")
    # nor extended with the other's timings
    one_line_error(lambda: check_extend(fp32, fake(quantization="int8"), "t.json"),
                   "meta.quantization")
    assert "--quantization int8" in int8.build_command("c.yaml")


def _cfg(tmp_path, quantization):
    d = digits_run_config(latency={"cost": "latency", "device": "fake",
                                   "quantization": quantization,
                                   "cache_dir": str(tmp_path / "cache")})
    return config_from_dict(d, "c.yaml")


def test_a_search_builds_and_caches_one_table_per_quantization(tmp_path):
    none, int8 = _cfg(tmp_path, "none"), _cfg(tmp_path, "int8")
    none_path = cached_table_path(none.space, none.latency)
    int8_path = cached_table_path(int8.space, int8.latency)
    assert none_path != int8_path
    src = resolve_costs(int8.space, int8.latency, log=lambda _: None)
    assert src.table.meta["quantization"] == "int8"
    assert int8_path.is_file() and not none_path.is_file()
    # a config naming that table but asking for fp32 timing is refused where it is read
    bad = config_from_dict({**digits_run_config(latency={
        "cost": "latency", "device": "fake", "table": str(int8_path)})},
        "c.yaml")
    one_line_error(lambda: resolve_costs(bad.space, bad.latency, log=lambda _: None),
                   "meta.quantization", "--quantization none")


def test_the_measured_fit_of_an_int8_search_times_int8_programs(tmp_path, monkeypatch):
    """Item 4: a search whose table is int8 is fitted by timing int8 programs (the measured
    fit's timer takes the table's quantization), in the table's units."""
    import fbnas.fit.select as select

    cfg = _cfg(tmp_path, "int8")
    table = resolve_costs(cfg.space, cfg.latency, log=lambda _: None).table
    seen = []

    def time_archs(timer, archs, table_, pan, stop_ci=0.0):
        seen.append((timer.quantization, timer.backend, table_ is table))
        return {name: {"median_us": 7.0, "rel_iqr": 0.01} for name in archs}

    monkeypatch.setattr(select, "time_archs", time_archs)
    measure = select.fit_measurer(cfg, table)
    assert measure([0] * cfg.space.num_layers) == (7.0, 0.01)
    assert seen == [("int8", "fake", True)]


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["executorch", "ort"])
def test_a_runtime_times_an_int8_program_close_to_the_float_block(runtime, tmp_path):
    needs(*{"executorch": ("executorch", "torchao"), "ort": ("onnxruntime", "onnx")}[runtime])
    sig = Signature("block", "ir_k3_e3", 8, 16, 2, 8, 8)
    torch.manual_seed(1)
    module = sig.build().eval()
    x = torch.randn(1, *sig.input_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = module(x)
    got = {}
    for q in ("none", "int8"):
        timer = make_timer(runtime, quantization=q, allocator="system",
                           cache_dir=tmp_path / "exported")
        with timer:
            run = timer.prepare(module, sig.input_shape, sig.key())
            got[q] = timer.run_once(run)
            assert timer.sample(run, 3) > 0
    assert torch.allclose(got["none"], want, atol=1e-4, rtol=1e-4)
    # int8: the same function within quantization error, not the same program
    err = (got["int8"] - want).norm() / want.norm()
    assert 0 < err < 0.1, err
    # and a table of a one-layer space through the runtime in int8 (each program's int8
    # lowering takes seconds)
    one_layer = tiny_space(candidates=["ir_k3_e1", "skip"],
                           stages=[{"channels": 8, "repeats": 1, "stride": 1}])
    table = build_table(one_layer, make_timer(runtime, quantization="int8", allocator="system",
                                              cache_dir=tmp_path / "exported"),
                        Protocol(rounds=2, extra_rounds=0, sample_s=0.002, ref_sample_s=0.001,
                                 warmup_s=0.005), context_probes=0)
    assert table.meta["quantization"] == "int8" and table.meta["backend"] == runtime
