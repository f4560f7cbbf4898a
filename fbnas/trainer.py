"""SearchTrainer: the FBNet alternating search, the whole recipe in this one file (its τ
schedule and warm-up paths, setup, epochs, every step, validation, results: over 450 lines so
that the search reads top to bottom in one place, as a torchtune recipe does).

Per epoch: weight steps (SGD + momentum, cosine schedule) on the weight split, then — after
`warmup_epochs` of weights only — θ steps (Adam) on the disjoint θ split. Weight steps use
the cross-entropy of the paths the search mode samples (fbnas.search.modes; θ gets no gradient); θ
steps use the cost-aware loss (weights get no gradient). Both go through the one update step
of fbnas.training._step. τ is annealed after warm-up (`TauSchedule`). Validation uses the argmax
architecture, deterministically, on the held-out validation split (never the test split).

Checkpoints are written atomically at the end of every epoch (and every
`run.checkpoint_every_steps` steps if set, and on Ctrl-C), holding the model, both optimizers,
the scheduler, RNG states, the position (epoch, phase, step), the resolved config and the cost
table's fingerprint: `fbnas train --resume RUN_DIR` continues and ends with the same θ as an
uninterrupted run. The loop, signals, run directory and logging are fbnas.training.loop's.

Under `torchrun` (fbnas.training.distributed, docs/distributed.md) each rank trains on its
shard: weight steps run through DistributedDataParallel, θ's gradients are averaged before
each Adam step, the Gumbel noise is the same on every rank (`SharedNoise`), and rank 0 alone
writes the run directory.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import math
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

from fbnas.arch import Architecture, arch_from_indices, arch_indices
from fbnas.blocks.shared import UsedSlices
from fbnas.config import Config, ResumePolicy, SearchConfig
from fbnas.data import build_search_data
from fbnas.errors import FbnasError
from fbnas.fit.onto_target import range_warning
from fbnas.fit.select import Selector, cannot_time_here
from fbnas.io import write_json_atomic
from fbnas.latency.end_to_end import timing_seconds
from fbnas.latency.kinds import is_measured
from fbnas.latency.resolve import CostSource, shared_costs
from fbnas.retrain import probe_training, train_child
from fbnas.search import budget as budgets
from fbnas.search._figures import epoch_line, tb_scalars
from fbnas.search.modes import (
    PathSample,
    get_mode,
    ignored_note,
    path_log_prob,
    refuse_as_theta_mode,
    weight_sampler,
)
from fbnas.supernet import Supernet
from fbnas.training._guard import fused_optimizer, keep_fused, non_finite_what
from fbnas.training._rng import rng_state, seed_everything, set_rng_state
from fbnas.training._step import StepFigures, Update, metric
from fbnas.training.distributed import PeriodicAverager, SharedNoise, rank_seed, wrap_ddp
from fbnas.training.evaluate import validate_weights
from fbnas.training.loop import EpochRunner, Interrupted, NonFiniteLoss

PROBE_NETWORKS = 3  # band networks whose child steps search.budget's probe times


# ---- what the search does when: τ per epoch, the warm-up's paths ------------------------------
@dataclass(frozen=True)
class TauSchedule:
    """The Gumbel-softmax temperature per (0-based) epoch: τ0 during the weights-only warm-up,
    then `exp`: max(τ_min, τ0·exp(−decay·k)), or `linear`: τ0 → τ_min over the θ epochs, with
    k the epochs since warm-up."""

    tau0: float
    kind: str
    decay: float
    tau_min: float
    warmup: int
    epochs: int

    @classmethod
    def from_config(cls, s: SearchConfig) -> TauSchedule:
        return cls(s.tau0, s.tau_schedule, s.tau_decay, s.tau_min, s.warmup_epochs, s.epochs)

    def __call__(self, epoch: int) -> float:
        k = max(0, epoch - self.warmup)
        if self.kind == "exp":
            return max(self.tau_min, self.tau0 * math.exp(-self.decay * k))
        n = max(1, self.epochs - self.warmup - 1)
        return self.tau0 + (self.tau_min - self.tau0) * min(1.0, k / n)


def warmup_paths(how: str, sizes: list[int]) -> list[list[list[int]]] | None:
    """The single paths (per layer, the one active candidate) a warm-up weight step trains, for
    layers with `sizes` candidates; None for `mode` (the search mode's own sampling).
    `uniform`: one path drawn uniformly (SPOS). `fair`: K = max(sizes) paths in which each
    layer's candidates appear once each, in shuffled order (FairNAS strict fairness)."""
    if how == "mode":
        return None
    if how == "uniform":
        return [[[int(torch.randint(n, (1,)))] for n in sizes]]
    perms = [torch.randperm(n).tolist() for n in sizes]
    return [[[p[k % len(p)]] for p in perms] for k in range(max(sizes))]


class SearchTrainer(EpochRunner):
    KIND, SECTION, NEW_RUN_HINT = "search", "search", "run.dir"
    RESUME_CMD = "fbnas train --resume"
    # what a resumed run may change, or old checkpoints lack: the settings' declarations
    POLICY = ResumePolicy(compared=("data", "latency", "loss", "search", "run"))

    def __init__(self, cfg: Config, run_dir: str | Path, costs: CostSource | None = None,
                 log=None, resume: bool = False, dist=None,
                 clock: Callable[[], float] = time.perf_counter):
        # what the search's cost is read by (search.budget's probe and its accounting)
        self.clock = clock
        super().__init__(cfg, run_dir, log, dist, resume=resume, costs=costs)

    def _setup(self, resume: bool, costs: CostSource | None) -> None:
        cfg = self.cfg
        s = cfg.search
        self._init_device(s.device)
        # autocast and layout (training/precision); scaler 0 for the weights, 1 for θ under fp16
        self._init_precision(s.precision, s.channels_last, scalers=2)
        state = self._open_checkpoint(resume)
        if state is not None:
            self._check_resume(state)
        # a θ mode refused as one: where a search would start or go on, not where a finished
        # run is read (it can still be sampled, scored and retrained from)
        if state is None or state["epoch"] < s.epochs:
            refuse_as_theta_mode(s.mode, resuming=state is not None)
        if s.budget is not None and self.dist.distributed:
            raise FbnasError("search.budget is not supported under torchrun yet (its probe "
                             "trains a child on one process); set the epochs instead")
        self.costs = costs or shared_costs(
            cfg.space, cfg.latency, self.dist, self.log.info, self.run_dir, resume,
            progress=cfg.run.progress)
        # the search's cost is counted from here, the latency table loaded (search.budget)
        self._t0 = self._mark = self.clock()
        self.spent: dict[str, float] = dict((state or {}).get("spent") or {})
        self.budget_plan: dict[str, Any] | None = (state or {}).get("budget_plan")
        # seeded after the costs: measuring a table draws random numbers, a cached one does not
        seed_everything(s.seed)
        if state is not None and state["cost_fingerprint"] != self.costs.fingerprint:
            raise FbnasError(f"{self.files.checkpoint}: the run was searched with another "
                             f"cost table (fingerprint {state['cost_fingerprint'][:12]}, now "
                             f"{self.costs.fingerprint[:12]}); resume with the original table")
        self.model = Supernet(cfg.space, self.costs.rows, self.costs.fixed, mode=s.mode,
                              checkpoint_activations=s.checkpoint_activations,
                              weights=s.weights, width_costs=self.costs.widths).to(self.device)
        self.prec.model(self.model)
        if s.compile:
            n = self.model.compile_blocks(s.compile_backend)
            self.log.info(f"search.compile: {n} blocks compiled with {s.compile_backend} (each "
                          "compiles at its first call)")
        bounds = self.model.cost_bounds()
        self.loss = cfg.loss.build(bounds)
        self.loss.check_range(*bounds)
        if (warn := range_warning(self.cfg.loss.target, self.loss, bounds,
                                  self.costs.unit)) is not None:
            self.log.warning(warn)
        self.tau_schedule = TauSchedule.from_config(s)
        # run.nan_check (fbnas.training._guard): deferred needs the fused optimizers, which skip a
        # non-finite step's update on the device
        self._init_guard(s.nan_policy)
        fused = self.guard.deferred
        self.w_opt = fused_optimizer(torch.optim.SGD, self.model.weight_parameters(), fused,
                                     lr=s.w_lr, momentum=s.w_momentum,
                                     weight_decay=s.w_weight_decay,
                                     nesterov=s.w_nesterov and s.w_momentum > 0)
        self.w_sched = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.w_opt, T_max=s.epochs, eta_min=s.w_lr_min)
        self.theta_opt = fused_optimizer(torch.optim.Adam, self.model.arch_parameters(), fused,
                                         lr=s.theta_lr, weight_decay=s.theta_weight_decay)
        self.data = build_search_data(
            cfg.data, input_size=cfg.space.macro.input_size,
            in_channels=cfg.space.macro.in_channels, num_classes=cfg.space.macro.num_classes,
            seed=s.seed, distributed=self.dist.shard, pin_memory=self.device.type == "cuda",
            device=self.device)
        self._open_run_dir()  # every input is valid: now the run directory
        if self.dist.is_main and state is None and self.costs.table is not None:
            self.costs.table.save(self.files.table)
        self.phase = "w"
        self.skipped_steps = 0
        # distributed runs (_setup_distributed): the weight steps' forward through DDP, and
        # Gumbel noise that is the same on every rank
        self._ddp: Any = None
        self.w_forward: Any = self.model
        self.noise: Any = contextlib.nullcontext
        if state is not None:
            self._restore(state)
        else:
            if s.budget is not None:
                self._plan_budget()
            self._write_config()
            if (note := ignored_note(s.mode, s.weight_sampling, {
                    k for sec, k in cfg.given if sec == "search"})) is not None:
                self.log.info(note)
        if self.dist.distributed:
            if s.warmup_sampling != "mode":
                raise FbnasError(f"search.warmup_sampling: {s.warmup_sampling} is not supported "
                                 "under torchrun yet; use mode (the default)")
            self._setup_distributed(fresh=state is None)

    # ---- search.budget (fbnas.search.budget) ------------------------------------------------
    def _plan_budget(self) -> None:
        """Time a few steps of each kind, plan the settings that spend `search.budget`
        trainings, print the plan, and run with them (the schedules rebuilt for the planned
        epochs). Nothing the probe did stays: weights, optimizer states and RNGs are restored."""
        s = self.cfg.search
        setup = self.clock() - self._t0
        t0 = self.clock()
        costs = self._probe_costs()
        costs = dataclasses.replace(costs, probe=self.clock() - t0)
        given = budgets.given_settings(s, self.cfg.given)
        p = budgets.plan(s.budget, costs, given, measured_fit=self._fit_times(), setup=setup,
                         pick=self._pick_sizes(given))
        self._charge("setup", setup)
        self._charge("probe", costs.probe)
        self._mark = self.clock()
        self.budget_plan = {**p.to_dict(), "costs": costs.to_dict()}
        for line in p.lines():
            self.log.info(line)
        self.cfg = dataclasses.replace(self.cfg, search=dataclasses.replace(s, **p.settings))
        s = self.cfg.search
        self.tau_schedule = TauSchedule.from_config(s)
        self.w_sched = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.w_opt, T_max=s.epochs, eta_min=s.w_lr_min)

    def _pick_sizes(self, given: dict[str, int]) -> tuple[int, int]:
        """How many of θ's paths and of the band's draws the final pick can score here at
        most: (0, 0) where it scores none (no target, no fit, `final_pick: theta`, no
        validation split), else what `Selector.candidates` finds in the band at the start."""
        s, target = self.cfg.search, self.loss_target()
        if (target is None or not s.fit_target or s.final_pick != "path"
                or self.data.val_loader is None):
            return 0, 0
        cands = given.get("final_candidates", s.final_candidates)
        draws = given.get("final_band_draws", budgets.BAND_DRAWS)
        probe = dataclasses.replace(self.cfg, search=dataclasses.replace(
            s, final_candidates=cands, final_band_draws=draws))
        found = len(Selector(probe, self.net.theta, self.costs, target).candidates())
        return min(cands, found), max(0, found - cands)

    def _fit_times(self) -> bool:
        """Whether the final fit will time networks end to end here."""
        s = self.cfg.search
        return (self.loss_target() is not None and s.fit_target and s.fit_measure != "off"
                and is_measured(self.cfg.latency.cost)
                and cannot_time_here(self.cfg, self.costs.table) is None)

    def loss_target(self) -> float | None:
        return getattr(self.loss, "target", None)

    def _band_networks(self, n: int = 1) -> list[list[int]]:
        """`n` networks of the target's band (the middle of the space's costs without a
        target): the closest to it of 2,000 drawn, distinct, seeded by search.seed."""
        model = self.costs.model(self.cfg.space)
        lo, hi = self.model.cost_bounds()
        target = self.loss_target() or (lo + hi) / 2
        rng = random.Random(f"fbnas-budget:{self.cfg.search.seed}")
        cands = self.cfg.space.decision_candidates()
        draws = {tuple(rng.randrange(len(c)) for c in cands) for _ in range(2000)}
        return [list(i) for i in sorted(draws, key=lambda i: abs(model.of(list(i)) / target
                                                                  - 1))[:n]]

    def _probe_costs(self, steps: int = 4) -> budgets.StepCosts:
        """Seconds of one step of each kind here (budgets.StepCosts): the supernet's weight
        steps (in the warm-up and after it), θ steps and one validation, a band network's
        child steps and evaluation batches, and one end-to-end timing (estimated from the
        measuring protocol). The supernet, its optimizers and every RNG are put back."""
        saved = (rng_state(), copy.deepcopy(self.model.state_dict()),
                 copy.deepcopy(self.w_opt.state_dict()),
                 copy.deepcopy(self.theta_opt.state_dict()),
                 copy.deepcopy(self.prec.state_dict()))
        epoch, phase, skipped = self.epoch, self.phase, self.skipped_steps
        def clock() -> float:  # the device's queued work done before each reading
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return self.clock()

        def timed(fn, loader) -> float:
            batches = itertools.cycle(list(itertools.islice(self.data.iterate(loader),
                                                            steps + 1)))
            times = []
            for _ in range(steps + 1):
                x, y = next(batches)
                x, y = x.to(self.device), y.to(self.device)
                t = clock()
                fn(x, y)
                times.append(clock() - t)
            return sorted(times[1:])[len(times[1:]) // 2]

        def refuse(terms: list[str], step: int, count: int = 1) -> None:
            raise FbnasError(f"search.budget: a step of the probe was non-finite "
                             f"({non_finite_what(terms)}); check the learning rates, or set "
                             "the epochs instead of a budget")

        self._non_finite = refuse  # a probe step saves nothing and skips nothing
        self._set_guard(self.guard)
        try:
            warm = timed(self.weight_step, self.data.w_loader)
            self.epoch = 10 ** 6  # past any warm-up: the mode's weight steps, and θ steps
            w = timed(self.weight_step, self.data.w_loader)
            th = timed(self.theta_step, self.data.theta_loader)
            nets = self._band_networks(PROBE_NETWORKS)
            idx = nets[0]  # a path of the band: what the pick scores
            t = clock()
            if self.data.val_loader is not None:
                self.score_paths([idx])
            score = clock() - t
        finally:
            del self._non_finite
            self.epoch, self.phase, self.skipped_steps = epoch, phase, skipped
            self.model.load_state_dict(saved[1])
            self.w_opt.load_state_dict(saved[2])
            self.theta_opt.load_state_dict(saved[3])
            self.prec.load_state_dict(saved[4])
            self._init_guard(self.cfg.search.nan_policy)  # its counters as new
        # networks of one band train at different speeds (wide against deep): the median of a
        # few of them, as random search's trainings are summarised by their median
        with tempfile.TemporaryDirectory(prefix="fbnas-probe-") as work:
            got = [probe_training(self.cfg, arch_from_indices(self.cfg.space, i, "probe"), work,
                                  steps=5, clock=clock) for i in nets]  # clock synchronised
        child = {k: statistics.median(g[k] for g in got) for k in got[0]}
        set_rng_state(saved[0])
        timing = 0.0
        if self._fit_times():
            timing = timing_seconds(self.cfg.space, self.costs.table,
                                    float(self.costs.model(self.cfg.space).of(idx)),
                                    stop_ci=self.cfg.search.fit_stop_ci,
                                    panel_size=self.cfg.search.fit_panel)
        return budgets.StepCosts(
            child_setup=child["setup"], child_step=child["step"], child_eval=child["eval"],
            child_steps=int(child["steps"]), child_evals=int(child["evals"]), w_step=w,
            warm_w_step=warm, theta_step=th, w_steps=len(self.data.w_loader),
            theta_steps=len(self.data.theta_loader), path_score=score, timing=timing)

    def _spent_now(self) -> dict[str, float]:
        """Seconds spent per stage so far, the stage in progress included."""
        out = dict(self.spent)
        stage = getattr(self, "_stage", None)
        if stage is not None:
            out[stage[0]] = out.get(stage[0], 0.0) + self.clock() - stage[1]
        return out

    def _charge(self, stage: str, seconds: float) -> None:
        self.spent[stage] = self.spent.get(stage, 0.0) + seconds

    def search_cost(self) -> dict[str, Any]:
        """What the run spent (arch meta `search_cost`): seconds per stage, in all, and in
        trainings where search.budget timed one."""
        training = (self.budget_plan or {}).get("training_s", 0.0)
        return budgets.spent(self._spent_now(), training, self.cfg.search.budget)

    # ---- resume ---------------------------------------------------------------------------
    def _check_resume(self, state: dict[str, Any]) -> None:
        saved, now = state["config"], self.cfg.resolved()
        if saved["space"] != now["space"]:
            diff = next((k for k in saved["space"]
                         if saved["space"].get(k) != now["space"].get(k)), "space")
            raise FbnasError(f"{self.files.checkpoint}: was searched in another search "
                             f"space (space.{diff} differs); resume with the original config")
        super()._check_resume(state)

    def _restore(self, state: dict[str, Any]) -> None:
        self.net.load_search_state(state["model"], str(self.files.checkpoint))
        self.w_opt.load_state_dict(state["w_opt"])
        self.theta_opt.load_state_dict(state["theta_opt"])
        for opt in (self.w_opt, self.theta_opt):  # this run's kernels, whatever wrote it
            keep_fused(opt, self.guard.deferred)
        self.w_sched.load_state_dict(state["w_sched"])
        self.epoch, self.phase, self.step = state["epoch"], state["phase"], state["step"]
        self.history = list(state["history"])
        self._load_partial(state.get("partial"))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.prec.load_state_dict(state.get("scalers"))
        # a distributed checkpoint holds each rank's RNG, partial sums and BN statistics
        self._restore_ranks(state, at_epoch_start=self.phase == "w" and not self.step,
                            seed=self.cfg.search.seed)

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "search", "epoch": self.epoch, "phase": self.phase, "step": self.step,
            "model": self.net.state_dict(), "w_opt": self.w_opt.state_dict(),
            "theta_opt": self.theta_opt.state_dict(), "w_sched": self.w_sched.state_dict(),
            "tau": self.tau, "rng": rng_state(), "config": self.cfg.resolved(),
            "cost_fingerprint": self.costs.fingerprint, "history": self.history,
            "partial": self._partial_state(), "skipped_steps": self.skipped_steps,
            "scalers": self.prec.state_dict(),
            "spent": self._spent_now(), "budget_plan": self.budget_plan,
        }

    def _after_save(self) -> None:
        if getattr(self, "_config_changed", False):  # a re-plan, now in the checkpoint too
            self._write_config()
            self._config_changed = False
        write_json_atomic(self.files.theta, {
            "epoch": self.epoch, "ops": [list(c) for c in self.cfg.space.decision_candidates()],
            "theta": [t.detach().cpu().tolist() for t in self.net.theta]})

    @property
    def net(self) -> Supernet:
        """The supernet (`self.model`; under torchrun, weight steps run it through
        `self.w_forward`, its DDP wrapper)."""
        return self.model

    @property
    def bn_module(self) -> nn.Module:
        return self.net

    # ---- schedule ---------------------------------------------------------------------------
    @property
    def tau(self) -> float:
        return self.tau_schedule(self.epoch)

    def theta_active(self, epoch: int | None = None) -> bool:
        return (self.epoch if epoch is None else epoch) >= self.cfg.search.warmup_epochs

    # ---- one step of each kind ---------------------------------------------------------------
    def _non_finite(self, terms: list[str], step: int, count: int = 1) -> None:
        where = f"epoch {self.epoch + 1}/{self.cfg.search.epochs}, {self.phase} step {step + 1}"
        what = non_finite_what(terms)
        if self.cfg.search.nan_policy == "skip":
            self.skipped_steps += count
            more = f" (and {count - 1} more steps since)" if count > 1 else ""
            self.log.warning(f"non-finite {what} at {where}{more}: step skipped")
            return
        self._rewind(step)  # deferred check: back to the bad step, whose update was skipped
        self.save()  # nothing was applied from that step on: this is the last good state
        raise NonFiniteLoss(f"non-finite {what} at {where}; stopped after saving the last good "
                            f"state in {self.files.checkpoint} (set search.nan_policy: skip "
                            "to skip such steps)")

    def validate(self) -> dict[str, float]:
        """Figures of the validation split, each named for what it measures: the argmax
        architecture as a single path on the supernet's weights (`argmax_path_acc` / `_ce`),
        and in a mode that computes every candidate also the relaxed supernet at softmax(θ)
        without noise (`relaxed_acc` / `_ce`); each after re-estimating BatchNorm statistics
        on (un-augmented) weight-split images."""
        indices = self.net.argmax_indices()
        out = {"predicted": self.costs.model(self.cfg.space).of(indices)}
        if self.data.val_loader is None:  # val_fraction 0: no selection split
            return out
        s, net = self.cfg.search, self.net
        if net.search_mode.all_paths:
            r = validate_weights(net, self.data, self.device, net.probabilities(), None,
                                 s.bn_calib_samples, self.dist)
            out.update(relaxed_acc=r["acc"], relaxed_ce=r["ce"])
        r = validate_weights(net, self.data, self.device, *net.path(indices),
                             s.bn_calib_samples, self.dist)
        return {**out, "argmax_path_acc": r["acc"], "argmax_path_ce": r["ce"]}

    # ---- epochs ----------------------------------------------------------------------------------
    def _phase(self, phase: str, loader, step_fn) -> dict[str, float]:
        """Run (or finish) one phase of the epoch; the means of its step figures."""
        sums = self._run_phase(self.data.iterate(loader, start=self.step), len(loader),
                               f"epoch {self.epoch + 1}/{self.cfg.search.epochs} {phase}",
                               step_fn, shown=("ce", "acc", "cost"))
        return sums.means()

    def train_epoch(self) -> dict[str, Any]:
        """Run (or finish) the current epoch; returns its metrics."""
        e = self.epoch
        self.data.set_epoch(e)
        # the epoch's seconds survive an interruption (a checkpoint's partial state keeps
        # them): search.budget re-plans on whole epochs, however often they were resumed
        t0 = self._epoch_t0 = self.clock()
        self._epoch_prior = float(self.partial.get("seconds", 0.0))
        rec: dict[str, Any] = self.partial.setdefault("rec", {})
        if self.phase == "w":
            w = self._phase("w", self.data.w_loader, self.weight_step)
            rec.update({f"w_{k}": v for k, v in w.items()})
            rec["w_lr"] = self.w_opt.param_groups[0]["lr"]
            self.w_sched.step()
            self.phase, self.step, self.partial = "theta", 0, {"rec": rec}
            # the step counter restarts: with run.checkpoint_every_steps N a kill loses at most
            # N - 1 steps only if each phase's end is saved too
            if self.cfg.run.checkpoint_every_steps and self.theta_active(e):
                self.save()
        if self.phase == "theta":
            if self.theta_active(e):
                th = self._phase("theta", self.data.theta_loader, self.theta_step)
                rec.update({f"theta_{k}": v for k, v in th.items()})
            self.phase, self.step, self.partial = "val", 0, {"rec": rec}
            if self.cfg.run.checkpoint_every_steps:
                self.save()
        rec.update(self.validate())
        rec.update({"epoch": e + 1, "tau": self.tau, "theta_lr": self.theta_opt.param_groups[0]
                    ["lr"], "theta_active": self.theta_active(e),
                    "seconds": self._epoch_prior + self.clock() - t0,
                    "probs": [p.cpu().tolist() for p in self.model.probabilities()],
                    "entropy": self.model.entropy().cpu().tolist()})
        return rec

    def train(self) -> dict[str, Any]:
        """Run to the last epoch. Ctrl-C finishes the current step, saves the exact position
        and raises Interrupted; `--resume` continues from there."""
        s = self.cfg.search
        self.log.info(f"search '{self.cfg.space.name}': {s.epochs} epochs ({s.warmup_epochs} "
                      f"warm-up), {self.costs.description}, device {self.device}"
                      + (f", {s.precision}" if s.precision != "float32" else "")
                      + (", channels_last" if self.prec.channels_last else ""))
        if (warn := self.prec.warning("search")) is not None:
            self.log.warning(warn)
        self._charge("setup", self.clock() - self._mark)  # this process's, before the epochs
        self._stage = ("supernet", self.clock())
        try:
            self._run_epochs(lambda: self.cfg.search.epochs)  # search.budget may re-plan it
        finally:
            self._charge("supernet", self.clock() - self._stage[1])
            self._stage = None
        t = self.clock()
        arch = self.final_arch()
        indices = arch_indices(self.cfg.space, arch)
        predicted = self.costs.model(self.cfg.space).of(indices)
        result = {"arch": arch.ops, "hash": arch.hash(), "history": self.history,
                  "predicted": predicted, "cost_unit": self.costs.unit,
                  "choices": arch.choices_text(self.cfg.space)}
        if self.data.val_loader is not None:  # the architecture returned, as a single path
            r = validate_weights(self.net, self.data, self.device, *self.net.path(indices),
                                 s.bn_calib_samples, self.dist)
            result["final_path_acc"] = r["acc"]
            self.log.info(f"final architecture as a path of the supernet (BN re-estimated): "
                          f"val acc {r['acc']:.3f}, CE {r['ce']:.3f}")
        if "target" in arch.meta:
            result["target"] = arch.meta["target"]
        if "measured" in arch.meta:  # the measured fit's figure and what it took
            result.update(measured=arch.meta["measured"],
                          fit_seconds=arch.meta["fit_seconds"])
        # the pick's seconds: the measured fit's and the final trainings' as recorded, the
        # rest (the paths scored, the returned one validated) scoring
        picked = self.clock() - t
        fit_s = float(arch.meta.get("fit_seconds", 0.0))
        pick = arch.meta.get("final_pick") or {}
        train_s = sum(float(r.get("seconds", 0.0)) for r in pick.get("trained", []))
        self._charge("measured_fit", fit_s)
        self._charge("final_train", train_s)
        self._charge("scoring", max(0.0, picked - fit_s - train_s))
        cost = self.search_cost()
        arch = arch.with_meta(search_cost=cost)
        if self.dist.is_main:
            arch.save(self.files.arch)
        result["search_cost"] = cost
        self.log.info("spent: " + budgets.describe_spent(cost))
        u = self.costs.unit
        said = "".join(f", {arch.meta[k]:.1f} {u} {w}" for k, w in (
            ("target", "target"), ("measured", "measured")) if k in arch.meta)
        self.log.info(f"done: architecture {arch.short_hash} "
                      f"({result['predicted']:.1f} {u} predicted{said}) -> "
                      f"{self.files.arch}")
        return result

    def _next_epoch(self) -> None:
        super()._next_epoch()
        self.phase = "w"
        self._epoch_t0 = None
        self._replan()

    def _partial_state(self) -> dict[str, Any]:
        """The epoch in progress, with the seconds it has run so far (over every process)."""
        out = super()._partial_state()
        if getattr(self, "_epoch_t0", None) is not None:
            out["seconds"] = self._epoch_prior + self.clock() - self._epoch_t0
        return out

    def _replan(self) -> None:
        """search.budget: after the first epoch and the first θ epoch, the epochs planned
        again on the supernet's real epoch seconds (the probe's steps run cold); the
        schedules follow (the cosine's lr set where the new length puts it) and config.yaml
        is rewritten, so that a resumed run reads the plan it was on."""
        p, s = self.budget_plan, self.cfg.search
        if p is None or self.epoch not in (1, s.warmup_epochs + 1) or not self.history:
            return
        warm = [h["seconds"] for h in self.history if not h.get("theta_active")]
        theta = [h["seconds"] for h in self.history if h.get("theta_active")]
        c = p["costs"]
        ratio = budgets.StepCosts(**{k: v for k, v in c.items() if k != "training"})
        warm_s = sum(warm) / len(warm) if warm else ratio.epoch(False)
        theta_s = (sum(theta) / len(theta) if theta
                   else warm_s * ratio.epoch(True) / ratio.epoch(False))
        spent = sum(self._spent_now().values())
        n, w = budgets.replan(p, spent, self.epoch, s.warmup_epochs, warm_s, theta_s)
        if (n, w) == (s.epochs, s.warmup_epochs):
            return
        self.log.info(f"budget: epochs planned again on the real epochs ({warm_s:.1f} s weights "
                      f"only, {theta_s:.1f} s with θ): {n} epochs, {w} weights only (were "
                      f"{s.epochs}, {s.warmup_epochs})")
        self.cfg = dataclasses.replace(self.cfg, search=dataclasses.replace(
            s, epochs=n, warmup_epochs=w))
        s = self.cfg.search
        p["settings"].update(epochs=n, warmup_epochs=w)
        self.tau_schedule = TauSchedule.from_config(s)
        self.w_sched.T_max = n
        for g, base in zip(self.w_opt.param_groups, self.w_sched.base_lrs, strict=True):
            g["lr"] = s.w_lr_min + (base - s.w_lr_min) * (1 + math.cos(
                math.pi * self.epoch / n)) / 2
        self.w_sched._last_lr = [g["lr"] for g in self.w_opt.param_groups]
        self._config_changed = True  # config.yaml follows the checkpoint (_after_save)

    def _position(self) -> str:
        return f"epoch {self.epoch} phase {self.phase} step {self.step}"

    def final_arch(self) -> Architecture:
        """The network the search returns (`fbnas.fit.select`: argmax θ, fitted onto the
        loss's target by the table, the final pick among the most probable networks of that
        cost by their paths on the supernet, then the measured fit; rank 0 times networks,
        the other ranks receive its choice)."""
        sel = Selector(self.cfg, self.net.theta, self.costs, getattr(self.loss, "target", None),
                       self.log.info, str(self.run_dir), dist=self.dist).select(judge=self)
        return sel.architecture(self.cfg, f"{self.cfg.space.name}_search", run=str(self.run_dir))

    # the final pick's judge (fbnas.fit.select.PathJudge): paths scored on the validation
    # split where there is one; children trained where the search is not under torchrun
    @property
    def can_score(self) -> bool:
        return self.data.val_loader is not None

    @property
    def can_train(self) -> bool:
        return not self.dist.distributed

    def train_path(self, indices: list[int]) -> dict[str, float]:
        """`search.final_train`: the network trained from scratch with the retrain section
        (in a scratch folder of the run, removed after); its validation figures."""
        arch = arch_from_indices(self.cfg.space, indices, "final_train")
        work = self.run_dir / "final_train"
        try:
            return train_child(self.cfg, arch, self.cfg.retrain.seed, work)
        finally:
            with contextlib.suppress(OSError):
                work.rmdir()

    def score_paths(self, cands: list[list[int]]) -> list[dict[str, float]]:
        """The final pick's scores: each candidate's path on the supernet, BN re-estimated,
        on the validation split (every rank evaluates)."""
        return [validate_weights(self.net, self.data, self.device, *self.net.path(c),
                                 self.cfg.search.bn_calib_samples, self.dist) for c in cands]

    # ---- distributed (torchrun; docs/distributed.md) ---------------------------------------------
    def _setup_distributed(self, fresh: bool) -> None:
        """DDP for the weight path, averaged θ gradients, rank-identical Gumbel noise."""
        d, net = self.dist, self.net
        theta = net.arch_parameters()
        # θ stays outside DDP: weight steps give it no gradient, and its own gradients (θ
        # steps, which bypass DDP) are averaged before each Adam step (Update.average).
        d.broadcast_tensors(theta)
        # a mode that computes some candidates only leaves the others without a gradient
        w_mode = net.search_mode if self._weight_mode is None else get_mode(self._weight_mode)
        self._ddp = self.w_forward = wrap_ddp(
            net, d, ignore=theta, find_unused_parameters=not w_mode.all_paths)
        self._load_rank_bn()  # after DDP's broadcast
        phases = {"w": 1, "theta": 2, "val": 3}
        self.noise = SharedNoise(lambda: (self.cfg.search.seed, self.epoch,
                                          phases.get(self.phase, 0), self.step), self.device)
        self._averager = PeriodicAverager(d, net.weight_parameters(), self.w_opt,
                                          self.cfg.run.ddp_sync_every)
        if fresh:  # each rank its own augmentation stream (the model is already built)
            seed_everything(rank_seed(self.cfg.search.seed, d.rank, 0))

    # ---- logging (fbnas.search._figures) ---------------------------------------------------
    def epoch_line(self, rec: dict[str, Any]) -> str:
        return epoch_line(rec, self.cfg.search.epochs, self.costs.unit)

    def tb_scalars(self, w: SummaryWriter, rec: dict[str, Any]) -> None:
        tb_scalars(w, rec, self.cfg.space.decision_candidates())

    # ---- the steps: weight steps on the sampled paths, θ steps through the relaxation or by
    # the score function; every one through the one update of fbnas.training._step ----------
    def _sample(self) -> PathSample:
        """The paths of one θ step, as search.mode samples them (on the ranks' shared
        noise)."""
        with self.noise():
            return self.net.sample_path(self.tau, self.cfg.search.hard)

    @property
    def _weight_mode(self) -> str | None:
        """The mode the weight steps sample in after the warm-up (None: search.mode)."""
        s = self.cfg.search
        w = weight_sampler(s.mode, s.weight_sampling)
        return None if w == s.mode else w

    def _w_update(self) -> Update:
        kernels = self.net.superkernels()
        sparse = (UsedSlices(kernels) if kernels and self.cfg.search.shared_update == "used"
                  else None)
        return Update(self.w_opt, self.net.weight_parameters(), 0, self.cfg.search.grad_clip,
                      ddp=self._ddp, averager=self._averager, sparse=sparse)

    def _warmup_paths(self) -> list[list[list[int]]] | None:
        """The single paths a warm-up weight step trains, or None (fbnas.trainer)."""
        if self.theta_active():
            return None
        return warmup_paths(self.cfg.search.warmup_sampling, [len(t) for t in self.net.theta])

    def _path_weight_step(self, x: torch.Tensor, y: torch.Tensor,
                          paths: list[list[list[int]]]) -> StepFigures:
        """One weight step on the given single paths, gradients summed over them (FairNAS: each
        candidate gets a whole step's update; the shared stem and head get K of them, which
        search.grad_clip bounds). With search.sandwich the dearest path comes first, on the
        labels, and the others learn from its soft outputs (in-place distillation)."""
        ce_sum = acc_sum = cost_sum = 0.0
        teacher = None
        if self.cfg.search.sandwich:
            paths = [[[i] for i in self.net.dearest_path()], *paths]
        with self.stepper.update(self._w_update()) as u:
            ces = []
            for path in paths:
                m, active = self.net.path([a[0] for a in path])
                with self.prec.autocast():
                    logits, cost = self.w_forward(self.prec.input(x), m=m, active=active,
                                                  cost_m=m)
                logits = logits.float()
                ce = self.loss.ce(logits, y)
                ces.append(ce)
                loss = ce if teacher is None else distillation(logits, teacher)
                if self.cfg.search.sandwich and teacher is None:
                    teacher = logits.detach()
                self.prec.scale(loss, 0).backward()
                ce_sum = ce_sum + metric(ce)
                acc_sum = acc_sum + metric((logits.detach().argmax(1) == y).float().mean())
                cost_sum = cost_sum + metric(cost)
            u.terms = {"ce": torch.stack(ces)}
        if not u.applied:
            return StepFigures()
        k = len(paths)
        return StepFigures({"ce": ce_sum / k, "acc": acc_sum / k, "cost": cost_sum / k},
                           skip=u.skip)

    def weight_step(self, x: torch.Tensor, y: torch.Tensor) -> StepFigures:
        self.model.train()
        paths = self._warmup_paths()
        if paths is not None:
            return self._path_weight_step(x, y, paths)
        # the mode decides which paths are sampled and computed; with search.uniform_paths
        # (bi-sampling) also that many uniform single paths, drawn on the same noise, so
        # every rank of a torchrun draws the same ones
        sizes = [len(t) for t in self.net.theta]
        with torch.no_grad(), self.noise():
            p = self.net.sample_path(self.tau, self.cfg.search.hard, self._weight_mode)
            extra = [warmup_paths("uniform", sizes)[0]
                     for _ in range(self.cfg.search.uniform_paths)]
        if extra or self.cfg.search.sandwich:
            return self._path_weight_step(x, y, [[list(a) for a in p.active], *extra])
        with self.stepper.update(self._w_update()) as u:
            with self.prec.autocast():
                logits, cost = self.w_forward(self.prec.input(x), m=p.m, active=p.active,
                                              cost_m=p.cost_m)
            logits = logits.float()  # the losses in float32 under any search.precision
            ce = self.loss.ce(logits, y)
            self.prec.scale(ce, 0).backward()
            u.terms = {"ce": ce}
        if not u.applied:
            return StepFigures()
        acc = (logits.detach().argmax(1) == y).float().mean()
        return StepFigures({"ce": metric(ce), "acc": metric(acc), "cost": metric(cost)},
                           skip=u.skip)

    def theta_step(self, x: torch.Tensor, y: torch.Tensor) -> StepFigures:
        self.model.train()
        if self.net.search_mode.score_paths:
            return self._score_theta_step(x, y, self.net.search_mode.score_paths)
        theta = self.net.arch_parameters()
        with self.stepper.update(Update(self.theta_opt, theta, 1, average=True)) as u, \
                frozen_weights(self.net.weight_parameters()):
            p = self._sample()
            with self.prec.autocast():
                logits, cost = self.model(self.prec.input(x), m=p.m, active=p.active,
                                          cost_m=p.cost_m)
            if self.loss.on_expected:  # Σ softmax(θ)·LAT: deterministic, reaches every θ
                cost = self.net.expected_cost([torch.softmax(t, -1) for t in self.net.theta])
            terms = self.loss(logits.float(), y, cost.float())
            # weights get no gradient here (frozen: no layer keeps its input for a weight
            # gradient). A layer's θ can be absent from the graph in a mode that computes only
            # the sampled candidate (single_path's sampler): a sampled identity `skip` in a
            # shortcut layer adds nothing (x + 0), and with `loss.kind: ce` nothing else
            # reaches that θ; its gradient is then 0.
            total = self.prec.scale(terms.total, 1)
            _set_grads(theta, total)
            u.terms = {"ce": terms.ce, "cost_term": terms.cost_term, "total": terms.total}
        if not u.applied:
            return StepFigures()
        acc = (logits.detach().argmax(1) == y).float().mean()
        return StepFigures({"loss": metric(terms.total), "ce": metric(terms.ce),
                            "cost_term": metric(terms.cost_term), "acc": metric(acc),
                            "cost": metric(cost)}, skip=u.skip)

    def _score_theta_step(self, x: torch.Tensor, y: torch.Tensor, k: int) -> StepFigures:
        """θ step of a scored mode (fbnas.search.modes.Reinforce): k single paths on this batch, the
        CE gradient by the score function with a leave-one-out baseline, the cost's exactly."""
        theta = self.net.arch_parameters()
        with self.stepper.update(Update(self.theta_opt, theta, 1, average=True)) as u:
            ces, logps, accs = [], [], []
            # the k paths drawn first, each on its own noise, then read on the host at once:
            # one sync, not k (the same paths as drawing one before each forward where a
            # forward draws no random number: a head without dropout, or under torchrun's
            # shared noise)
            draws = []
            for _ in range(k):
                with self.noise():
                    draws.append(self.net.search_mode.draw(self.net.theta))
            paths = torch.stack([idx for _, idx, _ in draws]).tolist()
            with torch.no_grad(), self.prec.autocast():  # one autocast region for the k
                xin = self.prec.input(x)
                stem = self.net.shared_stem(xin, k)  # the same input and weights: once
                outs = [self.model(xin, m=m, active=[[i] for i in path], cost_m=cost_m,
                                   stem=stem)[0]
                        for (m, _, cost_m), path in zip(draws, paths, strict=True)]
            for logits in outs:
                ces.append(self.loss.ce(logits.float(), y))
                accs.append((logits.argmax(1) == y).float().mean())
            for _, idx, _ in draws:  # the indices stay on the device
                logps.append(path_log_prob(theta, idx))
            ce, logp = torch.stack(ces), torch.stack(logps)
            adv = (ce - ce.mean()) * (k / max(k - 1, 1))  # CE_j − mean of the others
            score = (adv * logp).mean()
            # value: the paths' mean CE; gradient: the score-function estimate of ∇θ E[CE]
            est = ce.mean() + score - score.detach()
            cost = self.net.expected_cost([torch.softmax(t, -1) for t in theta])
            terms = self.loss.with_ce(est, cost.float())
            _set_grads(theta, self.prec.scale(terms.total, 1))
            u.terms = {"ce": ce, "cost_term": terms.cost_term, "total": terms.total}
        if not u.applied:
            return StepFigures()
        return StepFigures({"loss": metric(terms.total), "ce": metric(ce.mean()),
                            "cost_term": metric(terms.cost_term),
                            "acc": metric(torch.stack(accs).mean()), "cost": metric(cost)},
                           skip=u.skip)


# ---- what the steps share -----------------------------------------------------------------
def distillation(logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) ‖ softmax(logits)), the batch's mean: in-place distillation."""
    return torch.nn.functional.kl_div(torch.log_softmax(logits, 1), torch.log_softmax(teacher, 1),
                                      reduction="batchmean", log_target=True)


@contextlib.contextmanager
def frozen_weights(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """`params` without requires_grad for the block (a θ step's forward and backward):
    autograd then saves no layer's input for a weight gradient, nor computes one."""
    was = [q.requires_grad for q in params]
    for q in params:
        q.requires_grad_(False)
    try:
        yield
    finally:
        for q, w in zip(params, was, strict=True):
            q.requires_grad_(w)


def _set_grads(theta: list[torch.Tensor], total: torch.Tensor) -> None:
    """θ's gradients of `total` (the weights get none); a θ absent from the graph, or a total
    that depends on no θ, gets a zero gradient."""
    grads = (torch.autograd.grad(total, theta, allow_unused=True) if total.requires_grad
             else [None] * len(theta))
    for t, g in zip(theta, grads, strict=True):
        t.grad = torch.zeros_like(t) if g is None else g


__all__ = ["Interrupted", "NonFiniteLoss", "SearchTrainer", "TauSchedule", "distillation",
           "frozen_weights", "warmup_paths"]
