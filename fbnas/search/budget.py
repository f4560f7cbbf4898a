"""`search.budget: R`: a search planned to cost R trainings of the config's own child recipe.

The unit is one training of a network of the target's band with the `retrain:` section (what
a user pays to train the network the search returns, and what random search pays per network
it tries). At the start of `fbnas train` the trainer times a few steps of each kind
(`StepCosts`: a band network's child steps and evaluation batches, the supernet's weight and θ
steps and one path's validation, one end-to-end timing as the measured fit times networks) and
`plan` turns them into the settings that spend R trainings:

    setup          what the run spent before the probe (data, supernet), known when it plans
    probe          the timing itself (charged to the budget)
    supernet       search.epochs, a quarter of them weights only (search.warmup_epochs; TuNAS
                   keeps the policy still for its first quarter)
    scoring        the final pick's paths on the supernet: search.final_candidates from θ plus
                   search.final_band_draws drawn across the band, at most a tenth of the budget
    final train    search.final_train networks trained from scratch (none unless given)
    measured fit   the expected end-to-end timings of the measured fit

Settings the config gives explicitly (`search.epochs`, `search.warmup_epochs`,
`search.final_train`, `search.final_band_draws`, `search.final_candidates`) are kept and
reported as overrides; the supernet takes what they leave. The plan is printed at the start,
and what the run spent (seconds per stage, and R) is recorded in its architecture file's meta
(`search_cost`) and shown by `fbnas runs` for the networks retrained from it.

This module is arithmetic only: the trainer measures, this plans and accounts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from fbnas.errors import FbnasError

# the settings a budget plans, in the order the plan names them
PLANNED = ("epochs", "warmup_epochs", "final_candidates", "final_band_draws", "final_train",
           "fit_rounds")
WARMUP_SHARE = 0.25  # of the supernet epochs, weights only
SCORING_SHARE = 0.10  # of the budget, at most, for the final pick's path scores
BAND_DRAWS = 200  # the most band draws a budget plans (search.final_band_draws' shipped value)
# the measured fit's networks at a budget (search.fit_rounds), and the end-to-end timings it is
# planned to take: most fits time one or two networks, one of them twice or three times, and
# the returned one is timed once more (docs/search.md, "A search at a budget")
FIT_ROUNDS = 2
FIT_TIMINGS = 4.0
STAGES = ("setup", "probe", "supernet", "scoring", "final_train", "measured_fit")


@dataclass(frozen=True)
class StepCosts:
    """Seconds of one unit of each kind of work, as the probe timed them here, and how many
    units one epoch or one training holds."""

    child_setup: float  # building a child trainer (network, data, optimizer)
    child_step: float  # one training step of a band network with the retrain recipe
    child_eval: float  # one evaluation batch of it
    child_steps: int  # training steps in one training (epochs × steps per epoch)
    child_evals: int  # evaluation batches in one training (validation each epoch + test)
    w_step: float  # one supernet weight step after the warm-up (as search.mode samples)
    warm_w_step: float  # one weight step in the warm-up
    theta_step: float  # one θ step
    w_steps: int  # weight steps per epoch
    theta_steps: int  # θ steps per epoch
    path_score: float  # one path's validation on the supernet (BN re-estimated)
    timing: float  # one end-to-end timing of a band network (0: the fit does not time)
    probe: float = 0.0  # seconds the probe took

    @property
    def training(self) -> float:
        """Seconds of one training with the retrain recipe: the unit of the budget."""
        return (self.child_setup + self.child_steps * self.child_step
                + self.child_evals * self.child_eval)

    def epoch(self, theta: bool) -> float:
        """Seconds of one supernet epoch: its weight steps, θ steps after the warm-up, and
        the epoch's validation of the argmax path."""
        if theta:
            return self.w_steps * self.w_step + self.theta_steps * self.theta_step \
                + self.path_score
        return self.w_steps * self.warm_w_step + self.path_score

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "training": self.training}


@dataclass
class Plan:
    """The settings a budget chose, the seconds each stage is expected to take, and the
    settings the config gave (kept, reported as overrides)."""

    budget: float  # R, in trainings
    training: float  # seconds of one training (the unit)
    settings: dict[str, int]
    stages: dict[str, float]  # predicted seconds per stage (STAGES)
    overrides: dict[str, int] = field(default_factory=dict)
    measured_fit: bool = True
    timing: float = 0.0  # seconds of one end-to-end timing
    scored: int = 0  # paths the final pick is planned to score
    planned: dict[str, int] = field(default_factory=dict)  # what the budget alone chose

    @property
    def seconds(self) -> float:
        return sum(self.stages.values())

    @property
    def trainings(self) -> float:
        return self.seconds / self.training

    def lines(self) -> list[str]:
        """The plan as the trainer prints it: one line per stage, in seconds and trainings."""
        s = self.settings
        what = {
            "setup": "data, supernet and optimizers built",
            "probe": "timing a few steps of each kind",
            "supernet": f"{s['epochs']} epochs, {s['warmup_epochs']} of them weights only",
            "scoring": f"{self.scored} paths scored (of θ's {s['final_candidates']} most "
                       f"probable and {s['final_band_draws']} drawn across the band)",
            "final_train": f"{s['final_train']} networks trained from scratch",
            "measured_fit": (f"about {self.stages['measured_fit'] / max(self.timing, 1e-9):.0f} "
                             f"end-to-end timings, at most {s['fit_rounds']} networks"
                             if self.measured_fit
                             else "none (the fit does not time networks here)"),
        }
        out = [f"budget: {self.budget:g} trainings of the retrain recipe (one training here: "
               f"{self.training:.1f} s) = {self.budget * self.training:.1f} s; planned "
               f"{self.seconds:.1f} s = {self.trainings:.2f} trainings"]
        out += [f"  {k.replace('_', ' '):13s}{self.stages[k]:8.1f} s "
                f"{self.stages[k] / self.training:5.2f}  {what[k]}" for k in STAGES]
        if self.overrides:
            out.append("  overrides (given in the config, kept): " + ", ".join(
                f"search.{k}: {v} (the budget would plan {self.planned.get(k, '-')})"
                for k, v in self.overrides.items()))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "training_s": self.training, "settings": self.settings,
                "stages_s": self.stages, "overrides": self.overrides, "planned": self.planned,
                "measured_fit": self.measured_fit}


def plan(budget: float, costs: StepCosts, given: dict[str, int] | None = None,
         measured_fit: bool = True, setup: float = 0.0, pick: tuple[int, int] | None = None,
         where: str = "search.budget") -> Plan:
    """The settings that spend `budget` trainings (module docstring), from `costs`; `given`:
    settings the config set (kept as they are); `setup`: seconds already spent before the
    probe; `pick`: how many of θ's paths and of the band's draws the final pick would score
    at most here (the band may hold fewer networks; (0, 0): it scores none, e.g. without a
    target or a validation split), None: as many as planned. One line, naming `where`, where
    the budget cannot hold the search's least (two supernet epochs, one weights only)."""
    given = dict(given or {})
    unit = costs.training
    if not (unit > 0 and math.isfinite(unit)):
        raise FbnasError(f"{where}: one training timed at {unit!r} s; cannot plan")
    total = budget * unit
    rounds = given.get("fit_rounds", FIT_ROUNDS)
    timing = min(FIT_TIMINGS, 2.0 * rounds) * costs.timing if measured_fit else 0.0
    k = given.get("final_train", 0)
    train_s = k * unit
    cands = given.get("final_candidates", 8)
    draws = given.get("final_band_draws")
    if draws is None:
        room = max(0.0, SCORING_SHARE * total / max(costs.path_score, 1e-9) - cands)
        draws = int(min(BAND_DRAWS, room))
    most_cands, most_draws = pick if pick is not None else (cands, draws)
    scored = min(cands, most_cands) + min(draws, most_draws)
    scoring = scored * costs.path_score
    if "epochs" in given and "warmup_epochs" in given \
            and given["warmup_epochs"] >= given["epochs"]:
        raise FbnasError(f"search.warmup_epochs: {given['warmup_epochs']} leaves no θ epochs "
                         f"(search.epochs is {given['epochs']})")
    left = total - setup - costs.probe - timing - train_s - scoring
    epochs, warm = _epochs(left, costs, given)
    least_epochs = given.get("warmup_epochs", 1) * costs.epoch(False) + costs.epoch(True)
    least = setup + costs.probe + timing + train_s + scoring + least_epochs
    if "epochs" not in given and left < least_epochs:
        raise FbnasError(
            f"{where}: {budget:g} trainings ({total:.1f} s here) cannot hold this search: it "
            f"needs at least {least / unit:.2f} (the supernet's least epochs, the final pick's "
            f"scores{', the measured fit' if measured_fit else ''}"
            f"{', search.final_train' if k else ''}); raise the budget")
    settings = {"epochs": epochs, "warmup_epochs": warm, "final_candidates": cands,
                "final_band_draws": draws, "final_train": k,
                "fit_rounds": given.get("fit_rounds", FIT_ROUNDS)}
    budget_alone = _alone(budget, costs, measured_fit, setup, pick) if given else settings
    stages = {"setup": setup, "probe": costs.probe,
              "supernet": warm * costs.epoch(False) + (epochs - warm) * costs.epoch(True),
              "scoring": scoring, "final_train": train_s, "measured_fit": timing}
    return Plan(budget, unit, settings, stages,
                overrides={k: v for k, v in given.items() if k in PLANNED},
                measured_fit=measured_fit, timing=costs.timing, scored=scored,
                planned=budget_alone)


def _alone(budget: float, costs: StepCosts, measured_fit: bool, setup: float,
           pick: tuple[int, int] | None) -> dict[str, int]:
    """What the budget plans with nothing given (to report beside an override)."""
    try:
        return plan(budget, costs, None, measured_fit, setup, pick).settings
    except FbnasError:
        return {}


def _epochs(left: float, costs: StepCosts, given: dict[str, int]) -> tuple[int, int]:
    """(epochs, warm-up epochs) whose supernet seconds fit in `left`, a quarter of them
    weights only; given ones kept."""
    if "epochs" in given:
        e = given["epochs"]
        return e, given.get("warmup_epochs", min(e - 1, max(1, round(WARMUP_SHARE * e))))
    if "warmup_epochs" in given:
        w = given["warmup_epochs"]
        rest = left - w * costs.epoch(False)
        return w + max(1, int(rest // costs.epoch(True))), w
    e = 2
    while True:  # the most epochs whose cost fits (a quarter warm-up, at least one each)
        n = e + 1
        w = min(n - 1, max(1, round(WARMUP_SHARE * n)))
        if w * costs.epoch(False) + (n - w) * costs.epoch(True) > left:
            break
        e = n
    return e, min(e - 1, max(1, round(WARMUP_SHARE * e)))


def replan(plan_d: dict[str, Any], spent_s: float, done: int, warm: int, warm_epoch: float,
           theta_epoch: float) -> tuple[int, int]:
    """(epochs, warm-up epochs) re-planned on the supernet's real epochs: after `done` epochs
    and `spent_s` seconds of the run, with the later stages as planned (`plan_d`:
    `Plan.to_dict()`), the most epochs whose remaining ones fit the budget at `warm_epoch` /
    `theta_epoch` seconds each. The warm-up stays `warm` once `done` has reached it (else a
    quarter of the epochs again), and never drops below the epochs done; an epoch count the
    config gave stays."""
    given = plan_d.get("overrides", {})
    if "epochs" in given:
        return plan_d["settings"]["epochs"], plan_d["settings"]["warmup_epochs"]
    later = sum(plan_d["stages_s"].get(k, 0.0) for k in ("scoring", "final_train",
                                                           "measured_fit"))
    left = plan_d["budget"] * plan_d["training_s"] - spent_s - later
    fixed = "warmup_epochs" in given or done >= warm

    def warm_of(n: int) -> int:  # the epochs done so far were all weights only
        return warm if fixed else max(done, min(n - 1, max(1, round(WARMUP_SHARE * n))))

    def cost(n: int) -> float:  # the seconds of the epochs still to run
        w = warm_of(n)
        return max(0, w - done) * warm_epoch + (n - max(w, done)) * theta_epoch

    n = max(done, warm + 1 if fixed else done + 1)  # at least one θ epoch
    while cost(n + 1) <= left:
        n += 1
    return n, warm_of(n)


def spent(stages: dict[str, float], training: float, budget: float | None) -> dict[str, Any]:
    """What a run spent (the arch file's meta `search_cost`): seconds per stage and in all,
    and R (the seconds over one training) where one training was timed."""
    total = sum(stages.values())
    out: dict[str, Any] = {"seconds": round(total, 2),
                           "stages_s": {k: round(v, 2) for k, v in stages.items()}}
    if training > 0:
        out.update(trainings=round(total / training, 3), training_s=round(training, 3))
    if budget is not None:
        out["budget"] = budget
    return out


def describe_spent(cost: dict[str, Any]) -> str:
    """'52.3 s = 2.04 trainings (budget 2; supernet 30.1 s, ...)' from `spent`'s record."""
    r = f" = {cost['trainings']:.2f} trainings" if "trainings" in cost else ""
    b = f"budget {cost['budget']:g}; " if cost.get("budget") is not None else ""
    parts = ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in cost["stages_s"].items()
                      if v)
    return f"{cost['seconds']:.1f} s{r} ({b}{parts})"


def given_settings(cfg_search: Any, given: Iterable[tuple[str, str]]) -> dict[str, int]:
    """The planned settings a config gave explicitly (section `search`), with their values."""
    keys = {k for s, k in given if s == "search"}
    return {k: getattr(cfg_search, k) for k in PLANNED if k in keys}
