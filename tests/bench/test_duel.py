"""The duel (issue 51 item 3): random search at equal cost accounted on a fake clock, the
bootstrap interval and wins by hand, the pair records resumed, and one tiny pair end to end."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest
import yaml
from conftest import digits_run_config, one_line_error

import fbnas.bench.duel as duel
from fbnas.bench.duel import (
    PairStore,
    RandomSearch,
    Trained,
    bootstrap_interval,
    random_search,
    summarize,
)
from fbnas.search_space import SearchSpace
from tests.bench.spaces import SPACE64

# SPACE64 (64 networks); the fake cost of a network is the sum of its op indices
SPACE = SPACE64


class SumCost:
    """A cost model: 10 + the sum of the op indices."""

    def of(self, idx):
        return 10.0 + sum(idx)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _search(budget, train_s=5.0, measure_s=1.0, draw_s=0.01, measure=True, off=None,
            target=13.0, tol=0.1, seed=0, val=None):
    """random_search on SPACE with a fake clock: each draw costs draw_s (charged inside the
    model), each measurement measure_s, each training train_s; `off(idx)`: the measured
    cost's offset from the predicted; `val(idx)`: (val_acc, val_ce)."""
    space = SearchSpace.from_dict(SPACE, "duel")
    clock = FakeClock()
    model = SumCost()
    calls = {"measured": [], "trained": []}

    class Timed:
        def of(self, idx):
            clock.now += draw_s
            return model.of(idx)

    def meas(idx):
        clock.now += measure_s
        calls["measured"].append(list(idx))
        return model.of(idx) * (1 + (off(idx) if off else 0.0)), 0.01

    def train(idx):
        clock.now += train_s
        calls["trained"].append(list(idx))
        a, c = val(idx) if val else (0.5 + 0.01 * idx[0], 1.0)
        return {"val_acc": a, "val_ce": c, "test_acc": a, "seconds": train_s}

    rs = random_search(space, Timed(), target, tol, budget, seed, train,
                       meas if measure else None, "no table here", clock)
    return rs, calls, clock


def test_random_search_budget_rule_and_accounting():
    rs, calls, clock = _search(budget=20.0)
    # a training that starts before 20 s finishes: the last one ends past the budget
    assert rs.spent == pytest.approx(clock.now)
    assert rs.spent >= 20.0 and rs.overshoot == pytest.approx(rs.spent - 20.0)
    assert rs.overshoot < 5.0 + 1.0 + 1e-9  # at most one training and its measurement past it
    assert len(rs.trained) == len(calls["trained"]) >= 1
    assert rs.seconds_training == pytest.approx(5.0 * len(rs.trained))
    assert rs.seconds_measuring == pytest.approx(1.0 * len(calls["measured"]))
    assert rs.seconds_drawing == pytest.approx(0.01 * rs.drawn)
    # the last training started before the budget was spent
    assert rs.spent - 5.0 < 20.0
    assert rs.r == pytest.approx(20.0 / 5.0)
    d = rs.to_dict()
    assert d["networks"] == len(rs.trained) and d["r"] == pytest.approx(4.0)


def test_random_search_trains_only_networks_within_tolerance():
    # tolerance 10% of 13: predicted 11.7..14.3 -> sum of indices 2..4; every measured one
    # whose first op is 3 reads 20% slow and is dropped
    rs, calls, _ = _search(budget=200.0, off=lambda idx: 0.2 if idx[0] == 3 else 0.0)
    assert calls["measured"] and calls["trained"]
    for idx in calls["measured"]:
        assert abs(SumCost().of(idx) / 13 - 1) <= 0.1
    for idx in calls["trained"]:
        assert abs(SumCost().of(idx) / 13 - 1) <= 0.1 and idx[0] != 3
    assert rs.dropped == sum(i[0] == 3 for i in calls["measured"]) >= 1
    assert rs.kept == len(calls["measured"]) == len(rs.trained) + rs.dropped
    # each network at most once
    assert len({tuple(i) for i in calls["trained"]}) == len(calls["trained"])


def test_random_search_without_measurement_says_why():
    rs, calls, _ = _search(budget=12.0, measure=False)
    assert calls["measured"] == [] and rs.seconds_measuring == 0
    assert not rs.measured and rs.skipped_measure == "no table here"
    assert all(t.measured is None for t in rs.trained)


def test_random_search_at_least_one_network_and_best_by_val_then_ce():
    rs, calls, _ = _search(budget=1e-6)  # the budget is spent by the first draw
    assert len(rs.trained) == 1 and rs.r == pytest.approx(1e-6 / 5.0)
    # ties in validation accuracy broken by the lower CE
    ces = {}

    def val(idx):
        ces[tuple(idx)] = 1.0 + random.Random(str(idx)).random()
        return 0.7, ces[tuple(idx)]

    rs, calls, _ = _search(budget=30.0, val=val)
    assert len(rs.trained) >= 2
    assert tuple(rs.best.indices) == min(ces, key=ces.get)
    # accuracy first
    rs, calls, _ = _search(budget=30.0, val=lambda idx: (0.5 + 0.1 * idx[1], 5.0 - idx[1]))
    assert rs.best.val_acc == max(t.val_acc for t in rs.trained)


def test_random_search_is_seeded_and_errors_name_the_band():
    a, ca, _ = _search(budget=30.0, seed=4)
    b, cb, _ = _search(budget=30.0, seed=4)
    assert ca == cb
    one_line_error(lambda: _search(budget=0.0), "budget")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(duel, "MAX_DRAWS", 50)
        one_line_error(lambda: _search(budget=5.0, target=1000.0), "draws", "1000",
                       "fit_tolerance")
        # a band of one network (sum of indices 0: cost 10), trained, then exhausted
        rs, calls, _ = _search(budget=1e9, target=10.0, tol=0.01)
        assert rs.exhausted and calls["trained"] == [[0, 0, 0]]


def test_bootstrap_interval_and_wins_by_hand():
    d = [1.0, 2.0, -0.5, 3.0]
    lo, hi = bootstrap_interval(d, resamples=2000, seed=7)
    # by hand: the same resamples, their means sorted, the 2.5% and 97.5% nearest ranks
    rng = random.Random(7)
    means = sorted(statistics.fmean(rng.choices(d, k=4)) for _ in range(2000))
    assert (lo, hi) == (means[49], means[1949])
    assert -0.5 <= lo < statistics.fmean(d) < hi <= 3.0
    assert bootstrap_interval([2.0] * 5) == (2.0, 2.0)
    assert all(math.isnan(x) for x in bootstrap_interval([]))

    def pair(target, seed, s, r, others):
        return {"target": target, "seed": seed,
                "random": {"r": 2.0 + seed, "trained": [{"test_acc": x} for x in others]},
                "retrain": {"search": {"mean_test_acc": s, "offset": 0.01},
                            "random": {"mean_test_acc": r, "offset": -0.02}}}

    pairs = [pair("0.5x", 0, 0.90, 0.88, [0.85, 0.89, 0.91]),
             pair("0.5x", 1, 0.87, 0.88, [0.86, 0.87]),
             pair("0.5x", 2, 0.90, 0.90, [0.80]),
             pair("0.8x", 0, 0.95, 0.94, [0.93]),
             {"target": "0.8x", "seed": 1}]  # unfinished: not counted
    s = summarize(pairs, resamples=500)
    v = s["0.5x"]
    assert v["pairs"] == 3 and v["wins"] == 1 and v["ties"] == 1
    assert v["mean_diff_pt"] == pytest.approx((2.0 - 1.0 + 0.0) / 3)
    assert v["ci95_pt"] == pytest.approx(bootstrap_interval([2.0, -1.0, 0.0], 500))  # points
    assert v["median_r"] == 3.0
    # R = 1: 0.90 above the median 0.89, 0.87 above 0.865, 0.90 above 0.80
    assert v["r1_beats_median"] == pytest.approx(1.0)
    # P(pick > one random network), ties half: 2/3, (1 + 0.5)/2, 1
    assert v["r1_beats_random"] == pytest.approx((2 / 3 + 0.75 + 1) / 3)
    assert v["search_offset_median"] == 0.01 and v["random_offset_median"] == -0.02
    assert s["0.8x"]["pairs"] == 1 and s["0.8x"]["wins"] == 1
    assert v["with_percentile"] == 0 and v["search_percentile_median"] is None

    # percentiles in a benchmark's reference sample: NaN (no neighbour) and missing not counted
    for p, (sp, rp) in zip(pairs[:3], [(95.0, 40.0), (90.0, math.nan), (50.0, 100.0)], strict=True):
        p["retrain"]["search"]["percentile"], p["retrain"]["random"]["percentile"] = sp, rp
    del pairs[2]["retrain"]["search"]["percentile"]
    v = summarize(pairs, resamples=10)["0.5x"]
    assert v["with_percentile"] == 2 and v["search_top10"] == 2
    assert v["search_percentile_median"] == 92.5
    assert v["random_percentile_median"] == 70.0 and v["random_top10"] == 1


def test_pair_store_resumes(tmp_path):
    p = tmp_path / "duel" / "pairs.json"
    st = PairStore(p)
    rec = st.get("0.5x", 3)
    rec["search"] = {"run": "r", "seconds": 12.5}
    st.save()
    again = PairStore(p)
    assert not again.done("0.5x", 3)
    assert again.get("0.5x", 3)["search"]["seconds"] == 12.5
    again.get("0.5x", 3)["random"] = {"r": 1.0}
    again.get("0.5x", 3)["retrain"] = {}
    again.save()
    assert PairStore(p).done("0.5x", 3) and not PairStore(p).done("0.8x", 3)
    p.write_text("not json")
    one_line_error(lambda: PairStore(p), "pairs.json", "not a duel")


def test_run_pair_skips_finished_stages(tmp_path, monkeypatch):
    """A re-run calls no stage the store holds (the search, random search and retraining
    replaced by stubs that fail when called)."""
    st = PairStore(tmp_path / "pairs.json")
    rec = st.get("0.5x", 0)
    rec.update(search={"run": "x", "seconds": 1.0}, random={}, retrain={})
    st.save()

    def boom(*a, **k):
        raise AssertionError("a finished stage ran again")

    for name in ("search_side", "equal_cost_random", "retrain_pick"):
        monkeypatch.setattr(duel, name, boom)
    monkeypatch.setattr(duel.SearchRun, "open", classmethod(lambda cls, d: type(
        "R", (), {"config": None})()))
    assert duel.run_pair(PairStore(tmp_path / "pairs.json"), "c.yaml", "0.5x", 0, tmp_path,
                         [9]) == {**rec}


def test_random_search_record_round_trips():
    rs = RandomSearch(budget=10.0, trained=[Trained([0, 1], 11.0, None, 0.5, 1.0, 0.4, 2.0),
                                            Trained([1, 1], 12.0, 12.1, 0.6, 1.1, 0.5, 4.0)])
    d = rs.to_dict()
    assert d["best"]["indices"] == [1, 1] and d["one_training"] == 3.0
    assert d["r"] == pytest.approx(10 / 3)


@pytest.fixture
def tiny_config(tmp_path):
    d = digits_run_config(space=SPACE, retrain={"epochs": 1, "warmup_epochs": 0,
                                                "device": "cpu", "threads": 1,
                                                "measure_latency": False},
                          search={"epochs": 1, "warmup_epochs": 0, "fit_tolerance": 0.15})
    d["loss"] = {"kind": "target", "target": "0.5x", "lambda": 1.0}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


@pytest.mark.slow
def test_one_pair_end_to_end(tiny_config, tmp_path):
    """One pair on the tiny space (FLOPs cost: the random side's networks are not timed):
    every stage recorded, the random side trained only networks within the tolerance, and a
    re-run finds the pair finished."""
    st = PairStore(tmp_path / "out" / "pairs.json")
    rec = duel.run_pair(st, tiny_config, "0.5x", 0, tmp_path / "out", [101, 102, 103])
    assert rec["search"]["seconds"] > 0 and rec["search"]["table_built"] is False  # FLOPs
    r = rec["random"]
    assert r["networks"] >= 1 and r["skipped_measure"]
    assert r["spent"] - r["trained"][-1]["seconds"] < r["budget"] + 1.0
    tgt = rec["retrain"]["target_cost"]
    for t in r["trained"]:
        assert abs(t["predicted"] / tgt - 1) <= 0.15 + 1e-9
    for side in ("search", "random"):
        p = rec["retrain"][side]
        assert len(p["test_acc"]) == 3 and 0 <= p["mean_test_acc"] <= 1
    assert PairStore(tmp_path / "out" / "pairs.json").done("0.5x", 0)
    assert not (tmp_path / "out" / "scratch").exists()


@pytest.mark.slow  # a search on the fake device first: about 12 s
def test_equal_cost_random_times_networks_as_the_measured_fit_does(tmp_path, monkeypatch):
    """On a finished search on the fake device, the random side times each kept network with
    the fit's measurer (in the run's units, within the tolerance of its target) and trains
    only those measured inside; with search.fit_measure off it says why it times none."""
    from fbnas.fit.search_run import SearchRun
    from tests.fit.measured import fake_run, run_search

    cfg = fake_run(tmp_path, fit_tolerance=0.1)
    run_search(cfg, tmp_path)
    run = SearchRun.open(tmp_path / "run")
    trained = []

    def stub(cfg, arch, seed, work, threads=None):
        trained.append(arch)
        return {"val_acc": 0.5, "val_ce": 1.0, "test_acc": 0.5, "seconds": 0.01}

    monkeypatch.setattr(duel, "train_child", stub)
    lines = []
    rs = duel.equal_cost_random(run, 0.5, 0, tmp_path / "w", 1, lines.append)
    assert rs.measured and not rs.skipped_measure and lines == []
    assert rs.trained and rs.seconds_measuring > 0
    for t in rs.trained:
        assert abs(t.measured / run.target - 1) <= 0.1
        assert abs(t.predicted / run.target - 1) <= 0.1
    assert len(trained) == len(rs.trained) and rs.kept == len(rs.trained) + rs.dropped
    monkeypatch.setattr(type(run), "config", property(
        lambda self: dataclasses.replace(cfg, search=dataclasses.replace(cfg.search,
                                                                  fit_measure="off"))))
    rs = duel.equal_cost_random(run, 0.05, 0, tmp_path / "w", 1, lines.append)
    assert not rs.measured and "fit_measure is off" in rs.skipped_measure
    assert len(lines) == 1 and "not timed end to end" in lines[0]


@pytest.mark.slow
def test_one_measured_pair_with_its_own_table(tmp_path):
    """On the fake device (a measured cost this machine can time): the search builds its own
    table (own_table), its pick's offset is its measured one, and the random side times every
    network it trains."""
    d = digits_run_config(space=SPACE, retrain={"epochs": 1, "warmup_epochs": 0,
                                                "device": "cpu", "threads": 1,
                                                "measure_latency": False},
                          search={"epochs": 1, "warmup_epochs": 0, "fit_tolerance": 0.15},
                          latency={"cost": "latency", "device": "fake",
                                   "cache_dir": str(tmp_path / "shared-cache")})
    d["loss"] = {"kind": "target", "target": "0.5x", "lambda": 1.0}
    cfg = tmp_path / "fake.yaml"
    cfg.write_text(yaml.safe_dump(d, sort_keys=False))
    st = PairStore(tmp_path / "out" / "pairs.json")
    rec = duel.run_pair(st, cfg, "0.5x", 1, tmp_path / "out", [11, 12, 13], own_table=True)
    assert rec["search"]["table_built"] is True
    assert not (tmp_path / "shared-cache").exists()
    r = rec["random"]
    assert r["measured"] and r["seconds_measuring"] > 0
    assert all(t["measured"] is not None for t in r["trained"])
    assert rec["retrain"]["search"]["latency_is"] == "measured"
    assert rec["retrain"]["random"]["latency_is"] == "measured"


def test_the_command_refuses_seeds_that_are_not_fresh(tmp_path, capsys):
    from fbnas._cli import main

    for bad, needle in ((["--retrain-seeds", "2,7"], "fresh seeds"),
                        (["--seeds", "0,x"], "integers")):
        assert main(["bench", "duel", "--config", "c.yaml", "--out", str(tmp_path / "d"),
                     "--seeds", "0,1,2", *bad]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()
