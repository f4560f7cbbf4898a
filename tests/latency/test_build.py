"""Building latency tables (fbnas/latency/build.py): deterministic, extended with only the
missing entries, resumed after an interruption, the context model, the reference op."""

from __future__ import annotations

import numpy as np
import pytest

from fbnas.arch import ChildNet
from fbnas.errors import FbnasError
from fbnas.latency import LatencyTable, Protocol, block_signature, build_table, sample_spanning
from fbnas.latency.build import EXPONENT_BOUNDS, fit_context_model, refresh_values
from fbnas.latency.measure import REFERENCE
from fbnas.latency.signature import arch_signatures
from fbnas.latency.validate import validate

from .fakes import FAST, CountingFake, fake, tiny_space


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


def test_a_measurement_stops_once_every_median_is_known_within_stop_ci():
    """Protocol.stop_ci: steady entries stop after min_rounds, noisy ones take more rounds
    (up to `rounds`), and the interval it stops on is the median's distribution-free one."""
    from fbnas.arch import arch_from_indices
    from fbnas.latency.measure import EntryStats, measure

    space = tiny_space()
    nets = {f"n{i}": ChildNet(arch_from_indices(space, [i % len(c) for c in
                                                      space.decision_candidates()], f"n{i}"))
            for i in range(3)}

    def rounds(noise: float, stop: float) -> int:
        t = fake(noise=noise, seed=3)
        chw = (space.macro.in_channels, *space.macro.input_size)
        runs = {k: t.prepare(m, chw, k) for k, m in nets.items()}
        m = measure(t, runs, Protocol(rounds=60, extra_rounds=0, stop_ci=stop, min_rounds=8))
        return m.entries["n0"].n

    assert rounds(0.0, 0.01) == 8  # no noise: known at once
    assert 8 < rounds(0.2, 0.01) <= 60  # noisy: more rounds
    assert rounds(0.2, 0.0) == 60  # stop_ci 0: every round
    e = EntryStats(ratios=[1.0] * 50 + [1.02] * 50)
    assert 0 < e.median_ci() <= 0.01
    assert EntryStats(ratios=[1.0, 2.0]).median_ci() == float("inf")
