"""Architectures spanning a table's range and the validation of a table against whole
networks (fbnas/latency/validate.py)."""

from __future__ import annotations

import pytest

from fbnas.arch import arch_from_indices
from fbnas.errors import FbnasError
from fbnas.latency import LatencyTable, apply_report, sample_spanning, space_hash, validate

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
