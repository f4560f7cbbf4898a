"""search.budget: the planner's arithmetic, and a budgeted search on a fake clock spending what
its plan predicted (each kind of step charged a fixed number of seconds)."""

import copy

import pytest
import yaml
from conftest import digits_run_config, one_line_error

from fbnas import retrain
from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.search import budget as budgets
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger

COSTS = budgets.StepCosts(child_setup=1.0, child_step=0.2, child_eval=0.05, child_steps=200,
                          child_evals=40, w_step=1.0, warm_w_step=0.8, theta_step=0.5,
                          w_steps=6, theta_steps=2, path_score=1.0, timing=2.0, probe=3.0)


def test_one_training_is_the_unit_and_an_epoch_holds_its_steps():
    assert COSTS.training == pytest.approx(1.0 + 200 * 0.2 + 40 * 0.05)  # 43 s
    assert COSTS.epoch(False) == pytest.approx(6 * 0.8 + 1.0)
    assert COSTS.epoch(True) == pytest.approx(6 * 1.0 + 2 * 0.5 + 1.0)


@pytest.mark.parametrize("budget", [1.0, 2.0, 5.0])
def test_the_plan_spends_the_budget_and_no_more(budget):
    p = budgets.plan(budget, COSTS, setup=1.5)
    total = budget * COSTS.training
    assert p.seconds <= total
    # the supernet takes what the other stages leave, to within one epoch
    assert total - p.seconds < COSTS.epoch(True)
    s = p.settings
    assert s["warmup_epochs"] >= 1 and s["epochs"] > s["warmup_epochs"]
    assert s["warmup_epochs"] == max(1, round(budgets.WARMUP_SHARE * s["epochs"]))
    assert p.stages["supernet"] == pytest.approx(
        s["warmup_epochs"] * COSTS.epoch(False)
        + (s["epochs"] - s["warmup_epochs"]) * COSTS.epoch(True))
    assert p.stages["setup"] == 1.5 and p.stages["probe"] == 3.0
    assert p.stages["measured_fit"] == pytest.approx(budgets.FIT_TIMINGS * COSTS.timing)
    # scoring is held to a tenth of the budget once the θ paths are paid
    assert p.stages["scoring"] <= max(budgets.SCORING_SHARE * total, 8 * COSTS.path_score)
    assert s["final_train"] == 0 and s["fit_rounds"] == budgets.FIT_ROUNDS


def test_a_larger_budget_buys_more_epochs_and_band_draws():
    small, large = budgets.plan(2, COSTS), budgets.plan(6, COSTS)
    assert large.settings["epochs"] > small.settings["epochs"]
    assert large.settings["final_band_draws"] > small.settings["final_band_draws"]


def test_no_measured_fit_frees_its_seconds_for_the_supernet():
    on, off = budgets.plan(3, COSTS), budgets.plan(3, COSTS, measured_fit=False)
    assert off.stages["measured_fit"] == 0
    assert off.settings["epochs"] > on.settings["epochs"]


def test_given_settings_are_kept_and_reported_as_overrides():
    p = budgets.plan(3, COSTS, {"epochs": 4, "final_train": 1})
    assert p.settings["epochs"] == 4 and p.settings["final_train"] == 1
    assert p.stages["final_train"] == pytest.approx(COSTS.training)
    assert p.overrides == {"epochs": 4, "final_train": 1}
    text = "\n".join(p.lines())
    assert "overrides" in text and "search.epochs: 4" in text and "search.final_train: 1" in text
    assert p.planned["epochs"] != 4  # what the budget alone would have planned, shown beside


def test_a_budget_too_small_for_the_search_is_one_line_naming_the_key():
    one_line_error(lambda: budgets.plan(0.2, COSTS), "search.budget", "0.2 trainings",
                   "raise the budget")


def test_replanning_on_real_epochs_fits_the_rest_of_the_budget():
    p = budgets.plan(4, COSTS).to_dict()
    warm = p["settings"]["warmup_epochs"]
    # the real epochs twice as slow as the probe read: fewer epochs, never fewer than done
    spent = p["stages_s"]["setup"] + p["stages_s"]["probe"] + 2 * COSTS.epoch(False)
    n, w = budgets.replan(p, spent, 1, warm, 2 * COSTS.epoch(False), 2 * COSTS.epoch(True))
    assert 1 < n < p["settings"]["epochs"] and 1 <= w < n
    left = p["budget"] * p["training_s"] - spent - sum(
        p["stages_s"][k] for k in ("scoring", "final_train", "measured_fit"))
    cost = max(0, w - 1) * 2 * COSTS.epoch(False) + (n - max(w, 1)) * 2 * COSTS.epoch(True)
    assert cost <= left < cost + 2 * COSTS.epoch(True)
    # past the warm-up, the warm-up stays; a given epoch count is never re-planned
    assert budgets.replan(p, spent, warm + 1, warm, 1.0, 1.0)[1] == warm
    fixed = budgets.plan(4, COSTS, {"epochs": 5}).to_dict()
    assert budgets.replan(fixed, 0.0, 1, 1, 100.0, 100.0) == (5, fixed["settings"]["warmup_epochs"])


def test_spent_records_seconds_and_trainings():
    rec = budgets.spent({"supernet": 60.0, "scoring": 10.0}, 35.0, 2.0)
    assert rec["seconds"] == 70.0 and rec["trainings"] == 2.0 and rec["budget"] == 2.0
    assert "70.0 s = 2.00 trainings (budget 2;" in budgets.describe_spent(rec)
    assert "trainings" not in budgets.spent({"supernet": 5.0}, 0.0, None)


# ---- a budgeted search on a fake clock -----------------------------------------------------------
W, THETA, PATH, CHILD = 1.0, 0.5, 2.0, 0.5  # seconds each step kind costs on the fake clock


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_costs(monkeypatch, clock: FakeClock) -> None:
    """Every step of each kind advances `clock` by its fixed seconds."""
    def charging(fn, seconds):
        def step(*a, **k):
            clock.now += seconds(*a, **k) if callable(seconds) else seconds
            return fn(*a, **k)
        return step

    monkeypatch.setattr(SearchTrainer, "weight_step", charging(SearchTrainer.weight_step, W))
    monkeypatch.setattr(SearchTrainer, "theta_step", charging(SearchTrainer.theta_step, THETA))
    monkeypatch.setattr(SearchTrainer, "validate", charging(SearchTrainer.validate, PATH))
    monkeypatch.setattr(SearchTrainer, "score_paths", charging(
        SearchTrainer.score_paths, lambda self, cands: PATH * len(cands)))
    monkeypatch.setattr(retrain.ChildTrainer, "train_step",
                        charging(retrain.ChildTrainer.train_step, CHILD))


def budget_config(tmp_path, budget, **search):
    d = digits_run_config(data={"limit": 300},
                          search={"epochs": None, "warmup_epochs": None, "budget": budget,
                                  "mode": "reinforce", "w_lr": 0.05, "theta_lr": 0.05,
                                  **search},
                          retrain={"epochs": 10})
    d["loss"] = {"kind": "target", "target": "0.5x", "lambda": 1.0}
    d["run"]["dir"] = str(tmp_path / "run")
    return config_from_dict(copy.deepcopy(d), "tiny.yaml")


@pytest.mark.parametrize("budget", [2.0, pytest.param(3.0, marks=pytest.mark.slow)])
# (one budget in the fast tier; a second, with the supernet's epochs re-planned, in the slow)
def test_a_budgeted_search_spends_what_its_plan_predicts(tmp_path, monkeypatch, budget):
    clock = FakeClock()
    fake_costs(monkeypatch, clock)
    t = SearchTrainer(budget_config(tmp_path, budget), tmp_path / "run", clock=clock)
    try:
        plan = t.budget_plan
        predicted = sum(plan["stages_s"].values())
        res = t.train()
    finally:
        close_logger(t.log)
    assert plan["costs"]["w_step"] == W and plan["costs"]["theta_step"] == THETA
    assert plan["costs"]["child_step"] == CHILD and plan["costs"]["path_score"] == PATH
    cost = res["search_cost"]
    assert cost["seconds"] == pytest.approx(predicted, rel=0.10)
    assert cost["trainings"] == pytest.approx(budget, rel=0.15)
    assert cost["budget"] == budget
    assert set(cost["stages_s"]) >= {"probe", "supernet", "scoring"}
    # the run ran the planned epochs, and its files say so
    assert len(t.history) == t.cfg.search.epochs == plan["settings"]["epochs"]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["search"]["epochs"] == t.cfg.search.epochs
    assert saved["search"]["budget"] == budget
    meta = yaml.safe_load((tmp_path / "run" / "arch_hard.yaml").read_text())["meta"]
    assert meta["search_cost"]["trainings"] == cost["trainings"]


def test_a_budgeted_search_prints_its_plan_and_reports_an_override(tmp_path, monkeypatch,
                                                                   capsys):
    clock = FakeClock()
    fake_costs(monkeypatch, clock)
    t = SearchTrainer(budget_config(tmp_path, 3.0, epochs=3, warmup_epochs=1),
                      tmp_path / "run", clock=clock)
    try:
        assert t.cfg.search.epochs == 3
        t.train()
    finally:
        close_logger(t.log)
    log = capsys.readouterr().err
    assert "budget: 3 trainings of the retrain recipe" in log
    assert "search.epochs: 3 (the budget would plan" in log
    assert len(t.history) == 3  # a given epoch count is kept, not re-planned


def test_a_budget_with_a_few_given_epochs_is_a_config_and_a_bad_pair_is_one_line():
    # the default warm-up (10) is the budget's to plan: 8 given epochs are no error
    cfg = config_from_dict(digits_run_config(search={"budget": 2, "epochs": 8,
                                                     "warmup_epochs": None}), "tiny.yaml")
    assert cfg.search.epochs == 8
    p = budgets.plan(3, COSTS, {"epochs": 8})
    assert p.settings["warmup_epochs"] == 2
    one_line_error(lambda: budgets.plan(3, COSTS, {"epochs": 4, "warmup_epochs": 4}),
                   "search.warmup_epochs: 4 leaves no θ epochs")
    # a given warm-up counts in the least the search needs
    with pytest.raises(FbnasError, match="needs at least"):
        budgets.plan(2, COSTS, {"warmup_epochs": 12})


def test_a_budget_is_checked_where_the_config_is_read():
    d = digits_run_config(search={"budget": 0})
    with pytest.raises(FbnasError, match="budget"):
        config_from_dict(d, "tiny.yaml")


@pytest.mark.slow
def test_a_real_budgeted_search_on_the_quickstart_records_what_it_spent(tmp_path, capsys):
    """`fbnas train --config configs/quickstart.yaml --set search.budget=3` on this machine's
    clock (a short child recipe so that a training takes seconds; the FLOPs cost, so that no
    table is timed first, and the fit kept untimed, whose timings would not fit such a
    budget): the plan printed, the
    epochs the budget chose run, and the spent R recorded in the arch file near the budget
    (loosely: the clock of a shared machine is not a test's to judge)."""
    from pathlib import Path

    from fbnas._cli import main

    cfg = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    run = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--set", "search.budget=3",
                 "--set", "search.epochs=null", "--set", "search.warmup_epochs=null",
                 "--set", "retrain.epochs=6", "--set", "search.fit_measure=off",
                 "--set", "latency.cost=flops",
                 "--set", f"run.dir={run}",
                 "--set", f"latency.cache_dir={tmp_path / 'tables'}",
                 "--set", "run.progress=false"]) == 0
    err = capsys.readouterr().err
    assert "budget: 3 trainings of the retrain recipe" in err and "spent: " in err
    meta = yaml.safe_load((run / "arch_hard.yaml").read_text())["meta"]
    cost = meta["search_cost"]
    assert cost["budget"] == 3 and 1.5 <= cost["trainings"] <= 4.5
    assert cost["seconds"] == pytest.approx(sum(cost["stages_s"].values()), abs=0.1)
    saved = yaml.safe_load((run / "config.yaml").read_text())["search"]
    assert saved["budget"] == 3 and saved["epochs"] >= 2


@pytest.mark.slow  # two searches (stopped, resumed) beside a third; the fast tier checks the
# plan and a budgeted search that runs through
def test_a_budgeted_search_interrupted_resumes_on_its_plan(tmp_path, monkeypatch):
    """Ctrl-C after the re-planned epochs: `--resume` reads the plan from the run (no new
    probe), runs the planned epochs and records the seconds of both processes."""
    from fbnas.training.loop import Interrupted

    clock = FakeClock()
    fake_costs(monkeypatch, clock)
    cfg = budget_config(tmp_path, 3.0)
    t = SearchTrainer(cfg, tmp_path / "run", clock=clock)
    planned = t.cfg.search.epochs
    calls = {"n": 0}
    step = t.weight_step

    def stopping(x, y):
        calls["n"] += 1
        if calls["n"] == 6 * 3 + 2:  # in the fourth epoch, after both re-plans
            t.request_stop()
        return step(x, y)

    t.weight_step = stopping
    with pytest.raises(Interrupted):
        t.train()
    close_logger(t.log)
    replanned, spent_before = t.cfg.search.epochs, t.search_cost()["seconds"]
    assert replanned == planned  # the fake clock's epochs are what the probe read
    probes = {"n": 0}
    probe = SearchTrainer._probe_costs
    monkeypatch.setattr(SearchTrainer, "_probe_costs",
                        lambda self, *a: probes.__setitem__("n", 1) or probe(self, *a))
    resumed = SearchTrainer(config_from_dict(yaml.safe_load(
        (tmp_path / "run" / "config.yaml").read_text()), "resumed"), tmp_path / "run",
        resume=True, clock=clock)
    try:
        res = resumed.train()
    finally:
        close_logger(resumed.log)
    assert probes["n"] == 0 and resumed.budget_plan == t.budget_plan
    assert len(resumed.history) == replanned
    # the interrupted epoch's seconds count both processes: a whole θ epoch's, as the others
    assert resumed.history[3]["seconds"] == pytest.approx(resumed.history[2]["seconds"])
    assert res["search_cost"]["seconds"] > spent_before
    assert res["search_cost"]["trainings"] == pytest.approx(3.0, rel=0.15)
