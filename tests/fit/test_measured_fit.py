"""The measured fit (issue 26): the returned network timed end to end and re-fitted until it
measures on the target; a device fbnas cannot run on closes the loop through a bundle."""

from __future__ import annotations

import csv
import io
import itertools
import math
import statistics

import pytest
import torch
import yaml
from conftest import digits_run_config

import fbnas.fit.select as select_mod
from fbnas._cli import main
from fbnas.arch import Architecture, log_prob
from fbnas.config import config_from_dict, load_config
from fbnas.errors import FbnasError
from fbnas.fit.onto_target import (
    Round,
    choose,
    fit_to_target,
    measured_fit,
    near_target,
)
from fbnas.fit.select import Selector
from fbnas.latency.cost_model import predicted_cost
from fbnas.retrain import ChildTrainer
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger

from .measured import FIT_SPACE, fake_run, run_search, slow_networks


def _space(seed: int, layers: int = 6, ops: int = 5):
    g = torch.Generator().manual_seed(seed)
    rows = (torch.rand(layers, ops, generator=g) * 90 + 10).tolist()
    theta = list(torch.randn(layers, ops, generator=g))
    return rows, theta


@pytest.mark.parametrize("seed", range(6))
def test_a_table_that_under_predicts_large_networks_is_corrected_by_measuring(seed):
    """The 'device' is 5-25% slower than the table says, more so for larger networks (as
    the CPU table's misses at 0.75x): the measured fit ends inside ±3% in at most 4 timed
    networks, and returns the most probable of those measured inside."""
    rows, theta = _space(seed)
    lo, hi = sum(min(r) for r in rows), sum(max(r) for r in rows)
    target = lo + 0.6 * (hi - lo)
    timed = []

    def device(p: float) -> float:
        return p * (1.05 + 0.2 * (p - lo) / (hi - lo))

    def measure(idx):
        timed.append(list(idx))
        return device(predicted_cost(rows, 0.0, idx)), 0.01

    plain = fit_to_target(theta, rows, 0.0, target)
    assert abs(device(plain.cost) / target - 1) > 0.1  # the table's own fit misses, measured
    mf = measured_fit(theta, rows, 0.0, target, measure, tol=0.03, max_rounds=4)
    assert mf.hit and abs(mf.chosen.measured / target - 1) <= 0.03
    networks = {tuple(i) for i in timed}
    assert 2 <= len(networks) <= 4 and len(mf.rounds) == len(timed) <= 8
    assert timed[0] == plain.indices
    inner = [r for r in mf.rounds if abs(r.measured / target - 1) <= 0.01]
    middle = [r for r in mf.rounds if abs(r.measured / target - 1) <= 0.015]
    best = (max(inner or middle, key=lambda r: r.log_prob) if inner or middle
            else min(mf.rounds, key=lambda r: abs(r.measured / target - 1)))
    assert mf.fit.indices == list(best.indices)
    if middle:  # returned only once measured a second time
        assert timed.count(mf.fit.indices) == 2
    if inner:  # the fit stops at the first network measured in the inner third of the band
        assert timed[-1] == mf.fit.indices and len(inner) == 2
    assert mf.chosen.log_prob == pytest.approx(log_prob(theta, mf.fit.indices))
    assert mf.fit.cost == pytest.approx(predicted_cost(rows, 0.0, mf.fit.indices))


def test_an_exact_table_is_measured_once_and_keeps_the_table_fit():
    rows, theta = _space(0)
    target = sum(sum(r) for r in rows) / len(rows[0])
    plain = fit_to_target(theta, rows, 0.0, target)
    assert abs(plain.cost / target - 1) <= 0.015  # the table's fit lands mid-band here
    mf = measured_fit(theta, rows, 0.0, target,
                      lambda idx: (predicted_cost(rows, 0.0, idx), 0.0))
    assert [list(r.indices) for r in mf.rounds] == [plain.indices] * 2  # timed, confirmed
    assert mf.fit.indices == plain.indices and mf.hit == plain.hit
    once = measured_fit(theta, rows, 0.0, target,
                        lambda idx: (predicted_cost(rows, 0.0, idx), 0.0), confirm=False)
    assert len(once.rounds) == 1 and once.fit.indices == plain.indices


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("off", [1.025, 1.013])
def test_a_network_measured_off_the_inner_band_is_refitted_towards_the_target(seed, off):
    """Measured +2.5% or +1.3% (inside ±3%, but a re-measurement moving by 1% would put such
    a network outside now and then): the fit goes on and returns a network measured within
    ±1%, the most probable of those."""
    rows, theta = _space(seed)
    lo, hi = sum(min(r) for r in rows), sum(max(r) for r in rows)
    target = lo + 0.5 * (hi - lo)
    plain = fit_to_target(theta, rows, 0.0, target)
    factor = off * target / plain.cost  # the table's own fit measures exactly +2.5% / +1.3%
    mf = measured_fit(theta, rows, 0.0, target,
                      lambda idx: (factor * predicted_cost(rows, 0.0, idx), 0.01))
    assert mf.rounds[0].inside and mf.rounds[0].measured == pytest.approx(off * target)
    assert len({r.indices for r in mf.rounds}) >= 2
    assert abs(mf.chosen.measured / target - 1) <= 0.01
    inner = [r for r in mf.rounds if abs(r.measured / target - 1) <= 0.01]
    assert mf.chosen.indices == max(inner, key=lambda r: r.log_prob).indices


def test_a_network_whose_two_measurements_disagree_is_timed_a_third_time():
    """The table's fit measures +0.2%, then +4.5% (an outlier of a busy machine), then
    +0.4%: two measurements parting by more than tol/2 get a third, and the network is
    judged on the median (+0.4%), inside the inner band: returned, with no other timed."""
    rows, theta = _space(1)
    lo, hi = sum(min(r) for r in rows), sum(max(r) for r in rows)
    target = lo + 0.5 * (hi - lo)
    plain = fit_to_target(theta, rows, 0.0, target)
    readings = iter([1.002, 1.045, 1.004])
    mf = measured_fit(theta, rows, 0.0, target, lambda idx: (next(readings) * target, 0.01))
    assert [list(r.indices) for r in mf.rounds] == [plain.indices] * 3
    assert mf.fit.indices == plain.indices
    assert mf.chosen.measured == pytest.approx(1.004 * target)


@pytest.mark.parametrize("seed", range(4))
def test_a_network_is_returned_on_its_pooled_measurements_not_one_lucky_one(seed):
    """The table's fit measures -1% the first time and +5% after (a busy machine): the two
    part by more than tol/2, so it is timed a third time, and its pooled figure (the median,
    +5%) is outside the band; the fit goes on, and what it returns was measured (pooled)
    inside the middle of the band (the misleading +5% keeps the secant from the inner third
    within the fit's 6 networks in some of these spaces)."""
    rows, theta = _space(seed)
    lo, hi = sum(min(r) for r in rows), sum(max(r) for r in rows)
    target = lo + 0.5 * (hi - lo)
    plain = fit_to_target(theta, rows, 0.0, target)
    factor = target / plain.cost
    timed = []

    def measure(idx):
        timed.append(list(idx))
        lucky = 0.99 if timed.count(plain.indices) == 1 else 1.05
        extra = lucky if list(idx) == plain.indices else 1.0
        return extra * factor * predicted_cost(rows, 0.0, idx), 0.01

    mf = measured_fit(theta, rows, 0.0, target, measure)
    assert timed[:3] == [plain.indices] * 3  # timed -1%, then +5% twice
    first = [r for r in mf.rounds if list(r.indices) == plain.indices]
    assert [round(r.measured / target, 4) for r in first] == [0.99, 1.05, 1.05]
    assert mf.fit.indices != plain.indices and len({tuple(i) for i in timed}) >= 2
    assert abs(mf.chosen.measured / target - 1) <= 0.015
    assert timed.count(mf.fit.indices) == 2  # the one returned was confirmed too


def test_a_goal_in_a_gap_of_the_table_tries_an_untried_network_near_it():
    """Costs in lumps of 25 (one block ≈ 300 us, skip ≈ 0 in the quickstart CPU table): the
    table's fit measures +6%, and the corrected goal lies where the table's fit, at every
    band, returns that same network; the fit times the untried network the table predicts
    nearest to the goal instead of stopping, and ends inside the band."""
    g = torch.Generator().manual_seed(12)
    rows = (torch.randint(1, 6, (4, 4), generator=g).float() * 25).tolist()
    theta = list(torch.randn(4, 4, generator=g) * 2)
    lo, hi = sum(min(r) for r in rows), sum(max(r) for r in rows)
    target = lo + 0.5 * (hi - lo)
    plain = fit_to_target(theta, rows, 0.0, target)

    def measure(idx):
        return 1.06 * predicted_cost(rows, 0.0, idx), 0.01

    goal = target / 1.06  # what one network measured +6% says
    assert not any(fit_to_target(theta, rows, 0.0, goal, b).hit
                   for b in (0.01, 0.005, 0.0025))  # the gap: no network in the fit's band
    mf = measured_fit(theta, rows, 0.0, target, measure)
    assert mf.rounds[0].indices == tuple(plain.indices) and mf.rounds[0].measured > 1.05 * target
    assert mf.hit and mf.fit.indices != plain.indices
    # the second network is predicted as near the goal as any untried one (a quarter of the
    # inner band's slack), not merely somewhere within ±3% of it
    gaps = [abs(predicted_cost(rows, 0.0, c) / goal - 1)
            for c in itertools.product(range(4), repeat=4) if list(c) != plain.indices]
    assert abs(predicted_cost(rows, 0.0, mf.rounds[1].indices) / goal - 1) <= min(gaps) + 0.0025


def test_a_network_nearer_the_goal_than_every_timed_one_is_tried_however_far():
    """The table's fit (205 predicted) measures +8.4%; the corrected goal, 189, lies in a gap
    with nothing within ±3% of it, but the untried 200 is nearer to it than the timed 205:
    it is timed (and measures -1%) instead of the fit stopping at +8.4%."""
    rows = [[100.0, 200.0], [0.0, 5.0, 300.0]]
    theta = [torch.tensor([0.0, 2.0]), torch.tensor([0.0, 2.0, -1.0])]
    target = 208.0

    def measure(idx):
        p = predicted_cost(rows, 0.0, idx)
        return (1.10 if p == 205.0 else 1.03) * p, 0.01

    assert fit_to_target(theta, rows, 0.0, target).indices == [1, 1]  # 205, inside ±3%
    mf = measured_fit(theta, rows, 0.0, target, measure)
    assert [r.indices for r in mf.rounds] == [(1, 1), (1, 0), (1, 0)]
    assert mf.hit and mf.fit.indices == [1, 0]
    assert mf.chosen.measured == pytest.approx(206.0)


def test_near_target_spreads_the_most_probable_over_the_band():
    rows, theta = _space(1)
    lo, hi = sum(min(r) for r in rows), sum(max(r) for r in rows)
    target = lo + 0.4 * (hi - lo)
    picks = near_target(theta, rows, 0.0, target, 5, 0.1)
    assert len(picks) == 5 and len({tuple(p) for p in picks}) == 5
    costs = [predicted_cost(rows, 0.0, p) for p in picks]
    assert all(abs(c / target - 1) <= 0.1 + 1e-9 for c in costs)
    assert max(costs) / min(costs) > 1.05  # spread over the band, not bunched at the target
    lps = [log_prob(theta, p) for p in picks]
    assert lps == sorted(lps, reverse=True)


# ---- through the trainer, with the fake device made to disagree with its own table -----------
# 5 searchable layers x 5 candidates: enough architectures to land within ±3% of a target
def _expected_choice(rounds: list[dict], target: float, tol: float) -> dict:
    """What the measured fit should return from its recorded rounds: each network's
    measurements pooled (median in log space), then the most probable one within ±tol/3 of
    the target, else within ±tol/2, else the one nearest to it."""
    by: dict[tuple, list[dict]] = {}
    for r in rounds:
        by.setdefault(tuple(r["ops"]), []).append(r)
    pooled = [{**rs[0], "measured": math.exp(statistics.median(math.log(r["measured"])
                                                                for r in rs))}
              for rs in by.values()]
    for band in (tol / 3, tol / 2):
        inside = [r for r in pooled if abs(r["measured"] / target - 1) <= band]
        if inside:
            return max(inside, key=lambda r: r["log_probability"])
    return min(pooled, key=lambda r: abs(math.log(r["measured"] / target)))


def test_the_search_returns_a_network_measured_on_target(tmp_path, monkeypatch):
    """The table's fit measures 15% high; the measured fit returns a network measured inside
    the band. The fit stops at a measurement inside the band, so that one leans inward; the
    returned network is timed once more and that figure is `measured` (the choosing one is
    kept as `selection_measured`)."""
    cfg = fake_run(tmp_path)
    t = SearchTrainer(cfg, tmp_path / "run")  # measures the table with the honest fake device
    close_logger(t.log)
    slow_networks(monkeypatch, 1.15)
    timed = []
    real = select_mod.time_archs

    def counting(timer, archs, *a, **k):
        out = real(timer, archs, *a, **k)
        timed.append((tuple(archs["fit"].ops), out["fit"]["median_us"]))
        return out

    monkeypatch.setattr(select_mod, "time_archs", counting)
    t, saved = run_search(cfg, tmp_path)
    meta = saved["meta"]
    target = meta["target"]
    assert abs(meta["measured"] / target - 1) <= cfg.search.fit_tolerance and meta[
        "measured_inside"]
    rounds = meta["fit_rounds"]
    assert len(rounds) >= 2 and len({tuple(r["ops"]) for r in rounds}) <= cfg.search.fit_rounds
    # the first timed network is the table's fit, which measures 15% high
    rows = [list(r.values()) for r in t.costs.rows]
    plain = fit_to_target(t.net.theta, rows, t.costs.fixed, target, cfg.search.fit_tolerance)
    cands = cfg.space.layer_candidates()
    assert rounds[0]["ops"] == [c[i] for c, i in zip(cands, plain.indices, strict=True)]
    assert rounds[0]["measured"] == pytest.approx(plain.cost * 1.15, rel=0.02)
    best = _expected_choice(rounds, target, cfg.search.fit_tolerance)
    assert saved["ops"] == best["ops"] and meta["predicted"] == best["predicted"]
    # the returned network timed last, and that timing is the one reported
    assert len(timed) == len(rounds) + 1
    assert list(timed[-1][0]) == saved["ops"]
    assert meta["measured"] == pytest.approx(timed[-1][1], abs=1e-3)
    assert meta["selection_measured"] == best["measured"] or len(
        [r for r in rounds if r["ops"] == best["ops"]]) > 1  # pooled
    log = (tmp_path / "run" / "train.log").read_text()
    assert "measured fit round 1" in log and f"{meta['measured']:.1f} us measured" in log
    assert "the returned network timed again" in log


@pytest.mark.slow  # moved from the fast tier: 4-6 s, its module has other fast tests
def test_the_target_prediction_and_measurement_are_reported_side_by_side(tmp_path, capsys):
    """A retrained searched network's results (and `fbnas runs`) show what the search was
    asked for beside the table's prediction and the measured latency."""
    cfg = fake_run(tmp_path)
    run_search(cfg, tmp_path)
    arch = Architecture.load(tmp_path / "run" / "arch_hard.yaml")
    d = digits_run_config(space=FIT_SPACE, latency={
        "cost": "latency", "device": "fake", "cache_dir": str(tmp_path / "cache")},
        retrain={"epochs": 1, "warmup_epochs": 0, "device": "cpu"})
    c = ChildTrainer(config_from_dict(d, "r.yaml"), arch, tmp_path / "child")
    try:
        res = c.train()
    finally:
        close_logger(c.log)
    assert res["target_us"] == pytest.approx(arch.meta["target"])
    assert res["predicted_us"] is not None and res["measured_us"] is not None
    capsys.readouterr()
    assert main(["runs", str(tmp_path / "child"), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert float(rows[0]["target"]) == pytest.approx(arch.meta["target"])
    assert float(rows[0]["measured"]) == pytest.approx(res["measured_us"])


def test_fit_measure_off_keeps_the_table_fit(tmp_path, monkeypatch):
    cfg = fake_run(tmp_path, fit_measure="off")
    slow_networks(monkeypatch, 1.15)
    t, saved = run_search(cfg, tmp_path)
    rows = [list(r.values()) for r in t.costs.rows]
    plain = fit_to_target(t.net.theta, rows, t.costs.fixed, saved["meta"]["target"])
    cands = cfg.space.layer_candidates()
    assert saved["ops"] == [c[i] for c, i in zip(cands, plain.indices, strict=True)]
    assert "measured" not in saved["meta"] and "fit_rounds" not in saved["meta"]


def _imported(t) -> None:
    """Make the run's table look imported from a phone's bundle run."""
    t.costs.table.meta.update(imported_from="phone/results.json", bundle="b" * 16,
                              device_name="Kryo 585 (executorch 1.0)", backend="executorch")


def test_a_table_from_another_device_skips_the_measured_fit_in_one_line(tmp_path):
    cfg = fake_run(tmp_path)
    t = SearchTrainer(cfg, tmp_path / "run")
    close_logger(t.log)
    _imported(t)
    lines: list[str] = []
    idx, meta = Selector(cfg, t.net.theta, t.costs, 300.0, lines.append, "RUN").measured_fit()
    skipped = [ln for ln in lines if "measured fit skipped" in ln]
    assert len(skipped) == 1 and "Kryo 585" in skipped[0]
    assert "fbnas sample RUN --near-target" in skipped[0] and "--pick" in skipped[0]
    assert "measured" not in meta
    with pytest.raises(FbnasError, match="search.fit_measure: on, but .*another device"):
        Selector(cfg, t.net.theta, t.costs, 300.0, lines.append, fit_measure="on").measured_fit()


@pytest.mark.parametrize("raw, want", [("off", "off"), ("on", "on"), ("auto", "auto")])
def test_fit_measure_reads_yaml_booleans(tmp_path, raw, want):
    """YAML 1.1 reads `fit_measure: off` as false: it still means off (and `on` on)."""
    d = digits_run_config()
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d).replace("search:\n", f"search:\n  fit_measure: {raw}\n", 1))
    assert load_config(p).search.fit_measure == want
    with pytest.raises(FbnasError, match="search.fit_measure"):
        load_config(p, ["search.fit_measure=sometimes"])




def _every_network(seed: int):
    """A 6-layer x 5-op space: its rows and θ, every network, its predicted cost, and a
    target at the median cost."""
    rows, theta = _space(seed)
    combos = list(itertools.product(range(5), repeat=6))
    cost = {c: predicted_cost(rows, 0.0, c) for c in combos}
    return rows, theta, combos, cost, sorted(cost.values())[len(cost) // 2]


def test_the_measured_fit_prefers_the_final_picks_ranked_networks():
    """The pick (ranked first) measures +2% on a device 2% slower than its table: the fit
    times next the best-ranked network predicted near the corrected goal, not θ's own fit,
    and returns it, though θ finds it the least probable of the networks there."""
    rows, theta, combos, cost, target = _every_network(2)

    def measure(idx):
        return 1.02 * predicted_cost(rows, 0.0, idx), 0.01

    first = next(c for c in combos if abs(cost[c] / target - 1) <= 0.002)
    goal = target / 1.02
    near_goal = [c for c in combos if abs(cost[c] / goal - 1) <= 0.003]
    second = min(near_goal, key=lambda c: log_prob(theta, c))
    mf = measured_fit(theta, rows, 0.0, target, measure, prefer=[list(first), list(second)])
    timed = list(dict.fromkeys(r.indices for r in mf.rounds))
    assert timed[:2] == [first, second]
    assert mf.hit and mf.fit.indices == list(second)
    plain = measured_fit(theta, rows, 0.0, target, measure, first=list(first))
    assert plain.fit.indices != list(second)  # without the ranking θ's choice wins


def test_the_measured_fit_stays_among_the_ranked_networks_where_one_is_near_the_goal():
    """Where no ranked network is predicted within ±tol/3 of the corrected goal but one is
    within ±tol of it, that one is timed next (not θ's re-fit), and a ranked network measured
    within the middle band (±tol/2) is returned over an unranked one measured nearer: the
    supernet ranks a band far better than θ does (on the duel's task, Kendall τ about 0.77
    against 0.68), and θ's re-fit had returned networks outside the ranking."""
    rows, theta, combos, cost, target = _every_network(2)

    def measure(idx):
        return 1.03 * predicted_cost(rows, 0.0, idx), 0.005

    first = next(c for c in combos if abs(cost[c] / target - 1) <= 0.002)
    goal = target / 1.03
    # measures at +1.2%: inside ±tol/2, outside ±tol/3
    second = min((c for c in combos if abs(cost[c] / (goal * 1.012) - 1) <= 0.0005),
                 key=lambda c: log_prob(theta, c))
    prefer = [list(first), list(second)]
    mf = measured_fit(theta, rows, 0.0, target, measure, prefer=prefer)
    timed = list(dict.fromkeys(r.indices for r in mf.rounds))
    assert timed[:2] == [first, second]
    assert len(timed) > 2 and abs(mf.chosen.measured / target - 1) <= 0.015
    assert mf.fit.indices == list(second)  # the ranked one, though a later one measured nearer
    nearer = [r for r in mf.rounds if r.indices not in (first, second)]
    assert min(abs(r.measured / target - 1) for r in nearer) < 0.012


def test_in_a_gap_the_measured_fit_chooses_as_the_table_fit_does():
    """Nothing measured within ±tol: of the networks within the nearest one's distance plus
    the tolerance, the best-ranked (then the most probable) is returned, not the nearest."""
    def rnd(i, measured, lp):
        return Round((i,), measured, measured, 0.01, lp, abs(measured / 100 - 1) <= 0.03)

    pick, refit, far = rnd(0, 94.0, -5.0), rnd(1, 96.4, -1.0), rnd(2, 108.0, 0.0)
    est, bands = [pick, refit, far], (0.01, 0.015)
    assert choose(est, 100.0, bands, {(0,): 0}, tol=0.03) == pick
    assert choose(est, 100.0, bands, {}, tol=0.03) == refit  # unranked: the most probable
    assert choose(est, 100.0, bands, {(0,): 0}) == refit  # without tol: the nearest
    assert choose([*est, rnd(3, 92.0, 9.0)], 100.0, bands, {}, tol=0.03).indices == (1,)
    inside = rnd(4, 97.5, -9.0)  # within ±tol, outside the bands: the nearest, as before
    assert choose([*est, inside], 100.0, bands, {(0,): 0}, tol=0.03) == inside


def test_a_better_ranked_network_measured_within_the_tolerance_and_no_slower_is_returned():
    """The pick (ranked first) measures 2.5% under the target, θ's re-fit 0.5% under: the
    pick is within ±tol, cheaper and better ranked, so it is returned; slower than the re-fit,
    outside ±tol, or unranked, it is not (the narrowest band decides, as before)."""
    def rnd(i, measured, lp):
        return Round((i,), measured, measured, 0.01, lp, abs(measured / 100 - 1) <= 0.03)

    refit, bands = rnd(1, 99.5, -1.0), (0.01, 0.015)
    pick = rnd(0, 97.5, -5.0)
    assert choose([pick, refit], 100.0, bands, {(0,): 0}, tol=0.03) == pick
    assert choose([pick, refit], 100.0, bands, {}, tol=0.03) == refit
    assert choose([pick, refit], 100.0, bands, {(0,): 0}) == refit  # without tol: as before
    for other in (rnd(0, 102.5, -5.0), rnd(0, 96.5, -5.0)):  # slower; outside ±tol
        assert choose([other, refit], 100.0, bands, {(0,): 0}, tol=0.03) == refit
    second = rnd(2, 98.5, -2.0)  # ranked, but after the pick: the pick still wins
    assert choose([pick, second, refit], 100.0, bands, {(0,): 0, (2,): 1}, tol=0.03) == pick
    assert choose([second, refit], 100.0, bands, {(0,): 0, (2,): 1}, tol=0.03) == second


def test_a_trained_network_measured_within_the_tolerance_is_confirmed_and_returned():
    """`search.final_train`'s networks rank by training, which outranks any timing nearer the
    target: the best trained one measures +2.3% (outside the ±1% the fit otherwise stops at);
    it is timed again and returned, where without `trained` the fit goes on and returns a
    ranked network measured nearer. Measured outside ±tol it is not returned."""
    rows, theta, combos, cost, target = _every_network(2)
    first = next(c for c in combos if abs(cost[c] / target - 1) <= 0.002)
    others = [c for c in combos if c != first and abs(cost[c] / target - 1) <= 0.01]
    prefer = [list(first), *map(list, others[:3])]

    def measure_at(off):
        def measure(idx):
            return (1 + off if tuple(idx) == first else 1.0) * predicted_cost(rows, 0.0, idx), 0.01
        return measure

    mf = measured_fit(theta, rows, 0.0, target, measure_at(0.023), prefer=prefer, trained=2)
    assert mf.fit.indices == list(first) and [r.indices for r in mf.rounds] == [first, first]
    plain = measured_fit(theta, rows, 0.0, target, measure_at(0.023), prefer=prefer)
    assert plain.fit.indices != list(first) and len(plain.rounds) > 2
    far = measured_fit(theta, rows, 0.0, target, measure_at(0.045), prefer=prefer, trained=2)
    assert far.fit.indices != list(first)

    def rnd(i, measured):
        return Round((i,), measured, measured, 0.01, -1.0, abs(measured / 100 - 1) <= 0.03)

    est, bands, rank = [rnd(0, 102.6), rnd(1, 100.2), rnd(2, 99.9)], (0.01, 0.015), \
        {(0,): 0, (1,): 1, (2,): 2}
    assert choose(est, 100.0, bands, rank, 0.03, {(0,), (1,)}).indices == (0,)
    assert choose(est, 100.0, bands, rank, 0.03).indices == (1,)  # without: the nearer band
    assert choose([rnd(0, 103.5), *est[1:]], 100.0, bands, rank, 0.03, {(0,)}).indices == (1,)


def test_the_measured_fit_times_the_final_pick_first(tmp_path):
    cfg = fake_run(tmp_path)
    t = SearchTrainer(cfg, tmp_path / "run")
    close_logger(t.log)
    target = t.loss.target
    cands = Selector(cfg, t.net.theta, t.costs, target).candidates()
    assert len(cands) > 1
    pick = cands[-1]  # not the table's own fit
    idx, meta = Selector(cfg, t.net.theta, t.costs, target, [].append).measured_fit([pick])
    names = cfg.space.layer_candidates()
    assert meta["fit_rounds"][0]["ops"] == [c[i] for c, i in zip(names, pick, strict=True)]
    if meta["fit_rounds"][0]["inside"] and len({tuple(r["ops"]) for r in meta["fit_rounds"]}) == 1:
        assert idx == pick  # measured on target: the pick is what the search returns
