"""`fbnas latency ...` end to end on a tiny space with the fake timer (main([...]) calls)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import latency_space, slow_reference_op

from fbnas._cli import main
from fbnas.arch import arch_from_indices
from fbnas.latency import LatencyTable
from fbnas.search_space import SearchSpace

TINY = latency_space()
FAST = ["--device", "fake", "--rounds", "4"]


@pytest.fixture()
def files(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({"space": TINY}))
    space = SearchSpace.from_dict(TINY)
    arch = tmp_path / "a.yaml"
    arch_from_indices(space, [0, 1, 2, 1, 0], "a").save(arch)
    return tmp_path, str(cfg), str(arch)


def test_build_show_predict_measure_validate(files, capsys):
    d, cfg, arch = files
    out = str(d / "lat.json")
    assert main(["latency", "build", "--config", cfg, "--table", out, "--probes", "2",
                 "--quiet", *FAST]) == 0
    table = LatencyTable.load(out)
    assert len(table) == 11 and table.meta["threads"] == 1
    assert main(["latency", "build", "--config", cfg, "--table", out, "--quiet", *FAST]) == 0
    assert LatencyTable.load(out).fingerprint() == table.fingerprint()  # nothing was missing
    capsys.readouterr()
    assert main(["latency", "show", out, "--config", cfg]) == 0
    shown = capsys.readouterr().out
    assert "layer  4" in shown and "*" in shown and "!" in shown and "stem k3" in shown
    assert main(["latency", "show", out]) == 0
    assert "c16-16 s1 4x4" in capsys.readouterr().out
    assert main(["latency", "predict", "--arch", arch, "--table", out, "-v"]) == 0
    assert "us (table)" in capsys.readouterr().out
    js = str(d / "m.json")
    assert main(["latency", "measure", "--arch", arch, "--table", out, "--json", js,
                 *FAST]) == 0
    assert "median" in capsys.readouterr().out
    assert json.loads(open(js).read())["results"][0]["predicted_us"] > 0
    rep, png = str(d / "rep.json"), str(d / "rep.png")
    assert main(["latency", "validate", "--config", cfg, "--table", out, "-n", "8",
                 "--corrections", "--save", "--json", rep, "--plot", png, *FAST]) == 0
    text = capsys.readouterr().out
    assert "Spearman" in text and "FLOPs proxy" in text and "corrected model" in text
    r = json.loads(open(rep).read())
    assert r["n"] == 8 and "_fit" not in r["corrected_model"]
    assert open(png, "rb").read(4) == b"\x89PNG"
    saved = LatencyTable.load(out)
    assert saved.calibration is not None and saved.corrections is not None
    # --quiet: no progress at all (it once passed progress=False on as a callback)
    assert main(["latency", "validate", "--config", cfg, "--table", out, "-n", "6", "--quiet",
                 "--json", str(d / "q.json"), *FAST]) == 0
    assert "Spearman" in capsys.readouterr().out


def test_flops_table_needs_no_device(files, capsys):
    d, cfg, arch = files
    out = str(d / "flops.json")
    assert main(["latency", "build", "--config", cfg, "--cost", "flops", "--table", out]) == 0
    assert LatencyTable.load(out).cost == "flops"
    assert main(["latency", "predict", "--arch", arch, "--table", out]) == 0
    assert "flops" in capsys.readouterr().out


def test_errors_are_one_line_exit_2(files, capsys):
    d, cfg, arch = files
    out = str(d / "lat.json")
    other = dict(TINY, candidates=["ir_k5_e6"])
    cfg2 = d / "other.yaml"
    cfg2.write_text(yaml.safe_dump({"space": other}))
    assert main(["latency", "build", "--config", str(cfg2), "--table", out, "--probes", "0",
                 "--quiet", *FAST]) == 0
    capsys.readouterr()
    assert main(["latency", "validate", "--config", cfg, "--table", out, *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "missing" in err and "fbnas latency build --config" in err
    assert main(["latency", "measure", "--arch", arch, "--table", out, "--batch", "4",
                 *FAST]) == 2
    assert "meta.batch is 1 but this run asks for 4" in capsys.readouterr().err
    assert main(["latency", "show", str(d / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_timing_commands_take_the_tables_backend_then_the_configs(files, capsys):
    d, cfg, arch = files
    out = str(d / "lat.json")
    assert main(["latency", "build", "--config", cfg, "--table", out, "--probes", "0",
                 "--quiet", *FAST]) == 0
    # no --device: validate and measure time on the table's backend (fake), not on cpu
    assert main(["latency", "validate", "--config", cfg, "--table", out, "-n", "5",
                 "--rounds", "4"]) == 0
    assert main(["latency", "measure", "--arch", arch, "--table", out, "--rounds", "4"]) == 0
    assert "fake" in capsys.readouterr().out
    # no table: the config's latency.device
    cfg2 = d / "fake.yaml"
    cfg2.write_text(yaml.safe_dump({"space": TINY, "latency": {"device": "fake"}}))
    out2 = str(d / "lat2.json")
    assert main(["latency", "build", "--config", str(cfg2), "--table", out2, "--probes", "0",
                 "--quiet", "--rounds", "4"]) == 0
    assert LatencyTable.load(out2).meta["backend"] == "fake"


def test_measure_with_config_anchors_to_the_table_s_probes(files, capsys, monkeypatch):
    """`latency measure --config` times the networks among the table's probe networks and
    anchors their figures to them, as the measured fit does: when the reference op slows by
    10% after the build, the anchored figure stays at the table's prediction and the figure
    through the reference op moves by the 10%. --config without --table is a one-line error."""
    d, cfg, arch = files
    out = str(d / "lat.json")
    assert main(["latency", "build", "--config", cfg, "--table", out, "--probes", "6",
                 "--quiet", *FAST]) == 0
    slow_reference_op(monkeypatch, 1.1)
    pred = LatencyTable.load(out).predict(
        arch_from_indices(SearchSpace.from_dict(TINY), [0, 1, 2, 1, 0], "a"), "auto")
    figures = {}
    for how, extra in (("anchored", ["--config", cfg]), ("reference", [])):
        js = str(d / f"{how}.json")
        assert main(["latency", "measure", "--arch", arch, "--table", out, "--json", js,
                     *extra, *FAST]) == 0
        figures[how] = json.loads(open(js).read())["results"][0]
    printed = capsys.readouterr().out
    assert "anchored to the table's 6 probe networks" in printed
    assert figures["anchored"]["units"].startswith("anchored")
    assert figures["anchored"]["median_us"] == pytest.approx(pred, rel=0.02)
    assert figures["reference"]["median_us"] == pytest.approx(pred / 1.1, rel=0.02)
    assert figures["anchored"]["ref_median_us"] == pytest.approx(pred / 1.1, rel=0.02)
    assert main(["latency", "measure", "--arch", arch, "--config", cfg, *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--config needs --table" in err
