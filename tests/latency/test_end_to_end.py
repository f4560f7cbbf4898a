"""Whole networks timed end to end in the table's units (fbnas/latency/end_to_end.py): interleaved
with the table's probes, anchored to them at each network's size when the reference op
drifts."""

from __future__ import annotations

import math
import statistics

import pytest
from conftest import slow_reference_op

import fbnas.latency.end_to_end
from fbnas.arch import ChildNet, arch_from_indices, build_child
from fbnas.backends.fake import FakeTimer
from fbnas.latency import LatencyTable
from fbnas.latency.end_to_end import COMPANIONS, anchored_scale, companions, measure_child, panel
from fbnas.search_space import SearchSpace
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger
from tests.fit.measured import FIT_SPACE, fake_run, run_search, slow_networks


@pytest.mark.slow  # moved from the fast tier: 4-6 s, its module has other fast tests
def test_each_timed_network_is_interleaved_with_the_table_s_probes(tmp_path, monkeypatch):
    """The fit times its network among the table's probe networks (the ones its context model
    was fitted to; the same ones every round), not alone: a network timed alone repeats far
    worse on a noisy machine. A table without them for this space falls back to COMPANIONS
    spanning networks, through the reference op."""
    cfg = fake_run(tmp_path)
    t = SearchTrainer(cfg, tmp_path / "run")
    close_logger(t.log)
    slow_networks(monkeypatch, 1.15)  # two or more rounds
    seen: list[list[str]] = []
    measure = fbnas.latency.end_to_end.measure_modules

    def spy(timer, modules, protocol=None, watch=None):
        seen.append(sorted(modules))
        assert watch == ["fit"]  # an early stop waits for the network, not the panel
        return measure(timer, modules, protocol, watch)

    monkeypatch.setattr(fbnas.latency.end_to_end, "measure_modules", spy)
    _, saved = run_search(cfg, tmp_path)
    # every round's network, then the returned one timed once more (the figure reported)
    assert len(seen) == len(saved["meta"]["fit_rounds"]) + 1 >= 3
    table = LatencyTable.load(tmp_path / "run" / "cost_table.json")
    probes = [k for k in seen[0] if k.startswith("panel probe")]
    assert len(probes) == table.context["probes"] == len(seen[0]) - 1 and "fit" in seen[0]
    assert all(s == seen[0] for s in seen)  # the same panel every round
    assert panel(cfg.space, table).anchors == table.context["probe_nets"]
    other = SearchSpace.from_dict({**FIT_SPACE, "stem": {"channels": 24, "stride": 1}})
    assert panel(other, table).archs == []  # a space the table does not cover: none
    table.context.pop("probe_space")  # as a table built before 2026-11-25
    old = panel(cfg.space, table)
    assert old.anchors is None and len(old.archs) == COMPANIONS
    assert companions(cfg.space, None) == []


def test_a_measured_network_is_anchored_to_the_probes_when_the_reference_op_drifts(tmp_path,
                                                                                    monkeypatch):
    """An end-to-end figure goes through the table's probe networks, timed at its build: when
    the reference op's time moves against whole networks after the build (by 2-3% between
    runs on this VM), the anchored figure stays where the network measured before, and the
    figure through the reference op moves with it."""
    cfg = fake_run(tmp_path)
    t = SearchTrainer(cfg, tmp_path / "run")
    close_logger(t.log)
    table = t.costs.table
    arch = arch_from_indices(cfg.space, [1] * len(cfg.space.layer_candidates()), "x")
    model = build_child(arch)
    before = measure_child(model, arch, cfg.latency, table, space=cfg.space)
    assert before["median_us"] == pytest.approx(table.predict(arch), rel=0.05)
    slow_reference_op(monkeypatch, 1.1)
    anchored = measure_child(model, arch, cfg.latency, table, space=cfg.space)
    via_reference = measure_child(model, arch, cfg.latency, table)
    assert anchored["median_us"] == pytest.approx(before["median_us"], rel=0.005)
    assert via_reference["median_us"] == pytest.approx(before["median_us"] / 1.1, rel=0.01)
    assert "probe" in anchored["units"] and "reference op" in via_reference["units"]


def test_the_anchor_follows_a_drift_that_differs_with_the_network_s_size():
    """Probes timed now (ratios to the reference op) and at the build (µs): where the drift
    since the build is a power of the network's size, the scale read at a network's size is
    that drift exactly (inside the probes' range; at the nearest probe's outside it), not one
    factor for all sizes; with fewer than 4 probes, one factor (their geometric mean)."""
    drift = lambda r: 2.0 * r ** -0.06  # noqa: E731  µs per reference unit, by size
    ratios = [1.0, 2.0, 3.5, 6.0, 9.0]
    scale = anchored_scale(ratios, [r * drift(r) for r in ratios])
    for r in (1.0, 1.7, 4.0, 9.0):
        assert scale(r) == pytest.approx(drift(r), rel=1e-9)
    assert scale(0.5) == pytest.approx(drift(1.0)) and scale(20.0) == pytest.approx(drift(9.0))
    one = math.exp(statistics.mean(math.log(drift(r)) for r in ratios))
    assert abs(one / drift(1.0) - 1) > 0.04  # what one factor would have read for the smallest
    few = anchored_scale(ratios[:3], [r * drift(r) for r in ratios[:3]])
    geo = math.exp(statistics.mean(math.log(drift(r)) for r in ratios[:3]))
    assert few(1.0) == pytest.approx(geo) and few(3.5) == pytest.approx(geo)


def test_a_small_network_keeps_its_figure_when_small_networks_drift_more(tmp_path,
                                                                         monkeypatch):
    """After the build every whole network slows by a power of its size (the smallest probe
    11% more than the largest): the figure of a small network, anchored to the probes at its
    size, stays where it measured before the drift (through one factor it read 5% off)."""
    cfg = fake_run(tmp_path)
    t = SearchTrainer(cfg, tmp_path / "run")
    close_logger(t.log)
    table = t.costs.table
    cands = cfg.space.layer_candidates()  # skips and one block: between the smallest probes
    small = arch_from_indices(cfg.space, [c.index("skip") for c in cands[:-1]] + [0], "small")
    model = build_child(small)
    before = measure_child(model, small, cfg.latency, table, space=cfg.space)
    prepare = FakeTimer.prepare
    big = max(table.context["probe_nets"])

    def size_drift(self, module, input_chw, label=""):
        run = prepare(self, module, input_chw, label)
        if isinstance(module, ChildNet):
            run.cost_s *= (run.cost_s / (big * table.reference["scale_us"] / 1e6)) ** -0.05
        return run

    monkeypatch.setattr(FakeTimer, "prepare", size_drift)
    after = measure_child(model, small, cfg.latency, table, space=cfg.space)
    assert after["median_us"] == pytest.approx(before["median_us"], rel=0.005)


def test_a_fit_panel_keeps_the_probes_nearest_the_target_in_their_order():
    """`search.fit_panel: N`: the N probe networks whose build-time times are nearest the
    target's (in log), the rest left out of every timing; 0, a panel no larger, or one without
    anchors: the panel itself."""
    from fbnas.latency.end_to_end import Panel
    space = SearchSpace.from_dict(FIT_SPACE)
    archs = [arch_from_indices(space, [0] * len(space.layer_candidates()), f"p{i}")
             for i in range(6)]
    pan = Panel(archs, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    near = pan.nearest(3, 5.0)
    assert [a.name for a in near.archs] == ["p1", "p2", "p3"] and near.anchors == [2.0, 4.0, 8.0]
    assert [a.name for a in pan.nearest(2, 100.0).archs] == ["p4", "p5"]
    assert pan.nearest(0, 5.0) is pan and pan.nearest(6, 5.0) is pan
    assert Panel(archs).nearest(3, 5.0).archs == archs  # no anchors: companions, all kept


@pytest.mark.slow  # moved from the fast tier: a measured search, 1-2 s
def test_the_measured_fit_times_among_the_fit_panel_nearest_its_target(tmp_path, monkeypatch):
    """With `search.fit_panel: 4` every timing of the fit holds the network and the same 4
    probes, those nearest the target; the fit still lands within its tolerance (the figures
    anchored to those 4), and a panel of 1-3 is refused by name."""
    cfg = fake_run(tmp_path, fit_panel=4)
    t = SearchTrainer(cfg, tmp_path / "run")
    close_logger(t.log)
    seen: list[list[str]] = []
    measure = fbnas.latency.end_to_end.measure_modules

    def spy(timer, modules, protocol=None, watch=None):
        seen.append(sorted(modules))
        return measure(timer, modules, protocol, watch)

    monkeypatch.setattr(fbnas.latency.end_to_end, "measure_modules", spy)
    _, saved = run_search(cfg, tmp_path)
    table = LatencyTable.load(tmp_path / "run" / "cost_table.json")
    assert table.context["probes"] > 4
    target = saved["meta"]["target"]
    want = panel(cfg.space, table).nearest(4, target / table.reference["scale_us"])
    assert seen and all(s == seen[0] for s in seen)
    assert sorted(k for k in seen[0] if k != "fit") == sorted(f"panel {a.name}"
                                                              for a in want.archs)
    assert abs(saved["meta"]["measured"] / target - 1) <= cfg.search.fit_tolerance
    from fbnas.config import config_from_dict
    from fbnas.errors import FbnasError
    d = {"space": FIT_SPACE, "search": {"fit_panel": 2}}
    with pytest.raises(FbnasError, match="search.fit_panel: 2 is under 4"):
        config_from_dict(d, "c.yaml")
