"""The ExecuTorch bundle (fbnas latency bundle / import; fbnas/latency/bundle.py and
bundle_runner.py): the programs a device without fbnas times, the runner, its results imported
as a table; results of another bundle refused. The fast tier simulates the lowering and the
device's runtime; the slow tier lowers real programs and runs the runner standalone."""

from __future__ import annotations

import json
import sys
import types

import pytest
from conftest import latency_space, run_bundle_standalone

from fbnas._cli import main
from fbnas.errors import FbnasError
from fbnas.latency import LatencyTable, Protocol, bundle, bundle_runner
from fbnas.latency.bundle import import_results, write_bundle
from fbnas.latency.signature import space_signatures
from fbnas.search_space import SearchSpace

SPACE = SearchSpace.from_dict(latency_space())


def _lowered_as_its_key(monkeypatch, calibrations: dict | None = None) -> None:
    """write_bundle without ExecuTorch's lowering: each program file holds its key (and
    `calibrations[key]`: the int8 calibration inputs it was lowered with, or None)."""
    def lower(module, x, where, int8_calibration=None):
        if calibrations is not None:
            calibrations[where] = (x, int8_calibration)
        return where.encode(), {"delegated": 1.0}

    monkeypatch.setattr(bundle, "lower_executorch", lower)


def _fake_executorch(monkeypatch, ran: list[str]) -> None:
    """The runtime modules bundle_runner imports, with programs that record each call."""
    class Method:
        def __init__(self, key: str):
            self.key = key
            self.metadata = types.SimpleNamespace(num_inputs=lambda: 1)

        def execute(self, inputs):
            ran.append(self.key)
            return inputs

    runtime = types.ModuleType("executorch.runtime")
    runtime.Verification = types.SimpleNamespace(Minimal="minimal")
    runtime.Runtime = types.SimpleNamespace(get=lambda: types.SimpleNamespace(
        load_program=lambda data, verification: types.SimpleNamespace(
            load_method=lambda name: Method(data.decode()))))
    portable = types.ModuleType("executorch.extension.pybindings.portable_lib")
    portable._unsafe_reset_threadpool = lambda threads: None
    pkg, ext, pyb = (types.ModuleType(n) for n in (
        "executorch", "executorch.extension", "executorch.extension.pybindings"))
    pkg.__version__, pkg.extension, pkg.runtime = "0.0-test", ext, runtime
    ext.pybindings, pyb.portable_lib = pyb, portable
    for mod in (pkg, ext, pyb, portable, runtime):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)


def test_a_bundle_round_trip_with_the_device_simulated(tmp_path, monkeypatch):
    """write_bundle -> the runner (its rounds interleave every program with the reference op)
    -> import_results: a table of the whole space, with the device's description."""
    _lowered_as_its_key(monkeypatch)
    folder = tmp_path / "bundle"
    fast = Protocol(rounds=2, sample_s=1e-4, ref_sample_s=1e-4)
    man = write_bundle(SPACE, folder, probes=0, protocol=fast)
    assert (folder / "run_bundle.py").read_text() == bundle.RUNNER.read_text()
    ran: list[str] = []
    _fake_executorch(monkeypatch, ran)
    assert bundle_runner.main([str(folder)]) == 0
    results = json.loads((folder / "results.json").read_text())
    keys = {p["key"] for p in man["programs"]}
    assert set(ran) == keys and results["rounds"] == 2
    assert set(results["entries"]) == keys - {man["reference"]}
    assert all(len(e["ratios"]) == 2 for e in results["entries"].values())
    assert results["device"]["executorch_version"] == "0.0-test"
    table = import_results(folder / "results.json", SPACE)
    assert table.meta["backend"] == "executorch" and table.meta["bundle"] == man["bundle_id"]
    assert table.missing(SPACE) == [] and all(e.value >= 0 for e in table.entries.values())


def test_imported_entries_are_the_reference_scale_times_their_ratio_less_the_call(tmp_path,
                                                                                 monkeypatch):
    """A device's results as a table: each entry's value is the reference op's time times the
    entry's ratio, the runtime's per-call overhead taken off all but the stem (which keeps the
    network's one call); a program without timings is a one-line error."""
    _lowered_as_its_key(monkeypatch)
    folder = tmp_path / "bundle"
    man = write_bundle(SPACE, folder, probes=0)
    ref_s, call = 2e-5, 0.25
    ratio = {p["key"]: call if p["kind"] == "overhead" else 1.0 + i
             for i, p in enumerate(man["programs"]) if p["kind"] != "reference"}
    results = {"schema": 1, "bundle": man["bundle_id"], "rounds": 3, "threads": 1,
               "clock": "thread", "device": {"cpu_model": "test", "executorch_version": "0"},
               "seconds": 1.0, "ref_times_s": [ref_s] * 7,
               "entries": {k: {"ratios": [r] * 3, "times_s": [r * ref_s] * 3, "calls": 10}
                           for k, r in ratio.items()}}
    (folder / "results.json").write_text(json.dumps(results))
    table = import_results(folder / "results.json", SPACE)
    for e in table.entries.values():
        want = ratio[e.sig.key()] - (0.0 if e.sig.kind == "stem" else call)
        assert e.value == pytest.approx(ref_s * 1e6 * want)
    del results["entries"][next(k for k in ratio if k.startswith("ir_"))]
    (folder / "results.json").write_text(json.dumps(results))
    with pytest.raises(FbnasError, match=r"no timings for 1 program\(s\)"):
        import_results(folder / "results.json")


@pytest.mark.slow
def test_a_bundle_runs_standalone_and_imports_as_a_table(tmp_path, capsys):
    # two layers of one signature: each program's lowering takes seconds
    space = SearchSpace.from_dict(latency_space(
        stages=[{"channels": 8, "repeats": 2, "stride": 1}]))
    folder = tmp_path / "bundle"
    man = write_bundle(space, folder, probes=2, protocol=Protocol(rounds=3))
    kinds = [p["kind"] for p in man["programs"]]
    assert kinds.count("reference") == 1 and kinds.count("overhead") == 1
    assert kinds.count("probe") == 2
    assert kinds.count("entry") == len(space_signatures(space))
    with pytest.raises(FbnasError, match="holds a bundle already"):
        write_bundle(space, folder, probes=0)
    results = run_bundle_standalone(folder)  # fbnas unimportable to the runner
    assert results["bundle"] == man["bundle_id"] and results["rounds"] == 3
    out = tmp_path / "device.json"
    assert main(["latency", "import", str(folder / "results.json"), "--table", str(out)]) == 0
    table = LatencyTable.load(out)
    assert table.meta["backend"] == "executorch" and table.meta["bundle"] == man["bundle_id"]
    assert table.missing(space) == [] and table.context["probes"] == 2
    assert all(e.value >= 0 for e in table.entries.values())
    # results of another bundle are refused in one line
    results["bundle"] = "0" * 16
    (folder / "results.json").write_text(json.dumps(results))
    assert main(["latency", "import", str(folder / "results.json"), "--table",
                 str(tmp_path / "x.json")]) == 2
    assert "results of bundle" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_an_int8_bundle_lowers_quantized_programs_and_imports_an_int8_table(tmp_path,
                                                                           monkeypatch):
    """`--quantization int8`: every program is lowered quantized, calibrated as the int8 timer
    calibrates (8 inputs of its shape, the timed one first), the manifest says so (another
    bundle id than the fp32 one), and the import builds a table of that quantization, which
    an fp32 run refuses; a table of the other quantization, or a quantization the bundle
    cannot lower, is refused in one line."""
    seen: dict = {}
    _lowered_as_its_key(monkeypatch, seen)
    fp32 = write_bundle(SPACE, tmp_path / "fp32", probes=0)
    assert "quantization" not in fp32 and all(c is None for _, c in seen.values())
    seen.clear()
    man = write_bundle(SPACE, tmp_path / "int8", probes=0, quantization="int8",
                       protocol=Protocol(rounds=2, sample_s=1e-4, ref_sample_s=1e-4))
    assert man["quantization"] == "int8" and man["bundle_id"] != fp32["bundle_id"]
    assert set(seen) == {p["key"] for p in man["programs"]}
    for x, cal in seen.values():
        assert len(cal) == 8 and cal[0] is x and all(c.shape == x.shape for c in cal)
    ran: list[str] = []
    _fake_executorch(monkeypatch, ran)
    assert bundle_runner.main([str(tmp_path / "int8")]) == 0
    table = import_results(tmp_path / "int8" / "results.json", SPACE)
    assert table.setting("quantization") == "int8"
    with pytest.raises(FbnasError, match="quantization"):
        table.check_run(quantization="none")
    # a bundle that leaves out a table's entries takes that table's quantization
    assert write_bundle(SPACE, tmp_path / "more", probes=0, table=table)["quantization"] == "int8"
    with pytest.raises(FbnasError, match="--table: its entries are timed with quantization"):
        write_bundle(SPACE, tmp_path / "x", probes=0, table=table, quantization="none")
    with pytest.raises(FbnasError, match="--quantization: 'int4' is not bundled"):
        write_bundle(SPACE, tmp_path / "y", probes=0, quantization="int4")


@pytest.mark.slow
def test_an_int8_bundle_runs_standalone_and_imports_as_an_int8_table(tmp_path):
    """The real lowering: int8 XNNPACK programs the runner times without fbnas, imported as an
    int8 table of the whole space (one searchable layer: each program's int8 lowering takes
    seconds)."""
    space = SearchSpace.from_dict(latency_space(
        candidates=["ir_k3_e1", "skip"], stages=[{"channels": 8, "repeats": 1, "stride": 1}]))
    folder = tmp_path / "bundle"
    man = write_bundle(space, folder, probes=0, protocol=Protocol(rounds=2),
                       quantization="int8")
    results = run_bundle_standalone(folder)
    assert results["bundle"] == man["bundle_id"]
    table = import_results(folder / "results.json", space)
    assert table.setting("quantization") == "int8" and table.missing(space) == []
    assert all(e.value >= 0 for e in table.entries.values())
