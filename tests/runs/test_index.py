"""`fbnas runs`: finding, loading, sorting and printing results.json files."""

import csv
import io
import json
from pathlib import Path

import pytest

import fbnas._cli as cli
from fbnas.errors import FbnasError
from fbnas.runs.index import (
    COLUMNS,
    find_results,
    format_table,
    pareto,
    results_table,
    sort_rows,
)
from fbnas.runs.results import load_results, record_program

ROOT = Path(__file__).parents[1]


def _result(name, *, top1, meas=None, pred=None, space="quickstart", **extra):
    r = {"fbnas_results": 2, "kind": "retrain", "run_dir": f"runs/{name}",
         "created": "2026-11-22T10:00:00",
         "arch": {"name": name, "hash": (name.encode().hex() * 64)[:64], "ops": ["ir_k3_e1"]},
         "space": space, "dataset": "digits", "device": "cpu",
         "latency_device": "Test CPU (cpu, 1 thread, batch 1)",
         "predicted_us": pred, "measured_us": meas, "measured_iqr": 0.02,
         "top1": top1, "top5": 0.99, "val_top1": None, "params": 100_000, "flops": 2_000_000,
         "epochs": 3, "train_seconds": 1.5, "images_per_s": 100.0,
         "search_run": "runs/quickstart", "sweep": None}
    r.update(extra)
    return r


def _write(path: Path, data) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    f = path / "results.json"
    f.write_text(data if isinstance(data, str) else json.dumps(data))
    return f


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """Five runs, nested at different depths, under tmp_path/runs (also the cwd)."""
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "runs"
    # latencies 9.0 and 10.0: a string sort would put "10.0" first
    _write(base / "a", _result("a", top1=0.90, meas=10.0, pred=9.5, sweep={"label": "beta0.2"}))
    _write(base / "b" / "retrain-1", _result("b", top1=0.80, meas=9.0, pred=8.0,
                                             sweep={"label": "beta0.1"}))
    _write(base / "b" / "retrain-2", _result("c", top1=0.95, meas=None, pred=20.0,
                                             space="other"))
    _write(base / "c" / "deep" / "er", _result("d", top1=0.70, meas=12.0, pred=11.0,
                                               params=None))
    _write(base / "e", _result("e", top1=0.85, meas=2.0, pred=1.0, params=5_000_000))
    return base


def _main(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _names(out):
    """Run names (last path part of the `run` column) of a table, in printed order."""
    lines = out.strip("\n").splitlines()[1:-1]  # drop header and footer
    cells = [line.split() for line in lines]
    return [(c[1] if c[0] == "*" else c[0]).split("/")[-1] for c in cells]


# ---- finding and loading ---------------------------------------------------------------------
def test_find_results_recursive_deterministic_and_deduplicated(tree):
    found = find_results([tree])
    assert [f.parent.relative_to(tree).as_posix() for f in found] == [
        "a", "b/retrain-1", "b/retrain-2", "c/deep/er", "e"]
    # a file named directly, plus its folder again: listed once, in the order given
    again = find_results([tree / "e" / "results.json", tree])
    assert len(again) == 5 and again[0] == tree / "e" / "results.json"
    with pytest.raises(FbnasError, match="nowhere"):
        find_results([tree / "nowhere"])
    assert find_results([tree / "nowhere"], missing_ok=True) == []


def test_load_results_fills_missing_keys_and_checks(tmp_path):
    f = _write(tmp_path / "min", {"fbnas_results": 2, "top1": 0.5})
    r = load_results(f)
    assert r["top1"] == 0.5 and r["measured_us"] is None and r["sweep"] is None
    assert r["arch"] == {"name": None, "hash": None, "ops": None}
    nan = _write(tmp_path / "nan", '{"fbnas_results": 2, "measured_us": NaN}')
    assert load_results(nan)["measured_us"] is None  # not measured, sorts last
    for bad, msg in [({"top1": 0.5}, "fbnas_results"),
                     ({"fbnas_results": 3}, "fbnas_results is 3"),
                     ({"fbnas_results": True}, "fbnas_results is True"),
                     ({"fbnas_results": 2, "top1": "high"}, "'top1'"),
                     ({"fbnas_results": 2, "arch": {"hash": 5}}, "'arch.hash'"),
                     ({"fbnas_results": 2, "sweep": [1]}, "'sweep'"),
                     ([1, 2], "JSON object"),
                     ("{not json", "malformed JSON")]:
        g = _write(tmp_path / "bad", bad)
        with pytest.raises(FbnasError, match=msg) as e:
            load_results(g)
        assert str(g) in str(e.value) and "\n" not in str(e.value)



def test_schema_1_is_read_in_microseconds_and_rewritten_as_2(tmp_path):
    """A results.json written before latency was held in µs reads as the current schema, and a
    program recorded into it rewrites the whole file in that schema."""
    old = {"fbnas_results": 1, "top1": 0.5, "target_latency_ms": 0.7,
           "predicted_latency_ms": 0.75, "measured_latency_ms": 0.8, "measured_latency_iqr": 0.02,
           "programs": {"m.onnx": {"format": "onnx", "latency_ms": 0.5, "latency_iqr": 0.01}}}
    f = _write(tmp_path / "old", old)
    r = load_results(f)
    assert (r["target_us"], r["predicted_us"], r["measured_us"]) == pytest.approx((700, 750, 800))
    assert r["measured_iqr"] == 0.02 and "measured_latency_ms" not in r
    assert r["programs"]["m.onnx"]["measured_us"] == pytest.approx(500)
    (tmp_path / "old" / "m.onnx").write_bytes(b"")
    assert record_program(f, tmp_path / "old" / "m.onnx", top1=0.4) == "m.onnx"
    on_disk = json.loads(Path(f).read_text())
    assert on_disk["fbnas_results"] == 2 and on_disk["measured_us"] == pytest.approx(800)
    assert on_disk["programs"]["m.onnx"]["measured_us"] == pytest.approx(500)
    assert on_disk["programs"]["m.onnx"]["top1"] == 0.4

# ---- listing and sorting via the CLI ---------------------------------------------------------
def test_lists_every_run_sorted_by_top1_descending(tree, capsys):
    rc, out, err = _main(["runs"], capsys)  # default DIR: runs, relative to the cwd
    assert rc == 0 and err == ""
    assert _names(out) == ["retrain-2", "a", "e", "retrain-1", "er"]
    header = out.splitlines()[0]
    for title in ("run", "arch", "predicted us", "measured us", "top1 %", "params M",
                  "sweep point"):
        assert title in header
    assert "runs/b/retrain-1" in out  # run paths are relative to the cwd
    assert "95.00" in out and "Test CPU (cpu, 1 thread, batch 1)" in out
    assert "5 of 5 runs" in out.splitlines()[-1]
    # fixed width: every table line's top1 cell ends at the same column
    lines = out.splitlines()[:-1]
    end = header.index("top1 %") + len("top1 %")
    assert all(line[end - 1] in "0%" and line[end] == " " for line in lines)


def test_sort_numeric_not_lexicographic_and_none_last(tree, capsys):
    rc, out, _ = _main(["runs", str(tree), "--sort", "measured"], capsys)
    assert rc == 0
    # ascending by default for latency: 2 < 9 < 10 < 12, the unmeasured run last
    assert _names(out) == ["e", "retrain-1", "a", "er", "retrain-2"]
    rc, out, _ = _main(["runs", str(tree), "--sort", "measured", "--desc"], capsys)
    assert _names(out) == ["er", "a", "retrain-1", "e", "retrain-2"]  # None still last
    rc, out, _ = _main(["runs", str(tree), "--sort", "top1", "--asc"], capsys)
    assert _names(out) == ["er", "retrain-1", "e", "a", "retrain-2"]
    rc, out, _ = _main(["runs", str(tree), "--sort", "params"], capsys)
    assert _names(out)[-1] == "er" and _names(out)[-2] == "e"  # 5 M after 0.1 M; None last
    rc, out, _ = _main(["runs", str(tree), "--sort", "setting", "--top", "2"], capsys)
    assert _names(out) == ["retrain-1", "a"]
    assert "2 of 5 runs" in out


def test_sort_rows_and_results_table_directly():
    rows = [{"measured_us": v, "top1": t} for v, t in
            [(10.0, 0.5), (None, 0.9), (9.0, 0.6), (float("nan"), 0.1), (100.0, 0.7)]]
    assert [r["measured_us"] for r in sort_rows(rows, "measured")][:3] == [9.0, 10.0,
                                                                                    100.0]
    table = results_table(rows, sort="measured", columns=["measured", "top1"])
    assert table[0] == ["measured us", "top1 %"]
    assert [row[0] for row in table[1:]] == ["9.0", "10.0", "100.0", "-", "-"]
    assert [row[1] for row in table[1:4]] == ["60.00", "50.00", "70.00"]
    text = format_table(rows, sort="top1", columns="top1,measured", top=2)
    assert text.splitlines() == ["top1 %  measured us", " 90.00            -",
                                 " 70.00        100.0"]


def test_filter_by_space_and_columns(tree, capsys):
    rc, out, _ = _main(["runs", str(tree), "--space", "other", "--columns", "name,space"],
                       capsys)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["name", "space"] and lines[1].split() == ["c", "other"]
    assert len(lines) == 3  # header, one run, footer
    rc, _, err = _main(["runs", str(tree), "--space", "nope"], capsys)
    assert rc == 0 and "nope" in err and "5 results" in err


# ---- csv / json ------------------------------------------------------------------------------
def test_csv_and_json_parse_back(tree, capsys):
    cols = "run,name,measured,top1,params,setting,front"
    rc, out, _ = _main(["runs", str(tree), "--format", "csv", "--columns", cols,
                        "--sort", "measured"], capsys)
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == cols.split(",")
    assert [r["name"] for r in rows] == ["e", "b", "a", "d", "c"]
    assert float(rows[2]["measured"]) == 10.0 and float(rows[2]["top1"]) == 0.9
    assert rows[4]["measured"] == "" and rows[3]["params"] == "" and rows[0]["setting"] == ""
    assert rows[2]["setting"] == "beta0.2"

    rc, out, _ = _main(["runs", str(tree), "--format", "json", "--columns", cols,
                        "--sort", "measured", "--top", "3"], capsys)
    recs = json.loads(out)
    assert [r["name"] for r in recs] == ["e", "b", "a"]
    assert recs[0]["params"] == 5_000_000 and recs[1]["setting"] == "beta0.1"
    assert recs[0]["run"] == "runs/e"
    assert all(isinstance(r["front"], bool) for r in recs)


def test_nothing_found_is_a_message_not_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, out, err = _main(["runs"], capsys)  # default 'runs' does not exist
    assert rc == 0 and out == "" and "no results.json under runs" in err
    (tmp_path / "empty").mkdir()
    rc, out, err = _main(["runs", "empty", "--format", "json"], capsys)
    assert rc == 0 and json.loads(out) == [] and "empty" in err
    rc, _, err = _main(["runs", "missing-dir"], capsys)  # a DIR named but absent: an error
    assert rc == 2 and "missing-dir" in err


# ---- errors ----------------------------------------------------------------------------------
def test_bad_column_exit_2_names_it(tree, capsys):
    rc, out, err = _main(["runs", str(tree), "--sort", "accuracy"], capsys)
    assert rc == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and line.startswith("fbnas runs: error:")
    assert "'accuracy'" in line and "top1" in line and "measured" in line
    rc, _, err = _main(["runs", str(tree), "--columns", "run,bogus"], capsys)
    assert rc == 2 and "'bogus'" in err
    rc, _, err = _main(["runs", str(tree), "--top", "0"], capsys)
    assert rc == 2 and "--top" in err


def test_corrupt_file_skipped_with_warning(tree, capsys):
    bad = _write(tree / "broken", "{\"fbnas_results\": 2, \"top1\": ")
    other = _write(tree / "zz-other-tool", {"something": "else"})
    rc, out, err = _main(["runs", str(tree)], capsys)
    assert rc == 0
    warnings = err.strip().splitlines()
    assert len(warnings) == 2
    assert str(bad) in warnings[0] and "warning" in warnings[0]
    assert str(other) in warnings[1] and "fbnas_results" in warnings[1]
    assert len(_names(out)) == 5


# ---- Pareto front ----------------------------------------------------------------------------
def test_pareto_marks_non_dominated_rows():
    rows = [
        {"measured_us": 1.0, "top1": 0.80},  # 0 front: fastest
        {"measured_us": 2.0, "top1": 0.90},  # 1 front
        {"measured_us": 3.0, "top1": 0.85},  # 2 dominated by 1
        {"measured_us": 2.0, "top1": 0.88},  # 3 dominated by 1 (same x, lower y)
        {"measured_us": None, "predicted_us": 4.0, "top1": 0.95},  # 4 front
        {"measured_us": 5.0, "top1": 0.95},  # 5 dominated by 4 (pred. fallback)
        {"measured_us": None, "top1": 0.99},  # 6 no latency at all: never
        {"measured_us": 2.0, "top1": 0.90},  # 7 ties with 1: both on the front
        {"measured_us": 0.5, "top1": None},  # 8 no accuracy: never
    ]
    assert pareto(rows) == {0, 1, 4, 7}
    assert pareto(rows, x="predicted") == {4}
    assert pareto([]) == set()


def test_front_column_in_table(tree, capsys):
    rc, out, _ = _main(["runs", str(tree), "--columns", "name,front", "--sort", "name",
                        "--asc"], capsys)
    assert rc == 0
    marked = {line.split()[0] for line in out.splitlines()[1:-1] if line.rstrip().endswith("*")}
    # e (2 ms, 85%), a (10 ms, 90%), c (no measurement: predicted 20 ms, 95%);
    # b (9 ms, 80%) is beaten by e and d (12 ms, 70%) by a
    assert marked == {"a", "c", "e"}
    assert "Pareto" in out.splitlines()[-1]


def test_every_column_formats(tree):
    rows = [load_results(f) for f in find_results([tree])]
    table = results_table(rows, columns=list(COLUMNS))
    assert all(len(row) == len(COLUMNS) for row in table)
    a = next(row for row in table if "a" == row[list(COLUMNS).index("name")])
    cell = dict(zip(COLUMNS, a, strict=True))
    assert cell["arch"] == "616161616161" and cell["setting"] == "beta0.2"
    assert cell["params"] == "0.100" and cell["flops"] == "2.0" and cell["iqr"] == "2.0"
    assert cell["device"].startswith("Test CPU") and cell["train_device"] == "cpu"
    assert cell["file"] == "runs/a/results.json" and cell["sweep"] == "label=beta0.2"
