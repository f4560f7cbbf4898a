"""Latency tables: signatures, the file format, build/extend/resume, validation (fake timer)."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
import torch
from conftest import latency_space

from fbnas.arch import ChildNet, arch_from_indices, build_child, count_flops, count_params
from fbnas.backends.fake import FakeTimer
from fbnas.cost_kinds import count_flops as count_module_flops
from fbnas.errors import FbnasError
from fbnas.latency import (
    LatencyTable,
    Protocol,
    apply_report,
    block_signature,
    build_cost_table,
    build_table,
    layer_signatures,
    make_timer,
    sample_spanning,
    space_hash,
    space_signatures,
    validate,
)
from fbnas.latency.build import (
    EXPONENT_BOUNDS,
    fit_context_model,
    refresh_values,
)
from fbnas.latency.measure import REFERENCE
from fbnas.latency.signature import arch_signatures
from fbnas.search_space import SearchSpace, load_space
from fbnas.supernet import Supernet

FAST = Protocol(rounds=4, extra_rounds=2)

TINY = latency_space()


def tiny_space(**over) -> SearchSpace:
    return SearchSpace.from_dict({**TINY, **over})


class CountingFake(FakeTimer):
    """A fake timer that counts how often each signature was prepared (built)."""

    def __init__(self, *a, interrupt_at: int | None = None, **kw):
        super().__init__(*a, **kw)
        self.prepared: list[str] = []
        self.interrupt_at = interrupt_at

    def prepare(self, module, input_chw, label=""):
        self.prepared.append(label)
        if len(self.prepared) == self.interrupt_at:
            raise KeyboardInterrupt  # as if Ctrl-C came while building
        return super().prepare(module, input_chw, label)


def fake(**kw) -> CountingFake:
    return CountingFake(**{"threads": 1, "batch": 1, "dtype": "float32", **kw})


@pytest.fixture(scope="module")
def built():
    space = tiny_space()
    table = build_table(space, fake(noise=0.02, seed=1), FAST, context_probes=3)
    return space, table


# ---- signatures ------------------------------------------------------------------------------
def test_signature_keys_are_canonical_and_readable():
    sig = block_signature("k3_e6", 16, 24, 1, 32, 32)
    assert sig.key() == "ir_k3_e6 c16-24 s1 32x32"
    assert block_signature("ir_k3_s2", 16, 16, 1, 8, 8).op == "ir_k3_e1_g2"


def test_repeated_shapes_are_measured_once():
    space = tiny_space()
    sigs = space_signatures(space)
    # stem + 3 ops x (8->8 s1 8x8, 8->16 s2 8x8, 16->16 s1 4x4) + head; 5 layers x 3 ops = 15
    assert len(sigs) == 1 + 9 + 1 == len(set(sigs))
    timer = fake()
    build_table(space, timer, FAST, context_probes=0)
    entries = [p for p in timer.prepared if p != "reference"]
    assert sorted(entries) == sorted(s.key() for s in sigs)


# ---- the file --------------------------------------------------------------------------------
def test_round_trip_and_fingerprint(built, tmp_path):
    space, table = built
    p = tmp_path / "t.json"
    table.save(p)
    back = LatencyTable.load(p)
    assert back.to_dict() == json.loads(p.read_text())
    assert back.fingerprint() == table.fingerprint()
    assert back.meta["batch"] == 1 and back.meta["dtype"] == "float32"
    assert back.meta["backend"] == "fake" and "created" in back.meta
    (rows_a, fixed_a), (rows_b, fixed_b) = back.costs_for(space), table.costs_for(space)
    assert fixed_a == pytest.approx(fixed_b)
    assert all(a == pytest.approx(b) for a, b in zip(rows_a, rows_b, strict=True))
    back.meta["created"] = "1999-01-01T00:00:00+00:00"
    assert back.fingerprint() == table.fingerprint()  # creation time does not count
    key = next(iter(back.entries))
    back.entries[key].value += 1.0
    assert back.fingerprint() != table.fingerprint()
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write leaves no temp file


@pytest.mark.parametrize("edit, msg", [
    (lambda d: d.update(fbnas_cost_table=9), "schema version 9"),
    (lambda d: d["entries"].update({"bogus": next(iter(d["entries"].values()))}),
     "key does not match"),
    (lambda d: d["meta"].pop("batch"), "missing key 'batch'"),
    (lambda d: next(iter(d["entries"].values())).update(value=-1), "must be >= 0"),
    (lambda d: d.update(extra=1), "unknown key 'extra'"),
])
def test_bad_files_are_refused_in_one_line(built, tmp_path, edit, msg):
    _, table = built
    d = json.loads(json.dumps(table.to_dict()))
    edit(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(FbnasError, match=msg) as e:
        LatencyTable.load(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_non_canonical_op_in_file_is_refused(built, tmp_path):
    _, table = built
    d = table.to_dict()
    key, entry = next((k, e) for k, e in d["entries"].items() if e["sig"]["kind"] == "block")
    entry["sig"]["op"] = "k3_e1"
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({**d, "entries": {key: entry}}))
    with pytest.raises(FbnasError, match="not canonical"):
        LatencyTable.load(p)


# ---- costs for a space -----------------------------------------------------------------------
def test_costs_for_feeds_the_supernet(built):
    space, table = built
    rows, fixed = table.costs_for(space, "raw")
    assert len(rows) == space.num_layers and fixed > 0
    assert rows[0] == rows[1] == rows[2]  # identical layers share entries
    net = Supernet(space)
    net.set_costs(rows, fixed)
    lo, hi = net.cost_bounds()
    assert lo < hi
    arch = arch_from_indices(space, [1, 0, 2, 1, 0])
    assert table.predict(arch) == pytest.approx(
        fixed + sum(r[op] for r, op in zip(rows, arch.ops, strict=True)))


def test_missing_signatures_are_all_listed_with_the_command(built, tmp_path):
    space, table = built
    bigger = tiny_space(candidates=["ir_k3_e1", "ir_k3_e3", "skip", "ir_k5_e6"],
                        head={"channels": 64})
    t = LatencyTable.from_dict(table.to_dict())
    t.path = str(tmp_path / "lat.json")
    with pytest.raises(FbnasError) as e:
        t.costs_for(bigger, config="configs/big.yaml")
    msg = str(e.value)
    assert "4 signature(s)" in msg and "ir_k5_e6 c8-8 s1 8x8" in msg
    assert "ir_k5_e6 c16-16 s1 4x4" in msg and "ir_k5_e6 c8-16 s2 8x8" in msg
    assert "head avg c16-64 4x4 cls5" in msg
    assert "fbnas latency build --config configs/big.yaml --device fake" in msg
    assert "--batch 1 --dtype float32" in msg and str(tmp_path / "lat.json") in msg
    assert "\n" not in msg


def test_wrong_batch_or_dtype_is_refused(built):
    _, table = built
    table.check_run(batch=1, dtype="float32")
    with pytest.raises(FbnasError, match=r"meta.batch is 1 but this run asks for 8"):
        table.check_run(batch=8)
    with pytest.raises(FbnasError, match=r"meta.dtype is 'float32'.*'float16'"):
        table.check_run(dtype="float16")
    with pytest.raises(FbnasError, match="meta.batch is 1"):
        validate(tiny_space(), table, make_timer("fake", batch=8))


# ---- build: determinism, extension, resumption, drift ----------------------------------------
def test_fake_build_is_deterministic():
    a = build_table(tiny_space(), fake(noise=0.05, seed=3), FAST, context_probes=2)
    b = build_table(tiny_space(), fake(noise=0.05, seed=3), FAST, context_probes=2)
    assert a.fingerprint() == b.fingerprint()
    assert a.noise["entries"] == 11 and a.context["probes"] == 2


def test_extending_measures_only_missing_entries(built):
    space, table = built
    t = LatencyTable.from_dict(table.to_dict())
    bigger = tiny_space(candidates=["ir_k3_e1", "ir_k3_e3", "skip", "ir_k5_e6"])
    timer = fake()
    build_table(bigger, timer, FAST, table=t)
    new = [p for p in timer.prepared if p != "reference"]
    assert sorted(new) == sorted(s.key() for s in t.missing(space) + [
        block_signature("ir_k5_e6", *sh) for sh in
        [(8, 8, 1, 8, 8), (8, 16, 2, 8, 8), (16, 16, 1, 4, 4)]])
    assert t.missing(bigger) == []
    old_key = next(iter(table.entries))
    assert t.entries[old_key].value == table.entries[old_key].value  # old entries untouched
    assert t.reference == table.reference and t.context == table.context
    with pytest.raises(FbnasError, match="meta.batch"):
        build_table(bigger, fake(batch=4), FAST, table=t)


def test_interrupted_build_resumes_where_it_stopped(tmp_path):
    space = tiny_space()
    out = tmp_path / "lat.json"
    timer = fake(interrupt_at=1 + 3 + 3 + 2)  # reference, chunks 1-2, 2 of chunk 3
    with pytest.raises(KeyboardInterrupt):
        build_table(space, timer, FAST, out=out, chunk=3, context_probes=2)
    partial = LatencyTable.load(out)
    assert len(partial) == 6
    n_partial = len(partial)
    timer2 = fake()
    assert partial.context is None  # the probes are timed once the entries are done
    done = build_table(space, timer2, FAST, table=partial, out=out, chunk=3, context_probes=2)
    assert done.missing(space) == []
    resumed = [p for p in timer2.prepared if p != "reference" and not p.startswith("probe")]
    assert len(resumed) == 11 - n_partial
    final = LatencyTable.load(out)
    assert "_ref_times_s" not in final.noise and "_probe_ratios" not in final.noise
    assert final.context["probes"] == 2


def test_context_factor_is_folded_into_values():
    space = tiny_space()
    plain = build_table(space, fake(), FAST, context_probes=0)
    assert plain.context is None
    before = {k: e.value for k, e in plain.entries.items()}
    fitted = build_table(space, fake(), FAST, context_probes=3)
    s = fitted.context["scale"]
    assert fitted.context["probes"] == 3 and 0.8 < s < 1.25  # the fake network = its blocks
    assert all(e.value == pytest.approx(before[k] * s) for k, e in fitted.entries.items())


class ContextFake(CountingFake):
    """A fake device whose whole networks take scale · Σ_e ratio_e^exponent reference times,
    ratio_e being entry e's isolated time over the reference op's: the in-network law that the
    context model fits (a real CPU's big blocks gain less inside a network than small ones)."""

    def __init__(self, *a, scale: float = 1.3, exponent: float = 0.85, **kw):
        super().__init__(*a, **kw)
        self.law = (scale, exponent)

    def prepare(self, module, input_chw, label=""):
        base = super().prepare  # (a comprehension cannot call super() itself)
        run = base(module, input_chw, label)
        if isinstance(module, ChildNet):
            ref = base(REFERENCE.build(), REFERENCE.input_shape).cost_s
            parts = [base(s.build(), s.input_shape).cost_s
                     for s in arch_signatures(module.arch)]
            c, g = self.law
            run.cost_s = ref * c * sum((t / ref) ** g for t in parts)
        return run


def test_context_model_fits_the_in_network_law_and_beats_a_single_factor():
    space = tiny_space()
    table = build_table(space, ContextFake(), FAST, context_probes=8)
    ctx = table.context
    assert ctx["exponent"] == pytest.approx(0.85, abs=0.01)
    assert ctx["scale"] == pytest.approx(1.3, rel=0.02)
    assert max(abs(e) for e in ctx["probe_errors"]) < 0.005
    ref = table.reference["scale_us"]
    for e in table.entries.values():  # every value is the model applied to the entry's ratio
        assert e.value == pytest.approx(ref * ctx["scale"] * e.stats["ratio"] ** ctx["exponent"])
    single = LatencyTable.from_dict(table.to_dict())
    single.context = {"scale": float(np.median(ctx["probe_ratios"])), "probes": 8}
    refresh_values(single)  # the model before the exponent: one factor
    held_out = sample_spanning(space, 10, table.costs_for(space, "raw")[0], seed=3)
    err = {}
    for name, t in (("model", table), ("single", single)):
        rep = validate(space, t, ContextFake(), archs=held_out, repeats=1, protocol=FAST)
        err[name] = rep["table"]["mape"]
    assert err["model"] < 0.002 and err["single"] > 0.02, err


def test_context_model_keeps_one_factor_with_few_probes_and_bounds_the_exponent():
    rng = np.random.default_rng(0)
    parts = [list(rng.uniform(0.1, 5.0, 6)) for _ in range(3)]
    nets = [1.2 * sum(p) for p in parts]
    assert fit_context_model(parts, nets) == pytest.approx((1.2, 1.0))  # 3 probes: one factor
    parts = [list(rng.uniform(0.1, 5.0, 6)) for _ in range(10)]
    nets = [sum(r ** 0.3 for r in p) for p in parts]  # far outside the bounds
    scale, exponent = fit_context_model(parts, nets)
    assert exponent == pytest.approx(EXPONENT_BOUNDS[0])
    assert scale > 0


def test_reference_op_compensates_machine_drift():
    """With the machine's speed drifting 2x, normalising by the reference keeps entries
    steady; without it, their spread is large."""
    space = tiny_space()
    steady = build_table(space, fake(), FAST, context_probes=0)
    drifting = build_table(space, fake(drift=1.0), FAST, context_probes=0)
    raw = build_table(space, fake(drift=1.0), Protocol(rounds=4, extra_rounds=0,
                                                       reference=False), context_probes=0)

    def change(t):
        return max(abs(t.entries[k].value / steady.entries[k].value - 1) for k in steady.entries)

    def spread(t):
        return max(e.stats["rel_iqr"] for e in t.entries.values())

    assert spread(drifting) < 0.15 < spread(raw)
    # the value scale follows the reference's median, so compare shapes, not levels
    a = [drifting.entries[k].value / steady.entries[k].value for k in steady.entries]
    assert max(a) / min(a) < 1.15


# ---- FLOPs and params tables -----------------------------------------------------------------
@pytest.mark.parametrize("cost", ["flops", "params"])
def test_counted_tables_match_the_child_network(cost, tmp_path):
    space = tiny_space(candidates=["ir_k3_e1", "ir_k5_e3_se", "ir_k3_e1_g2", "skip"])
    table = build_cost_table(space, cost)
    table.save(tmp_path / f"{cost}.json")
    table = LatencyTable.load(tmp_path / f"{cost}.json")
    assert table.unit == cost and table.meta["backend"] == "none"
    arch = arch_from_indices(space, [i % 4 for i in range(space.num_layers)])
    net = build_child(arch)
    want = count_flops(net, (8, 8)) if cost == "flops" else count_params(net)
    if cost == "flops":  # the fake timer's count, on the meta device
        assert count_module_flops(net.eval().to("meta"), (3, 8, 8), "meta") == want
    assert table.predict(arch) == pytest.approx(want)
    table.check_run(batch=64, dtype="bfloat16")  # counted tables fit any run
    rows, fixed = table.costs_for(space)
    assert fixed > 0 and rows[0]["skip"] == 0.0


def test_signature_dedup_in_shipped_spaces():
    for cfg in ("configs/fbnet_cifar10.yaml", "configs/fbnet_imagenet.yaml"):
        space = load_space(cfg)
        per_layer = sum(len(r) for r in layer_signatures(space))
        assert len(space_signatures(space)) < per_layer + 2


# ---- sampling and validation -----------------------------------------------------------------
def test_sampled_architectures_span_the_range(built):
    space, table = built
    rows, fixed = table.costs_for(space, "raw")
    archs = sample_spanning(space, 20, rows, seed=0)
    assert len({a.hash() for a in archs}) == 20
    costs = sorted(table.predict(a) for a in archs)
    lo = fixed + sum(min(r.values()) for r in rows)
    hi = fixed + sum(max(r.values()) for r in rows)
    assert costs[0] - lo < 0.25 * (hi - lo) and hi - costs[-1] < 0.25 * (hi - lo)


def test_validate_reports_and_calibrates(built, tmp_path):
    space, table = built
    table = LatencyTable.from_dict(table.to_dict())
    rep = validate(space, table, fake(noise=0.02, seed=5), n=12, protocol=FAST, fit_model=True)
    assert rep["n"] == 12 and rep["repeats"] == 2
    for k in ("spearman", "kendall", "mape", "within_10pct", "median_ratio"):
        assert k in rep["table"]
    assert rep["table"]["spearman"] > 0.9 and rep["repeat"]["spearman"] > 0.9
    assert "spearman" in rep["flops_proxy"]
    assert rep["calibration"]["held_out"]["mape"] >= 0
    assert 0.5 < rep["calibration"]["a"] < 2
    assert "beats_calibrated_table" in rep["fitted_model"]
    rep2 = validate(space, table, fake(noise=0.02, seed=5), n=12, protocol=FAST, fit_model=True)
    assert rep2["table"] == rep["table"]  # deterministic with the fake backend
    apply_report(table, space, rep)
    p = tmp_path / "cal.json"
    table.save(p)
    t = LatencyTable.load(p)
    arch = arch_from_indices(space, [0, 1, 2, 0, 1])
    raw = t.predict(arch, "raw")
    cal = t.predict(arch, "calibrated")
    assert cal == pytest.approx(t.calibration["a"] * raw + t.calibration["b"])
    rows, fixed = t.costs_for(space)  # auto: the fitted corrections for this space
    assert t.predict(arch, "fitted", space) == pytest.approx(
        fixed + sum(r[op] for r, op in zip(rows, arch.ops, strict=True)), rel=1e-3)
    assert t.corrections["space_hash"] == space_hash(space)
    other = tiny_space(candidates=["ir_k3_e1", "skip"])  # same signatures, other layers
    with pytest.raises(FbnasError, match="fitted for space 'tiny'"):
        t.costs_for(other, "fitted")


# ---- backends --------------------------------------------------------------------------------
def test_cpu_timer_times_and_restores_threads():
    before = torch.get_num_threads()
    timer = make_timer("cpu", threads=1)
    assert timer.describe()["threads"] == 1
    run = timer.prepare(torch.nn.Conv2d(4, 4, 3, padding=1), (4, 8, 8))
    t = timer.sample(run, 3)
    assert 0 < t < 1
    assert torch.get_num_threads() == before
    assert not run.module.training


def test_xla_without_torch_xla_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_xla", None)  # as if not installed
    with pytest.raises(FbnasError, match=r"pip install 'fbnas\[tpu\]'") as e:
        make_timer("xla")
    assert "\n" not in str(e.value)


def test_xla_built_for_another_torch_is_refused(monkeypatch):
    """torch-xla pins the torch it was built for: a mismatched pair is one line naming both
    versions and the extra (the real timer runs in `pytest -m xla`, tests/backends/test_xla.py)."""
    pkg, core, debug = (types.ModuleType(n) for n in ("torch_xla", "torch_xla.core",
                                                       "torch_xla.debug"))
    xm, met = types.ModuleType("torch_xla.core.xla_model"), types.ModuleType("m")
    pkg.__version__, pkg.core, pkg.debug = "1.13.0", core, debug
    core.xla_model, debug.metrics = xm, met
    for name, mod in {"torch_xla": pkg, "torch_xla.core": core, "torch_xla.debug": debug,
                      "torch_xla.core.xla_model": xm, "torch_xla.debug.metrics": met}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    with pytest.raises(FbnasError, match=r"torch-xla 1.13.0 does not match torch "
                                         r".*fbnas\[tpu\]") as e:
        make_timer("xla")
    assert "\n" not in str(e.value)


def test_unknown_device_and_bad_settings():
    with pytest.raises(FbnasError, match=r"^timer: device: unknown timer backend 'tpu' "
                                         r"\(choose from cpu, cuda, "):
        make_timer("tpu")
    with pytest.raises(FbnasError, match="batch must be a positive integer"):
        make_timer("cpu", batch=0)
    with pytest.raises(FbnasError, match="dtype must be one of"):
        make_timer("cpu", dtype="int8")


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: the CUDA timer (events + synchronize) needs a GPU")
def test_cuda_build_and_measure():
    space = tiny_space()
    timer = make_timer("cuda")
    table = build_table(space, timer, Protocol(rounds=3, extra_rounds=0), context_probes=2)
    assert table.meta["backend"] == "cuda" and table.meta["gpu_name"]
    assert table.missing(space) == [] and all(e.value > 0 for e in table.entries.values())
