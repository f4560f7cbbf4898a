"""Architectures spanning a table's range and the validation of a table against whole
networks (fbnas/latency/validate.py)."""

from __future__ import annotations

import pytest

from fbnas.arch import arch_from_indices
from fbnas.errors import FbnasError
from fbnas.latency import LatencyTable, apply_report, sample_spanning, space_hash
from fbnas.latency.build import build_table
from fbnas.latency.signature import layer_signatures
from fbnas.latency.validate import rank_metrics, summary_lines, validate

from .fakes import FAST, fake, tiny_space


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
    rep = validate(space, table, fake(noise=0.02, seed=5), n=12, protocol=FAST, corrections=True)
    assert rep["n"] == 12 and rep["repeats"] == 2
    for k in ("spearman", "kendall", "mape", "within_10pct", "median_ratio"):
        assert k in rep["table"]
    assert rep["table"]["spearman"] > 0.9 and rep["repeat"]["spearman"] > 0.9
    assert "spearman" in rep["flops_proxy"]
    assert rep["calibration"]["held_out"]["mape"] >= 0
    assert 0.5 < rep["calibration"]["a"] < 2
    assert "beats_calibrated_table" in rep["corrected_model"]
    rep2 = validate(space, table, fake(noise=0.02, seed=5), n=12, protocol=FAST, corrections=True)
    assert rep2["table"] == rep["table"]  # deterministic with the fake backend
    apply_report(table, space, rep)
    p = tmp_path / "cal.json"
    table.save(p)
    t = LatencyTable.load(p)
    arch = arch_from_indices(space, [0, 1, 2, 0, 1])
    raw = t.predict(arch, "raw")
    cal = t.predict(arch, "calibrated")
    assert cal == pytest.approx(t.calibration["a"] * raw + t.calibration["b"])
    rows, fixed = t.costs_for(space)  # auto: the corrections for this space
    assert t.predict(arch, "corrected", space) == pytest.approx(
        fixed + sum(r[op] for r, op in zip(rows, arch.ops, strict=True)), rel=1e-3)
    assert t.corrections["space_hash"] == space_hash(space)
    other = tiny_space(candidates=["ir_k3_e1", "skip"])  # same signatures, other layers
    with pytest.raises(FbnasError, match="fitted for space 'tiny'"):
        t.costs_for(other, "corrected")


def test_validate_ranks_by_other_tables_and_gives_their_ratio_per_op(built, tmp_path):
    """`others` (the fp32 table beside an int8 one): each ranks the same measured networks,
    and its entries / the table's per op are reported (the int8 speed-up per op)."""
    space, table = built
    scaled = LatencyTable.from_dict(table.to_dict())
    for e in scaled.entries.values():
        e.value *= 3.0
    rows, _ = table.costs_for(space, "raw")
    skip_rows = [r for r in rows if r.get("skip", 0) > 0]
    bent = LatencyTable.from_dict(table.to_dict())
    skip_keys = {s.key() for row in layer_signatures(space) for op, s in row.items()
                 if op == "skip"}
    for k, e in bent.entries.items():
        if k in skip_keys:
            e.value *= 10.0
    rep = validate(space, table, fake(noise=0.02, seed=5), n=12, protocol=FAST,
                   others=[scaled, bent])
    a, b = rep["others"]
    # the same entries x3 (the in-network context model is not scaled): nearly the same order
    assert a["vs_table"]["kendall"] > 0.95
    assert a["vs_measured"]["spearman"] == pytest.approx(rep["table"]["spearman"], abs=0.05)
    assert rank_metrics([1, 2, 3, 4], [2, 4, 6, 8])["kendall"] == pytest.approx(1.0)
    assert set(a["per_op_ratio"]) == {op for r in rows for op, v in r.items() if v > 0}
    assert all(r["median"] == pytest.approx(3.0) for r in a["per_op_ratio"].values())
    assert b["per_op_ratio"]["skip"]["median"] == pytest.approx(10.0)
    assert b["per_op_ratio"]["skip"]["layers"] == len(skip_rows)
    assert b["per_op_ratio"]["ir_k3_e1"]["median"] == pytest.approx(1.0)
    assert b["vs_table"]["kendall"] < 1.0
    assert any("its entries / this table's" in line for line in summary_lines(rep))
    foreign = build_table(tiny_space(candidates=["ir_k3_e1"]), fake(noise=0.02, seed=1), FAST,
                          context_probes=0)
    with pytest.raises(FbnasError, match="missing"):
        validate(space, table, fake(seed=5), n=6, protocol=FAST, others=[foreign])
