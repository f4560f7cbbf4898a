"""Issue 38, item 2: each fact about a setting is declared once, where the setting is, and
everything else is derived from it: what a resumed run may change, the CLI's choices, the loss
keys, whether a cost kind is measured, and which settings a search mode ignores."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import digits_run_config

import fbnas.config as config_mod
from fbnas._cli import eval as cli_eval
from fbnas._cli.latency.common import timer_args
from fbnas.backends import FORMATS, TIMERS, clock_choices
from fbnas.backends.cpu import CpuTimer
from fbnas.config import (
    ResumePolicy,
    RetrainConfig,
    SearchConfig,
    config_from_dict,
    load_config,
)
from fbnas.errors import FbnasError
from fbnas.fit.select import cannot_time_here
from fbnas.latency import LatencyTable
from fbnas.latency.kinds import COST_KINDS, CostKind, is_measured
from fbnas.latency.table import _check_meta
from fbnas.loss import LOSSES, CostLoss, LossConfig
from fbnas.retrain import ChildTrainer
from fbnas.search.modes import MODES, TAU, get_mode, ignored_note, ignored_settings
from fbnas.settings import DEVICES, setting, setting_choices, settings_of
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger

# ---- 1. what a resumed run may change ---------------------------------------------------------
# The sets ResumePolicy listed by hand before the settings declared them.
OLD_SEARCH_RESUMABLE = {
    ("run", "dir"), ("run", "progress"), ("run", "tensorboard"),
    ("run", "checkpoint_every_steps"), ("search", "device"), ("data", "workers"),
    ("data", "root"), ("data", "eval_batch_size"), ("run", "ddp_backend"),
    ("search", "checkpoint_activations"), ("search", "channels_last"),
    ("search", "fit_target"), ("search", "fit_tolerance"), ("search", "fit_measure"),
    ("search", "fit_rounds"), ("search", "compile"), ("search", "compile_backend"),
    ("run", "nan_check"),
    # declared since (issue 39): the final pick, applied after the last epoch
    ("search", "final_pick"), ("search", "final_candidates"),
    # declared since (issue 51): the final pick's trainings, applied after the last epoch
    ("search", "final_train"), ("search", "final_band_draws"),
    ("search", "final_train_distinct"),
    # declared since: how the measured fit's timings stop, applied after the last epoch
    ("search", "fit_stop_ci"), ("search", "fit_panel")}
OLD_SEARCH_ADDED = {
    ("run", "ddp_sync_every"): 1, ("search", "mode"): "full",
    ("search", "warmup_sampling"): "mode", ("search", "checkpoint_activations"): False,
    ("search", "precision"): "float32", ("search", "channels_last"): False,
    ("data", "placement"): "auto", ("search", "compile"): False,
    ("search", "compile_backend"): "inductor", ("run", "nan_check"): "auto",
    ("search", "weights"): "separate", ("search", "weight_sampling"): "mode",
    ("search", "uniform_paths"): 0,
    # declared since (issue 39): what runs before them did
    ("search", "shared_update"): "all", ("search", "sandwich"): False,
    ("search", "final_pick"): "theta", ("search", "final_train"): 0,
    ("search", "final_band_draws"): 0, ("search", "final_train_distinct"): 1,
    # declared since (issue 51): dataset cluttered_digits, which runs before them did not use
    **{("data", k): v for k, v in (("clutter_digit_size", 8), ("clutter_fragments", 2),
                                   ("clutter_fragment_size", 4), ("clutter_per_source", 3),
                                   ("clutter_test_per_source", 4), ("clutter_seed", 0))},
    # declared since: a search planned to a budget, which runs before it did not have
    ("search", "budget"): None, ("search", "fit_stop_ci"): 0.0,
    ("search", "fit_panel"): 0}
CLUTTER_ADDED = {k: v for k, v in OLD_SEARCH_ADDED.items() if k[1].startswith("clutter_")}
OLD_RETRAIN_RESUMABLE = {
    ("run", "dir"), ("run", "progress"), ("run", "tensorboard"),
    ("run", "checkpoint_every_steps"), ("retrain", "device"),
    ("retrain", "measure_latency"), ("retrain", "compile"), ("retrain", "channels_last"),
    ("data", "workers"), ("data", "root"), ("data", "eval_batch_size"),
    # declared since (issue 51): the training's thread count
    ("retrain", "threads")}
OLD_RETRAIN_ADDED = {("retrain", "precision"): "float32", ("retrain", "channels_last"): False,
                     ("run", "ddp_sync_every"): 1, ("data", "placement"): "auto",
                     ("retrain", "threads"): None, **CLUTTER_ADDED}


@pytest.mark.parametrize("trainer,resumable,added", [
    (SearchTrainer, OLD_SEARCH_RESUMABLE, OLD_SEARCH_ADDED),
    (ChildTrainer, OLD_RETRAIN_RESUMABLE, OLD_RETRAIN_ADDED)])
def test_resume_policy_derived_equals_the_old_explicit_sets(trainer, resumable, added):
    p = trainer.POLICY
    # only the compared sections' keys ever mattered (the retrain policy's run.* were unused)
    assert p.resumable == {k for k in resumable if k[0] in p.compared}
    assert p.added == added
    assert not set(p.also_kept) & p.resumable


def test_resume_check_follows_the_declarations(tmp_path):
    cfg = config_from_dict(digits_run_config(), "t.yaml")
    saved, where = cfg.resolved(), tmp_path / "checkpoint.pt"
    policy = SearchTrainer.POLICY
    now = copy.deepcopy(saved)
    now["run"]["dir"], now["search"]["fit_measure"], now["data"]["workers"] = "elsewhere", "off", 2
    policy.check(saved, now, where)  # resumable keys
    old = copy.deepcopy(saved)
    del old["search"]["mode"], old["data"]["placement"]  # a checkpoint older than these keys
    policy.check(old, saved, where)
    moved = copy.deepcopy(saved)
    moved["search"]["mode"] = "reinforce"
    with pytest.raises(FbnasError, match="search.mode was 'full' in this run, now 'reinforce'"):
        policy.check(old, moved, where)
    moved = copy.deepcopy(saved)
    moved["search"]["tau0"] = 1.0
    with pytest.raises(FbnasError, match="search.tau0 was"):
        policy.check(saved, moved, where)


def test_a_new_setting_declared_resumable_or_added_reaches_the_policy(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class Section:
        kept: int = setting(1, "int")
        moved: str = setting("here", "str", resumable=True)
        new: int = setting(4, "int", added=3)

    monkeypatch.setattr(config_mod, "section_types", lambda: {"extra": Section})
    p = ResumePolicy(compared=("extra",))
    assert p.resumable == {("extra", "moved")} and p.added == {("extra", "new"): 3}
    saved, where = {"extra": {"kept": 1, "moved": "here"}}, Path("ckpt")
    p.check(saved, {"extra": {"kept": 1, "moved": "there", "new": 3}}, where)
    with pytest.raises(FbnasError, match="extra.new was 3"):
        p.check(saved, {"extra": {"kept": 1, "moved": "here", "new": 4}}, where)


# ---- 2. the CLI's choices ----------------------------------------------------------------------
def _choices(add, flag: str) -> tuple:
    parser = argparse.ArgumentParser()
    add(parser)
    act = next(a for a in parser._actions if flag in a.option_strings)
    return tuple(act.choices)


def test_cli_choices_come_from_the_declarations(monkeypatch):
    sub = argparse.ArgumentParser().add_subparsers()
    cli_eval.add_parser(sub)
    p = sub.choices["eval"]
    dev = next(a for a in p._actions if "--device" in a.option_strings)
    assert tuple(dev.choices) == setting_choices(RetrainConfig, "device") == DEVICES
    assert dev.default == RetrainConfig().device
    assert setting_choices(SearchConfig, "fit_measure") == ("auto", "on", "off")
    assert _choices(timer_args, "--clock") == clock_choices() == CpuTimer.clocks

    for name in TIMERS:  # what a registration declares is what its class reads
        assert TIMERS.attr(name, "clocks", ()) == TIMERS.get(name).clocks, name
    for name in FORMATS:
        assert FORMATS.attr(name, "quantizations") == FORMATS.get(name).quantizations, name

    class CycleTimer(CpuTimer):  # a backend that reads one more clock
        clocks = (*CpuTimer.clocks, "cycles")

    TIMERS.register("cycles_test", CycleTimer, clocks=CycleTimer.clocks)
    try:
        assert _choices(timer_args, "--clock") == ("thread", "wall", "cycles")
    finally:
        TIMERS.unregister("cycles_test")


# ---- 3. the loss keys --------------------------------------------------------------------------
@pytest.mark.parametrize("kind,expected", [
    ("fbnet", {"alpha": 0.2, "beta": 0.6, "label_smoothing": 0.0}),
    ("normalized", {"beta": 0.6, "target": 900.0, "label_smoothing": 0.0}),
    ("additive", {"target": 900.0, "lambda": 0.1, "label_smoothing": 0.0}),
    ("abs_target", {"target": 900.0, "lambda": 0.1, "label_smoothing": 0.0}),
    ("target", {"target": 900.0, "lambda": 1.0, "label_smoothing": 0.0}),
    ("hinge", {"target": 900.0, "lambda": 1.0, "label_smoothing": 0.0}),
    ("ce", {"label_smoothing": 0.0})])
def test_loss_defaults_are_the_old_ones(kind, expected):
    d = {"kind": kind, **({"target": 900} if "target" in expected else {})}
    c = LossConfig.from_dict(d)
    assert c.to_dict() == {"kind": kind, **expected}
    assert list(c.to_dict())[1:] == list(LOSSES.get(kind).keys)
    assert LossConfig.from_dict(c.to_dict()) == c
    with pytest.raises(FbnasError, match="loss: missing key 'target'") if "target" in expected \
            else _nothing():
        LossConfig.from_dict({"kind": kind})


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_loss_key_is_one_setting_line():
    @dataclasses.dataclass(frozen=True)
    class WithGamma(LossConfig):
        gamma: float = setting(2.0, "float", min=0.0)  # the one line a new key takes

    @LOSSES.register("gamma_test")
    class GammaLoss(CostLoss):
        keys = ("gamma", "label_smoothing")

        @classmethod
        def from_config(cls, c, bounds):
            loss = cls(c.label_smoothing)
            loss.gamma = c.gamma
            return loss

    try:
        c = WithGamma.from_dict({"kind": "gamma_test", "gamma": 3})
        assert c.gamma == 3.0 and c.build().gamma == 3.0
        assert c.to_dict() == {"kind": "gamma_test", "gamma": 3.0, "label_smoothing": 0.0}
        assert WithGamma.from_dict({"kind": "gamma_test"}).build().gamma == 2.0
        with pytest.raises(FbnasError, match=r"loss.gamma: must be >= 0.0"):
            WithGamma.from_dict({"kind": "gamma_test", "gamma": -1})
        with pytest.raises(FbnasError, match="unknown key 'gamma'"):  # not a key of fbnet
            WithGamma.from_dict({"kind": "fbnet", "gamma": 1})
        GammaLoss.defaults = {"gamma": 5.0}  # a kind's own default
        assert WithGamma.from_dict({"kind": "gamma_test"}).gamma == 5.0
    finally:
        LOSSES.unregister("gamma_test")
    # every key a registered loss reads is a setting of LossConfig
    for _, cls in LOSSES.items():
        assert set(cls.keys) <= set(settings_of(LossConfig)), cls


# ---- 4. measured cost kinds --------------------------------------------------------------------
@pytest.fixture
def energy():
    """A second measured kind, registered for one test."""
    COST_KINDS.register("energy_test", CostKind("mJ", "mJ", measured=True))
    try:
        yield "energy_test"
    finally:
        COST_KINDS.unregister("energy_test")


def test_a_measured_kind_is_one_registration(energy):
    assert is_measured(energy) and is_measured("latency")
    assert not is_measured("flops") and not is_measured("params")
    # the config: a time target needs a measured cost
    d = digits_run_config()
    d["loss"] = {"kind": "target", "target": "1.2ms"}
    for cost, ok in ((energy, True), ("latency", True), ("flops", False)):
        d["latency"] = {"cost": cost}
        if ok:
            config_from_dict(copy.deepcopy(d), "t.yaml")
        else:
            with pytest.raises(FbnasError, match="is a time, but latency.cost is flops"):
                config_from_dict(copy.deepcopy(d), "t.yaml")
    # the table file: a measured table says what it was measured for
    with pytest.raises(FbnasError, match="batch"):
        _check_meta({}, energy, "t.json")
    _check_meta({}, "flops", "t.json")
    meta = {"batch": 1, "dtype": "float32", "backend": "cpu"}
    t = LatencyTable(energy, meta)
    with pytest.raises(FbnasError, match="batch"):
        t.check_run(batch=4)
    LatencyTable("flops", {}).check_run(batch=4)
    assert "--device cpu" in t.build_command() and "--cost" not in t.build_command()
    cfg = config_from_dict(digits_run_config(), "t.yaml")
    no = "the run has no measured latency table"
    assert cannot_time_here(cfg, LatencyTable("flops", {})) == no
    assert cannot_time_here(cfg, t) != no


def test_a_cost_kind_is_measured_or_counted():
    with pytest.raises(ValueError, match="either measured or counted"):
        CostKind("x", "x")
    with pytest.raises(ValueError, match="either measured or counted"):
        CostKind("x", "x", lambda m, chw: 1.0, measured=True)
    with pytest.raises(ValueError, match="not counted"):
        COST_KINDS.get("latency").count(torch.nn.Identity(), (1, 2, 2))


def test_a_counted_kind_names_its_counter_by_where_it_lives():
    """The shipped counters are declared as "module:function" (importing the kinds imports no
    torch), imported on first count, and count as the functions they name."""
    from fbnas.arch import count_params, module_flops

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    for name, fn in (("flops", module_flops), ("params", count_params)):
        kind = COST_KINDS.get(name)
        assert kind.counted and isinstance(kind.counter, str)
        assert kind.counter == f"{fn.__module__}:{fn.__name__}"
        assert kind.count(net, (3, 8, 8)) == float(fn(net, (3, 8, 8)))
    assert COST_KINDS.get("params").count(net, (3, 8, 8)) == 3 * 4 * 9 + 4
    assert COST_KINDS.get("flops").count(net, (3, 8, 8)) == 2 * 3 * 9 * 4 * 6 * 6


def test_no_module_tests_the_cost_kind_by_name():
    root = Path(__file__).resolve().parents[1] / "fbnas"
    bad = [f"{p.relative_to(root)}:{i}" for p in sorted(root.rglob("*.py"))
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"""cost\s*[!=]=\s*["']latency["']""", line)]
    assert not bad, bad


# ---- 5. settings a search mode ignores ---------------------------------------------------------
def test_modes_ignore_only_settings_that_exist():
    names = set(settings_of(SearchConfig))
    for name in MODES:
        m = get_mode(name)
        assert set(m.ignores) <= set(m.weight_ignores) <= names, name
        assert not m.ignores or m.why, name
    assert ignored_settings("full") == ()
    assert ignored_settings("reinforce") == (*TAU, "hard")
    assert ignored_settings("reinforce", "single_path") == (*TAU, "hard")
    assert ignored_settings("single_path", "reinforce") == ("hard",)
    assert ignored_settings("reinforce", "full") == ()


@pytest.mark.parametrize("mode,weights", [("reinforce", False), ("two_path", False),
                                          ("single_path", True)])
def test_what_a_mode_ignores_changes_nothing_it_draws(mode, weights):
    """A declared-ignored setting (τ, hard) changes none of the mode's draws (as the weight
    sampler: none of the paths it trains)."""
    theta = [torch.randn(n) for n in (3, 5, 4, 1, 9)]
    m = get_mode(mode)
    draws = []
    for tau, hard in ((5.0, False), (0.1, True), (1.7, False)):
        torch.manual_seed(1)
        draws.append([m.sample(theta, tau, hard) for _ in range(50)])
    for other in draws[1:]:
        for a, b in zip(draws[0], other, strict=True):
            assert a.active == b.active
            if not weights:
                assert all(torch.equal(x, y) for x, y in zip(a.m, b.m, strict=True))
                assert all(torch.equal(x, y) for x, y in zip(a.cost_m, b.cost_m, strict=True))
            else:  # the weight steps use the values of m, one-hot
                assert all(torch.equal(x.detach(), y.detach()) for x, y in zip(
                    a.m, b.m, strict=True))


def _started(tmp_path, name: str, **search) -> str:
    d = digits_run_config(search=search)
    d["run"]["dir"] = str(tmp_path / name)
    t = SearchTrainer(config_from_dict(copy.deepcopy(d), "t.yaml"), tmp_path / name)
    close_logger(t.log)
    return (tmp_path / name / "train.log").read_text()


def test_a_run_says_once_which_of_its_settings_the_mode_ignores(tmp_path):
    log = _started(tmp_path, "a", mode="reinforce", tau0=2.0, tau_decay=0.1)
    notes = [ln[ln.index("note: "):] for ln in log.splitlines() if "note: " in ln]
    assert notes == ["note: search.mode reinforce ignores search.tau0, search.tau_decay "
                     "(reinforce draws single paths by Gumbel-max at temperature 1)"]
    assert "note:" not in _started(tmp_path, "b", mode="reinforce")  # defaults are not named
    assert "note:" not in _started(tmp_path, "c", mode="full", tau0=2.0, tau_decay=0.1)
    assert "note:" not in _started(tmp_path, "d", mode="reinforce", weight_sampling="full",
                                   tau0=2.0)
    assert ignored_note("reinforce", "single_path", {"tau0", "seed"}) == (
        "note: search.mode reinforce with weight_sampling single_path ignores search.tau0 "
        "(reinforce draws single paths by Gumbel-max at temperature 1; single_path weight "
        "steps train only the argmax path, the same at every τ)")


def test_settings_the_run_ignores_leave_theta_and_history_as_they_were(tmp_path):
    """The quickstart's search (reinforce, single_path weight steps, a uniform path), with and
    without the settings it ignores: the same θ and history (but the schedule's τ, which it
    records and never reads)."""
    base = {"mode": "reinforce", "weights": "shared", "weight_sampling": "single_path",
            "uniform_paths": 1, "epochs": 3}
    out = []
    for name, extra in (("with", {"tau0": 1.5, "tau_decay": 0.7, "tau_min": 0.2, "hard": True,
                                  "tau_schedule": "linear"}), ("without", {})):
        d = digits_run_config(search={**base, **extra})
        d["run"]["dir"] = str(tmp_path / name)
        t = SearchTrainer(config_from_dict(d, "t.yaml"), tmp_path / name)
        try:
            t.train()
        finally:
            close_logger(t.log)
        hist = json.loads((tmp_path / name / "history.json").read_text())
        theta = json.loads((tmp_path / name / "theta.json").read_text())
        out.append(([{k: v for k, v in r.items() if k not in ("tau", "seconds")}
                     for r in hist], theta))
    assert out[0] == out[1]


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "configs")
                                        .glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_set_nothing_their_mode_ignores(path):
    cfg = load_config(path)
    given = {k for sec, k in cfg.given if sec == "search"}
    assert ignored_note(cfg.search.mode, cfg.search.weight_sampling, given) is None


RECOMMENDED = {"mode": "reinforce", "weights": "shared", "weight_sampling": "single_path",
               "uniform_paths": 1}


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "configs")
                                        .glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_do_not_repeat_the_recommended_search(path):
    """The recommended search is SearchConfig's defaults: a shipped config that uses it says
    nothing, and one that does not (FBNet's own search) gives every key it changes."""
    cfg = load_config(path)
    assert {k: getattr(SearchConfig(), k) for k in RECOMMENDED} == RECOMMENDED
    given = {k for sec, k in cfg.given if sec == "search"}
    repeated = {k for k in given & set(RECOMMENDED) if getattr(cfg.search, k) == RECOMMENDED[k]}
    assert repeated == set()
    changed = {k for k in RECOMMENDED if getattr(cfg.search, k) != RECOMMENDED[k]}
    assert changed in (set(), set(RECOMMENDED)), changed


def test_shared_numbers_are_one_declaration():
    """±3%, 30 timing rounds and 12 probes: each one constant (fbnas.settings) that the
    settings, the library's defaults and the command line's flags all read."""
    import inspect

    from fbnas._cli import build_parser
    from fbnas.bench.sample import SampleSpec
    from fbnas.bench.score import score_run
    from fbnas.fit.onto_target import fit_to_target
    from fbnas.latency.build import build_table
    from fbnas.latency.measure import Protocol
    from fbnas.settings import CONTEXT_PROBES, LATENCY_TOLERANCE, TIMING_ROUNDS

    def default(fn, name):
        return inspect.signature(fn).parameters[name].default

    assert SearchConfig().fit_tolerance == default(fit_to_target, "tol") == \
        default(score_run, "near") == SampleSpec.parse(2, None, None, None).band_width == \
        LATENCY_TOLERANCE
    assert Protocol().rounds == TIMING_ROUNDS
    assert default(build_table, "context_probes") == CONTEXT_PROBES
    flags = {}
    parser = build_parser()
    for path in (["bench", "score"], ["bench", "query"], ["bench", "build"],
                 ["latency", "build"], ["latency", "bundle"]):
        p = parser
        for name in path:
            p = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)
                     ).choices[name]
        for a in p._actions:
            if a.dest in ("near", "rounds", "probes"):
                flags.setdefault(a.dest, set()).add(a.default)
    assert flags["near"] == {LATENCY_TOLERANCE}
    # (latency build's --rounds is None: the table's protocol, else Protocol's)
    assert flags["rounds"] - {None} == {TIMING_ROUNDS} and flags["probes"] == {CONTEXT_PROBES}


def test_every_declared_file_field_has_a_kind_of_the_one_table():
    """The architecture meta's and results.json's fields name kinds of fbnas.io.VALUE_KINDS,
    and each kind's test accepts what it names and refuses another kind's value."""
    from fbnas.arch import META_FIELDS, check_meta_values
    from fbnas.io import VALUE_KINDS
    from fbnas.runs.results import FIELDS, PROGRAM_FIELDS

    used = ({k for k, _ in META_FIELDS.values()} | set(FIELDS.values())
            | set(PROGRAM_FIELDS.values()))
    assert used <= set(VALUE_KINDS), sorted(used - set(VALUE_KINDS))
    samples = {"str": "a", "int": 3, "num": 2.5, "bool": True, "list": [1], "map": {"a": 1}}
    for kind in samples:
        ok, _ = VALUE_KINDS[kind]
        accepted = {k for k, v in samples.items() if ok(v)}
        assert accepted == ({kind, "int"} if kind == "num" else {kind}), (kind, accepted)
    assert not VALUE_KINDS["num"][0](True) and not VALUE_KINDS["int"][0](False)
    with pytest.raises(FbnasError, match="x.yaml: meta.epoch: expected an integer, got 'two'"):
        check_meta_values({"epoch": "two"}, "x.yaml")
