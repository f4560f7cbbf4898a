"""Fitting the final architecture onto a cost target (fbnas/fit/onto_target.py): the fit's
choice, searches under a target in the sampled modes, `fbnas sample --hard` fitting as the
search did. (Parsing targets and the target losses: tests/test_loss.py.)"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections import Counter

import pytest
import torch
import yaml
from conftest import DIGITS_SPACE, digits_run_config

from fbnas.arch import arch_indices, log_prob
from fbnas.config import config_from_dict
from fbnas.fit._band import band_members, drawn_in_band
from fbnas.fit.onto_target import fit_to_target, likeliest_in_band
from fbnas.fit.search_run import SearchRun
from fbnas.fit.select import Selector, distinct_top, train_ranked
from fbnas.latency.cost_model import predicted_cost
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger


def run_config(loss: dict | None = None, **sections: dict) -> dict:
    """The tiny digits run config with its loss section replaced by `loss`."""
    d = digits_run_config(**sections)
    if loss is not None:
        d["loss"] = dict(loss)
    return d


def test_fit_lands_in_the_band_with_the_likeliest_changes():
    rows = [[10.0, 20.0, 40.0], [10.0, 20.0, 40.0], [5.0, 6.0, 50.0]]
    # layer 0 and 1 prefer op 0; layer 2 is nearly indifferent between 0 and 2
    theta = [torch.tensor([3.0, 0.0, 0.0]), torch.tensor([3.0, 0.0, 0.0]),
             torch.tensor([0.1, -3.0, 0.0])]
    fit = fit_to_target(theta, rows, fixed=0.0, target=70.0, tol=0.03)
    assert fit.hit and fit.indices == [0, 0, 2] and fit.cost == 70.0 and fit.changes == 1
    # already in the band: nothing changes
    same = fit_to_target(theta, rows, 0.0, target=25.5, tol=0.03)
    assert same.changes == 0 and same.indices == [0, 0, 0]
    # above the dearest architecture: it moves as far as it can and says it missed
    far = fit_to_target(theta, rows, 0.0, target=1000.0, tol=0.03)
    assert not far.hit and far.cost == predicted_cost(rows, 0.0, far.indices) == 130.0


def test_fit_never_ends_further_from_the_target():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        rows = (torch.rand(5, 4, generator=g) * 100).tolist()
        theta = list(torch.randn(5, 4, generator=g))
        target = float(torch.rand(1, generator=g)) * 400 + 10
        start = [int(t.argmax()) for t in theta]
        fit = fit_to_target(theta, rows, 7.0, target, tol=0.05)
        before = abs(math.log(predicted_cost(rows, 7.0, start) / target))
        assert abs(math.log(fit.cost / target)) <= before + 1e-12
        reachable = any(abs(predicted_cost(rows, 7.0, c) / target - 1) <= 0.05
                        for c in itertools.product(range(4), repeat=5))
        assert fit.hit == reachable  # a small space is searched exhaustively when needed


def test_fit_into_a_gap_takes_the_likeliest_network_near_the_nearest_cost():
    """A space whose costs have a gap around the target (the benchmark's has none between 613
    and 676 µs): the band is widened by the nearest network's distance, and the fit returns
    the most probable network in it, not where the greedy steps stopped (once +6.7% over a
    0.8x target where a network at -3.4% existed)."""
    g = torch.Generator().manual_seed(1)
    gapped = 0
    for _ in range(300):
        # two clusters of op costs per layer: every network's cost is a sum of cheap and dear
        rows = [sorted(float(v) for v in torch.cat([torch.rand(2, generator=g) * 5,
                                                    50 + torch.rand(2, generator=g) * 5]))
                for _ in range(4)]
        theta = list(torch.randn(4, 4, generator=g) * 2)
        target = float(torch.rand(1, generator=g)) * 200 + 5
        combos = list(itertools.product(range(4), repeat=4))
        costs = {c: predicted_cost(rows, 1.0, c) for c in combos}
        if any(abs(v / target - 1) <= 0.03 for v in costs.values()):
            continue
        gapped += 1
        fit = fit_to_target(theta, rows, 1.0, target, tol=0.03)
        nearest = min(abs(math.log(v / target)) for v in costs.values())
        near = [c for c, v in costs.items()
                if abs(math.log(v / target)) <= nearest + math.log1p(0.03) + 1e-12]
        likeliest = max(near, key=lambda c: sum(float(torch.log_softmax(t, -1)[i])
                                                for t, i in zip(theta, c, strict=True)))
        assert not fit.hit and fit.indices == list(likeliest)
    assert gapped > 50


def test_likeliest_in_band_is_the_exact_top_k_in_a_small_space_and_the_band_in_a_large():
    g = torch.Generator().manual_seed(3)
    rows = (torch.rand(4, 5, generator=g) * 100).tolist()
    theta = list(torch.randn(4, 5, generator=g))
    combos = list(itertools.product(range(5), repeat=4))
    lo, hi = 150.0, 170.0
    inside = sorted((c for c in combos if lo <= predicted_cost(rows, 2.0, c) <= hi),
                    key=lambda c: -log_prob(theta, c))
    assert len(inside) > 6
    assert likeliest_in_band(theta, rows, 2.0, lo, hi, 6) == [list(c) for c in inside[:6]]
    # beyond the exhaustive limit: networks of the band only, most probable first
    big = likeliest_in_band(theta, rows, 2.0, lo, hi, 6, limit=10)
    assert big and all(lo <= predicted_cost(rows, 2.0, c) <= hi for c in big)
    lps = [log_prob(theta, c) for c in big]
    assert lps == sorted(lps, reverse=True) and len({tuple(c) for c in big}) == len(big)
    assert likeliest_in_band(theta, rows, 2.0, 1e6, 2e6, 6) == []  # an empty band


def _trainer(tmp_path, loss=None, **sections):
    cfg = config_from_dict(run_config(loss, **sections), "test")
    return SearchTrainer(cfg, tmp_path / "run")


@pytest.mark.parametrize("mode", ["full", "reinforce", "two_path"])
def test_sampled_modes_do_not_end_all_skip_under_a_target(tmp_path, mode):
    t = _trainer(tmp_path, loss={"kind": "target", "target": "0.6x", "lambda": 3.0},
                 search={"mode": mode, "epochs": 3, "warmup_epochs": 1, "theta_lr": 0.5})
    try:
        t.train()
        arch = t.final_arch()
    finally:
        close_logger(t.log)
    lo, hi = t.model.cost_bounds()
    target = lo + 0.6 * (hi - lo)
    rows = [list(r.values()) for r in t.costs.rows]

    def in_band(c: float) -> bool:
        return abs(c / target - 1) <= 0.03

    reachable = any(in_band(t.costs.fixed + sum(r[i] for r, i in zip(rows, combo, strict=True)))
                    for combo in itertools.product(*(range(len(r)) for r in rows)))
    cost = t.costs.fixed + sum(r[o] for r, o in zip(t.costs.rows, arch.ops, strict=True))
    assert in_band(cost) == reachable
    all_skip = t.costs.fixed + sum(r["skip"] for r in t.costs.rows)
    assert all_skip < target * 0.97 and any(op != "skip" for op in arch.ops)
    saved = yaml.safe_load((tmp_path / "run" / "arch_hard.yaml").read_text())
    assert saved["meta"]["target"] == pytest.approx(target)


def test_a_target_outside_the_range_is_one_warning_line(tmp_path, caplog):
    t = _trainer(tmp_path, loss={"kind": "target", "target": 1e12})
    try:
        lines = [ln for ln in (tmp_path / "run" / "train.log").read_text().splitlines()
                 if "outside this space's range" in ln]
    finally:
        close_logger(t.log)
    assert len(lines) == 1 and "loss.target: 1000000000000.0" in lines[0]


PICK_SPACE = {**DIGITS_SPACE, "candidates": ["ir_k3_e1", "ir_k3_e3", "ir_k5_e3", "ir_k3_e6",
                                             "ir_k5_e6", "skip"],
              "stages": [{"channels": 8, "repeats": 2, "stride": 1},
                         {"channels": 16, "repeats": 2, "stride": 2}]}


def test_the_final_picks_band_reaches_6_percent_under_the_target_but_only_3_over(tmp_path):
    """θ's argmax A predicted up to 3% under the target is the fit; a network B two layers
    away, which θ rates next to A, lies more than 3% under A's cost and less than 6% under
    the target: a candidate, though outside ±3% of the fit's cost."""
    t = _trainer(tmp_path, loss={"kind": "target", "target": "0.5x", "lambda": 1.0},
                 search={"mode": "reinforce", "weights": "shared", "epochs": 2,
                         "warmup_epochs": 1, "final_candidates": 4}, space=PICK_SPACE)
    close_logger(t.log)
    target, fixed = t.loss.target, t.costs.fixed
    rows = [list(r.values()) for r in t.costs.rows]
    nets = {i: predicted_cost(rows, fixed, i) / target - 1
            for i in itertools.product(*(range(len(r)) for r in rows))}
    pairs = [(a, b) for a, ca in nets.items() if -0.03 <= ca <= 0.0 for b, cb in nets.items()
             if sum(x != y for x, y in zip(a, b, strict=True)) == 2
             and -0.06 < cb < (1 + ca) * 0.97 - 1]
    assert pairs, "the space has no such pair"
    a, b = pairs[0]
    with torch.no_grad():
        for th, i, j in zip(t.net.theta, a, b, strict=True):
            th.zero_()
            th[j] = 4.95
            th[i] = 5.0
    cands = Selector(t.cfg, t.net.theta, t.costs, target).candidates()
    assert cands[0] == list(a) and list(b) in cands
    assert all(-0.06 - 1e-9 <= nets[tuple(c)] <= 0.03 + 1e-9 for c in cands)


def test_the_final_pick_returns_the_best_path_among_the_likeliest_networks_of_the_cost(tmp_path):
    t = _trainer(tmp_path, loss={"kind": "target", "target": "0.5x", "lambda": 1.0},
                 search={"mode": "reinforce", "weights": "shared", "epochs": 2,
                         "warmup_epochs": 1, "final_candidates": 5}, space=PICK_SPACE)
    try:
        t.train()
        target = t.loss.target
        cands = Selector(t.cfg, t.net.theta, t.costs, target).candidates()
        arch = t.final_arch()
    finally:
        close_logger(t.log)
    rows = [list(r.values()) for r in t.costs.rows]
    first = fit_to_target(list(t.net.theta), rows, t.costs.fixed, target, 0.03)
    # the table fit first, then the most probable other networks predicted from 6% under
    # the target to 3% over it (around the fit's cost, where the fit lies outside that)
    assert cands[0] == first.indices and 1 < len(cands) <= 5
    lo, hi = target * 0.94, target * 1.03
    if not lo <= first.cost <= hi:
        lo, hi = first.cost * 0.97, min(first.cost * 1.03, max(hi, first.cost))
    theta = list(t.net.theta)
    band = [list(i) for i in itertools.product(*(range(len(r)) for r in rows))
            if lo * (1 - 1e-9) <= predicted_cost(rows, t.costs.fixed, i) <= hi * (1 + 1e-9)]
    band = sorted((i for i in band if i != first.indices), key=lambda i: -log_prob(theta, i))
    assert cands[1:] == band[:len(cands) - 1]
    pick = arch.meta["final_pick"]
    accs = pick["path_acc"]
    assert pick["candidates"] == len(cands) and accs[pick["chosen"]] == max(accs)
    assert arch_indices(t.cfg.space, arch) == cands[pick["chosen"]]
    # the ranking is recorded, best path first, and a re-fit reads it back in that order
    assert pick["ranked"][0] == pick["chosen"] and sorted(pick["ranked"]) == list(range(len(cands)))
    assert [accs[i] for i in pick["ranked"]] == sorted(accs, reverse=True)
    ranked, rec = SearchRun.open(tmp_path / "run").recorded_pick
    assert ranked == [cands[i] for i in pick["ranked"]] and rec == pick
    old = {k: v for k, v in pick.items() if k != "ranked"}  # a record from before the ranking
    arch.meta["final_pick"] = old
    arch.save(tmp_path / "run" / "arch_hard.yaml")
    assert SearchRun.open(tmp_path / "run").recorded_pick[0] == [cands[pick["chosen"]]]
    # `theta` returns the table's fit, as before the final pick existed
    t2 = _trainer(tmp_path / "b", loss={"kind": "target", "target": "0.5x", "lambda": 1.0},
                  search={"mode": "reinforce", "weights": "shared", "epochs": 2,
                          "warmup_epochs": 1, "final_pick": "theta"}, space=PICK_SPACE)
    try:
        t2.train()
        a2 = t2.final_arch()
        want = fit_to_target(list(t2.net.theta), rows, t2.costs.fixed, t2.loss.target, 0.03)
    finally:
        close_logger(t2.log)
    assert "final_pick" not in a2.meta and arch_indices(t2.cfg.space, a2) == want.indices


def test_final_train_trains_the_best_ranked_networks_and_returns_the_best_trained(tmp_path,
                                                                                    monkeypatch):
    """`search.final_train: 2`: the two networks the supernet ranks best are trained from
    scratch (the retrain recipe, the run's scratch folder removed after) and the one that
    trains to the better validation accuracy is returned, ranked first in the record (which
    a re-fit reads back); the others keep the supernet's order after them."""
    import fbnas.trainer as trainer_mod

    trained: list[list[int]] = []
    real = trainer_mod.train_child

    def spy(cfg, arch, seed, work, threads=None):
        trained.append(arch_indices(cfg.space, arch))
        r = real(cfg, arch, seed, work, threads)
        # the supernet's second is made the better trained one
        r["val_acc"] = 0.9 if len(trained) == 2 else 0.1
        return r

    monkeypatch.setattr(trainer_mod, "train_child", spy)
    t = _trainer(tmp_path, loss={"kind": "target", "target": "0.5x", "lambda": 1.0},
                 search={"mode": "reinforce", "weights": "shared", "epochs": 2,
                         "warmup_epochs": 1, "final_candidates": 5, "final_train": 2},
                 retrain={"epochs": 1, "warmup_epochs": 0}, space=PICK_SPACE)
    try:
        t.train()  # returns arch_hard.yaml through the final pick
    finally:
        close_logger(t.log)
    arch = SearchRun.open(tmp_path / "run").arch
    pick = arch.meta["final_pick"]
    cands, accs = pick["candidates_indices"], pick["path_acc"]
    rec = pick["trained"]
    assert len(trained) == 2 and [r["indices"] for r in rec] == trained
    model = t.costs.model(t.cfg.space)  # only networks the measured fit could return
    assert all(abs(model.of(i) / t.loss.target - 1) <= 0.03 for i in trained)
    assert [r["supernet_rank"] for r in rec] == [0, 1]
    assert sorted(accs[cands.index(i)] for i in trained) == sorted(accs)[-2:]
    assert [r["val_acc"] for r in rec] == [0.1, 0.9]
    second = cands.index(trained[1])
    assert pick["chosen"] == second and arch_indices(t.cfg.space, arch) == trained[1]
    assert pick["ranked"][:2] == [second, cands.index(trained[0])]
    assert not (tmp_path / "run" / "final_train").exists()
    ranked, _ = SearchRun.open(tmp_path / "run").recorded_pick
    assert ranked[0] == trained[1]


def test_band_draws_add_networks_drawn_across_the_pick_band(tmp_path):
    """`search.final_band_draws: N`: after θ's most probable networks, N more drawn uniformly
    from the same band (none twice, none of θ's again), the same for the same seed."""
    t = _trainer(tmp_path, loss={"kind": "target", "target": "0.5x", "lambda": 1.0},
                 search={"final_candidates": 3}, space=PICK_SPACE)
    close_logger(t.log)
    target, fixed, theta = t.loss.target, t.costs.fixed, list(t.net.theta)
    rows = [list(r.values()) for r in t.costs.rows]

    def with_draws(n: int, seed: int = 0) -> list[list[int]]:
        cfg = dataclasses.replace(t.cfg, search=dataclasses.replace(
            t.cfg.search, final_band_draws=n, seed=seed))
        return Selector(cfg, theta, t.costs, target).candidates()

    plain, drawn = with_draws(0), with_draws(20)
    first = fit_to_target(theta, rows, fixed, target, 0.03)
    assert len(plain) == 3 and drawn[:3] == plain and len(drawn) == 23
    assert len({tuple(c) for c in drawn}) == 23
    lo, hi = target * 0.94, target * 1.03
    if not lo <= first.cost <= hi:
        lo, hi = first.cost * 0.97, min(first.cost * 1.03, max(hi, first.cost))
    assert all(lo * (1 - 1e-9) <= predicted_cost(rows, fixed, c) <= hi * (1 + 1e-9)
               for c in drawn[3:])
    assert with_draws(20) == drawn and with_draws(20, seed=1)[3:] != drawn[3:]


def test_drawn_in_band_is_uniform_within_the_band_exactly_or_by_rejection():
    rows = [[1.0, 2.0, 3.0, 4.0]] * 5
    cost = {i: sum(rows[0][j] for j in i) for i in itertools.product(range(4), repeat=5)}
    band = {i for i, c in cost.items() if 11.0 <= c <= 13.0}
    for limit in (10_000, 10):  # enumerated, then by rejection
        got = drawn_in_band(rows, 0.0, 11.0, 13.0, 40, random.Random(3), limit=limit)
        assert len(got) == 40 and len({tuple(i) for i in got}) == 40
        assert {tuple(i) for i in got} <= band
        assert got == drawn_in_band(rows, 0.0, 11.0, 13.0, 40, random.Random(3), limit=limit)
    everything = drawn_in_band(rows, 0.0, 11.0, 13.0, 10**6, random.Random(0))
    assert {tuple(i) for i in everything} == band  # a band smaller than n: all of it
    assert band_members(rows, 0.0, 11.0, 13.0) == sorted(band)
    # uniform: over many draws of one network each, every member turns up about equally
    counts = Counter(tuple(drawn_in_band(rows, 0.0, 11.0, 13.0, 1, random.Random(s), limit=10)[0])
                     for s in range(20 * len(band)))
    assert set(counts) <= band and len(counts) > 0.9 * len(band)
    assert max(counts.values()) < 60


def test_final_train_takes_the_best_ranked_networks_that_differ_enough():
    prefer = [[0, 0, 0], [0, 0, 1], [1, 1, 0], [0, 1, 1], [2, 2, 2]]
    assert distinct_top(prefer, 3) == [0, 1, 2]
    assert distinct_top(prefer, 3, differ=2) == [0, 2, 3]  # [0,0,1] is one layer from [0,0,0]
    assert distinct_top(prefer, 9, differ=3) == [0, 4]  # fewer than k where no more differ
    assert distinct_top(prefer, 2, differ=2, eligible=lambda p: p[0] != 1) == [0, 3]
    vals = {(0, 0, 0): 0.5, (1, 1, 0): 0.9, (0, 1, 1): 0.7}
    seen: list[list[int]] = []

    def train(i: list[int]) -> dict[str, float]:
        seen.append(i)
        return {"val_acc": vals[tuple(i)], "val_ce": 1.0, "seconds": 1.0}

    order, rec = train_ranked(prefer, train, 3, lambda _: None, differ=2)
    assert seen == [[0, 0, 0], [1, 1, 0], [0, 1, 1]]
    assert order == [[1, 1, 0], [0, 1, 1], [0, 0, 0], [0, 0, 1], [2, 2, 2]]
    assert [r["supernet_rank"] for r in rec] == [0, 2, 3]


class _Judge:
    """A PathJudge whose verdict is given: path scores by a rule, trainings recorded."""

    def __init__(self, can_score=True, can_train=True):
        self.can_score, self.can_train, self.trained = can_score, can_train, []

    def score_paths(self, cands):
        return [{"acc": 0.5 + 0.01 * (i % 7), "ce": 1.0} for i in range(len(cands))]

    def train_path(self, indices):
        self.trained.append(list(indices))
        return {"val_acc": 0.9 - 0.01 * len(self.trained), "val_ce": 0.5, "seconds": 0.0}


def test_the_selector_asks_its_judge_only_what_it_can_answer(tmp_path):
    """The pick is ranked by the judge's path scores, trained where it can train, skipped
    (and said so) where it cannot; no judge, or one without a validation split, leaves the
    table's fit to the measured fit."""
    t = _trainer(tmp_path, loss={"kind": "target", "target": "0.5x", "lambda": 1.0},
                 search={"epochs": 2, "warmup_epochs": 1, "final_candidates": 5,
                         "final_train": 2, "fit_measure": "off"}, space=PICK_SPACE)
    close_logger(t.log)
    lines: list[str] = []
    sel = Selector(t.cfg, t.net.theta, t.costs, t.loss.target, lines.append)
    cands = sel.candidates()
    judge = _Judge()
    got = sel.select(judge)
    pick = got.meta["final_pick"]
    assert pick["candidates"] == len(cands) and len(judge.trained) == len(pick["trained"]) >= 1
    assert got.indices == judge.trained[0]  # the best training first
    quiet = _Judge(can_train=False)
    sel.select(quiet)
    assert quiet.trained == [] and any("final_train skipped" in m for m in lines)
    plain = Selector(t.cfg, t.net.theta, t.costs, t.loss.target, lines.append)
    assert plain.select(_Judge(can_score=False)).indices == plain.table_fit().fit.indices
    assert "final_pick" not in plain.select(None).meta
    assert Selector(t.cfg, t.net.theta, t.costs, None).select(judge).indices == sel.argmax()
