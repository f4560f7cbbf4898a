"""The latency table file (fbnas/latency/table.py): round trip and fingerprint, files refused
in one line, the costs a table gives a space."""

from __future__ import annotations

import json

import pytest

from fbnas.arch import arch_from_indices
from fbnas.errors import FbnasError
from fbnas.latency import LatencyTable, make_timer
from fbnas.latency.validate import validate
from fbnas.supernet import Supernet

from .fakes import tiny_space


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
