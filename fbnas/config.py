"""Run configuration: one YAML file with sections, `--set key=value` overrides, strict keys.

    space:   the search space (fbnas.search_space)
    data:    dataset and splits (fbnas.data.DataConfig)
    latency: where costs come from (a table file, or a device to measure on, or flops/params)
    loss:    the cost-aware loss (fbnas.loss.build_loss)
    search:  the trainer: epochs, optimizers, temperature, seed, device
    retrain: training a chosen child from scratch (`fbnas retrain`, `fbnas sweep`)
    run:     output directory and checkpointing

YAML sets the defaults, `--set search.epochs=3` overrides any field (values parsed as YAML),
unknown keys anywhere are errors naming the key, and the resolved config (every default filled
in) is written next to the run's outputs.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from fbnas.blocks.shared import SHARED_UPDATES, WEIGHT_SHARING
from fbnas.data import DataConfig
from fbnas.errors import FbnasError
from fbnas.io import load_config_data
from fbnas.latency.config import LatencyConfig
from fbnas.latency.kinds import is_measured
from fbnas.loss import LossConfig
from fbnas.search.modes import MODES, get_mode, refuse_as_theta_mode, weight_sampler
from fbnas.search_space import SearchSpace
from fbnas.settings import (
    DEVICES,
    FIT_MEASURES,
    LATENCY_TOLERANCE,
    SECTIONS,
    added_values,
    check_sections,
    read_fields,
    resumable_keys,
    setting,
    settings_of,
    suggest,
)
from fbnas.supernet import check_checkpoint_setting
from fbnas.training.precision import PRECISIONS, layout_setting

TAU_SCHEDULES = ("exp", "linear")
# Training on XLA is refused, not half supported: the sampled search modes (two_path,
# reinforce, single_path weight steps) change the graph every step, and XLA recompiles each
# (measured on PJRT CPU, quickstart: 14 compilations in 8 single_path steps), and the trainer
# reads values back on the host every step. XLA is a latency backend (latency.device: xla),
# not a training device.
XLA_TRAINING = ("{where}.device: xla is not supported for training (sampled search modes "
                "change the graph every step and XLA recompiles each); search and retrain on "
                "cpu or cuda, and time the table with latency.device: xla")


def _refuse_xla(d: Any, where: str) -> None:
    if isinstance(d, dict) and d.get("device") == "xla":
        raise FbnasError(XLA_TRAINING.format(where=where))


def _trainer_section(cls, d: Any, where: str, checks) -> Any:
    """A trainer's section (search, retrain): no xla, its fields read, then the first of
    `checks(section)`'s (bad, "key: message") pairs that is bad raised, naming `where`."""
    _refuse_xla(d, where)
    c = read_fields(cls, d, where)
    for bad, msg in checks(c):
        if bad:
            raise FbnasError(f"{where}.{msg}")
    return c


NAN_POLICIES = ("stop", "skip")
NAN_CHECKS = ("auto", "step", "deferred")  # fbnas.training._guard
WARMUP_SAMPLING = ("mode", "uniform", "fair")


# `search:` settings a user reads as groups: `w: {lr: 0.1, momentum: 0.9}` is `w_lr`,
# `w_momentum`; the flat names are the canonical ones (resolved configs, checkpoints) and old
# configs that write them load as they did. A group's keys are its fields' names without the
# prefix (tau0 is `tau: {start: ...}`).
SEARCH_GROUPS = ("w", "theta", "tau", "fit", "final")
_GROUP_RENAMED = {"tau0": ("tau", "start")}


def search_groups() -> dict[str, dict[str, str]]:
    """group -> key -> the flat `search:` setting it stands for, derived from SearchConfig's
    fields."""
    out: dict[str, dict[str, str]] = {g: {} for g in SEARCH_GROUPS}
    for name in settings_of(SearchConfig):
        if name in _GROUP_RENAMED:
            g, k = _GROUP_RENAMED[name]
            out[g][k] = name
            continue
        for g in SEARCH_GROUPS:
            if name.startswith(g + "_"):
                out[g][name[len(g) + 1:]] = name
    return out


def ungroup(d: Any, where: str = "search") -> Any:
    """A `search:` mapping with its groups (`fit: {tolerance: 0.05}`) written as the flat
    settings they stand for (`fit_tolerance: 0.05`); a key outside a group's, or a setting
    given both ways, is a one-line error."""
    if not isinstance(d, dict) or not any(isinstance(d.get(g), dict) for g in SEARCH_GROUPS):
        return d
    groups, flat = search_groups(), dict(d)
    for g in SEARCH_GROUPS:
        sub = flat.get(g)
        if not isinstance(sub, dict):
            continue
        del flat[g]
        for k, v in sub.items():
            name = groups[g].get(k)
            if name is None:
                raise FbnasError(f"{where}.{g}.{k}: unknown key (the {g} group's keys: "
                                 f"{', '.join(groups[g])})")
            if name in flat:
                raise FbnasError(f"{where}.{g}.{k} and {where}.{name} are one setting: set "
                                 "one of them")
            flat[name] = v
    return flat


@dataclass(frozen=True)
class SearchConfig:
    """The alternating trainer. Its defaults are the recommended search (docs/search_modes.md,
    "A supernet that learns"): shared superkernels, θ by score function over sampled single
    paths (`reinforce`), weight steps on one θ-drawn path and one uniform path. FBNet's own
    search is `mode: full`, `weights: separate`, `weight_sampling: mode`, `uniform_paths: 0`
    (configs/fbnet_*.yaml).

    mode: how each step samples and computes paths (docs/search_modes.md): `full` computes
    every candidate (FBNet; `hard` picks one-hot straight-through samples), `two_path` only
    two candidates drawn from softmax(θ) (ProxylessNAS), `reinforce` one path drawn from
    softmax(θ) with a score-function θ gradient. `single_path` (GDAS: one hard straight-through
    Gumbel sample per layer) draws weight steps' paths (`weight_sampling`) but a search with
    it as the θ mode is refused (`SinglePath.refused`). `hard` applies to `full` only.
    checkpoint_activations: recompute each layer's activations in backward instead of
    storing them (less memory, more time; same gradients and BN statistics); `cheap` keeps
    the convolutions' outputs and recomputes only BatchNorm, ReLU and the mixing from them.
    precision / channels_last: autocast to bf16 (CPU or CUDA) or fp16 (CUDA, loss-scaled) and
    NHWC memory layout for the training steps (fbnas.training.precision; channels_last `auto`:
    on CUDA, off on the CPU).
    tau0 … tau_min: the temperature schedule's data (fbnas.trainer.TauSchedule): exp is
    τ = max(tau_min, τ0·exp(−tau_decay·(epoch − warmup))), linear goes τ0 → tau_min over the
    θ epochs.
    """

    epochs: int = setting(90, "int", min=1)
    warmup_epochs: int = setting(10, "int", min=0)
    w_lr: float = setting(0.1, "float", gt=0.0)
    w_lr_min: float = setting(0.0, "float", min=0.0)
    w_momentum: float = setting(0.9, "float", min=0.0, max=1.0)
    w_weight_decay: float = setting(1e-4, "float", min=0.0)
    w_nesterov: bool = setting(False, "bool")
    theta_lr: float = setting(0.01, "float", gt=0.0)
    theta_weight_decay: float = setting(5e-4, "float", min=0.0)
    tau0: float = setting(5.0, "float", gt=0.0)
    tau_schedule: str = setting("exp", "str", choices=TAU_SCHEDULES)
    tau_decay: float = setting(0.045, "float", min=0.0)
    tau_min: float = setting(0.1, "float", gt=0.0)
    hard: bool = setting(False, "bool")
    grad_clip: float | None = setting(5.0, "float", gt=0.0, nullable=True)  # null: no clipping
    seed: int = setting(0, "int", min=0)
    device: str = setting("auto", "str", choices=DEVICES, resumable=True)
    nan_policy: str = setting("stop", "str", choices=NAN_POLICIES)
    # re-estimate BN stats of the argmax path before validation
    bn_calib_samples: int = setting(1024, "int", min=0)
    mode: str = setting("reinforce", "str", choices=MODES, added="full")
    checkpoint_activations: bool | str = setting(False, "raw", resumable=True, added=False,
                                                 convert=check_checkpoint_setting)
    precision: str = setting("float32", "str", choices=PRECISIONS, added="float32")
    channels_last: bool | str = setting("auto", "raw", resumable=True, added=False,
                                        convert=layout_setting)
    # which paths the weights train on during the warm-up epochs: as `mode` samples them,
    # `uniform` (one uniformly drawn path per step, SPOS) or `fair` (every candidate of every
    # layer once per step, in shuffled paths, gradients summed: FairNAS strict fairness)
    warmup_sampling: str = setting("mode", "str", choices=WARMUP_SAMPLING, added="mode")
    # which paths the weight steps train on after the warm-up: as `mode` samples them, or as
    # another registered mode does (e.g. `single_path`: each weight step trains one path drawn
    # from softmax(θ) while the θ steps use `mode`'s relaxation; GDAS / TF-NAS)
    weight_sampling: str = setting("single_path", "str", choices=("mode", *MODES), added="mode")
    # each weight step that trains the mode's sampled path also trains this many uniformly
    # drawn single paths (gradients summed; TF-NAS's bi-sampling is 1): the paths θ does not
    # favour keep training, so the supernet can still rank them. Needs single-path weight
    # sampling (single_path or reinforce)
    uniform_paths: int = setting(1, "int", min=0, max=8, added=0)
    # with a loss.target: move the final argmax onto the target (fbnas.fit.onto_target), within
    # ±tol. The fit settings are resumable: the fit is applied from θ after the last epoch
    fit_target: bool = setting(True, "bool", resumable=True)
    fit_tolerance: float = setting(LATENCY_TOLERANCE, "float", gt=0.0, max=0.5, resumable=True)
    # then time the fitted network end to end on the table's device and re-fit until it
    # measures within ±fit_tolerance (`auto`: where this machine can time the table's device;
    # `on`: an error where it cannot), timing at most `fit_rounds` networks
    fit_measure: str = setting("auto", "str", choices=FIT_MEASURES, resumable=True)
    fit_rounds: int = setting(6, "int", min=1, max=20, resumable=True)
    # each of those timings stops once every figure it reads is known within ±fit_stop_ci
    # (its 95% interval, after 10 rounds; fbnas.latency.measure), not after its fixed 60
    # rounds (0: the fixed rounds). The duel's random side times its networks the same way
    fit_stop_ci: float = setting(0.0, "float", min=0.0, max=0.2, resumable=True, added=0.0)
    # the table's probe networks timed beside each of them: the N whose build-time times are
    # nearest the target's (at least 4: the drift is fitted over them), or 0 for all of them.
    # A timing's cost grows with the networks it interleaves (docs/search.md)
    fit_panel: int = setting(0, "int", min=0, max=64, resumable=True, added=0)
    # which network of the fitted cost the search returns: `theta`, θ's most probable one;
    # `path`, of the fit and the `final_candidates` most probable predicted from
    # 2·fit_tolerance under the target to fit_tolerance over it, the one whose path on the
    # supernet reads the best validation accuracy (BN re-estimated; docs/bench.md)
    final_pick: str = setting("path", "str", choices=("theta", "path"), resumable=True,
                              added="theta")
    final_candidates: int = setting(8, "int", min=1, max=64, resumable=True)
    # and this many more drawn uniformly from the same band (seeded by `seed`), so that the
    # pick ranks networks across the band, not only θ's most probable family (0: none)
    final_band_draws: int = setting(0, "int", min=0, max=4096, resumable=True, added=0)
    # then the `final_train` best-ranked of them predicted within ±fit_tolerance of the
    # target trained from scratch with the retrain
    # section (its seed, threads and epochs) and ranked by that training's validation
    # accuracy (then CE) ahead of the rest: a few real trainings of the supernet's shortlist
    # (the cost of each is a child training; 0: none). docs/bench.md, "the duel"
    final_train: int = setting(0, "int", min=0, max=16, resumable=True, added=0)
    # the networks `final_train` trains differ pairwise in at least this many layers (the
    # best-ranked first, a near copy of one already chosen passed over; 1: any two)
    final_train_distinct: int = setting(1, "int", min=1, max=64, resumable=True, added=1)
    # plan the whole search to cost this many trainings of the retrain section's recipe (R):
    # epochs, warm-up, the final pick's scores and trainings chosen from a few timed steps of
    # each kind at the start (fbnas.search.budget, docs/search.md); the planned settings the
    # config gives are kept and reported as overrides. null: the settings as given
    budget: float | None = setting(None, "float", gt=0.0, max=1000.0, nullable=True,
                                   added=None)
    # torch.compile every block of the supernet (stem, each candidate, head) in place: one
    # graph per block shape and mode, whatever paths a step samples (Supernet.compile_blocks)
    compile: bool = setting(False, "bool", resumable=True, added=False)
    # any torch.compile backend
    compile_backend: str = setting("inductor", "str", resumable=True, added="inductor")
    # `separate`: each candidate its own weights (FBNet); `shared`: a layer's plain IRF
    # candidates are slices of one superkernel (fbnas.blocks.shared, docs/search_modes.md)
    weights: str = setting("shared", "str", choices=WEIGHT_SHARING, added="separate")
    # with shared weights, what a weight step moves of a superkernel: `used`, only the entries
    # a path of the step read (weight decay and momentum too); `all`, the whole tensor, so that
    # decay and momentum shrink entries no path read (what runs before `used` did;
    # docs/search_modes.md)
    shared_update: str = setting("used", "str", choices=SHARED_UPDATES, added="all")
    # the sandwich rule with in-place distillation (BigNAS, OFA): each single-path weight step
    # also trains the dearest path (every layer's most costly candidate) on the labels, and the
    # sampled paths learn from its soft outputs (KL) instead of the labels
    sandwich: bool = setting(False, "bool", added=False)

    @classmethod
    def from_dict(cls, d: Any, where: str = "search") -> SearchConfig:
        d = ungroup(d, where)
        if isinstance(d, dict) and isinstance(d.get("fit_measure"), bool):
            # YAML 1.1 reads `fit_measure: off` (and on) as a boolean
            d = {**d, "fit_measure": "on" if d["fit_measure"] else "off"}
        return _trainer_section(cls, d, where, lambda c: [
            (c.budget is None and c.warmup_epochs >= c.epochs,
             f"warmup_epochs: {c.warmup_epochs} leaves no θ epochs (search.epochs is "
             f"{c.epochs})"),
            (c.tau_min > c.tau0, f"tau_min: {c.tau_min} is above tau0 {c.tau0}"),
            (0 < c.fit_panel < 4, f"fit_panel: {c.fit_panel} is under 4 (the drift is fitted "
             "over at least 4 probe networks; 0 times all of them)"),
            (c.uniform_paths > 0 and not get_mode(weight_sampler(c.mode, c.weight_sampling)).single,
             f"uniform_paths: {c.uniform_paths} needs single-path weight steps (set "
             "weight_sampling to single_path, or mode to reinforce)"),
            (c.sandwich and not get_mode(weight_sampler(c.mode, c.weight_sampling)).single,
             "sandwich: needs single-path weight steps (set weight_sampling to "
             "single_path, or mode to reinforce)")])


OPTIMIZERS = ("sgd", "adamw")
LR_SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class RetrainConfig:
    """Training a child network from scratch: the standard recipe (SGD + Nesterov momentum,
    linear warm-up then cosine decay, label smoothing, the data section's augmentation)."""

    epochs: int = setting(30, "int", min=1)
    optimizer: str = setting("sgd", "str", choices=OPTIMIZERS)
    lr: float = setting(0.05, "float", gt=0.0)
    lr_min: float = setting(0.0, "float", min=0.0)
    schedule: str = setting("cosine", "str", choices=LR_SCHEDULES)
    warmup_epochs: int = setting(1, "int", min=0)  # linear warm-up from lr/steps to lr, per step
    momentum: float = setting(0.9, "float", min=0.0, max=1.0)  # sgd only
    nesterov: bool = setting(True, "bool")  # sgd only
    weight_decay: float = setting(4e-5, "float", min=0.0)
    label_smoothing: float = setting(0.1, "float", min=0.0, max=1.0)
    grad_clip: float | None = setting(None, "float", gt=0.0, nullable=True)
    seed: int = setting(0, "int", min=0)
    device: str = setting("auto", "str", choices=DEVICES, resumable=True)
    # torch's CPU threads while training (null: torch's default, the machine's cores). The
    # thread count changes the float reduction order, so a retrain equals another bit for bit
    # only at the same count: the benchmark configs set 1, as `fbnas bench build` trains
    threads: int | None = setting(None, "int", min=1, resumable=True, added=None)
    # torch.compile the child for training
    compile: bool = setting(False, "bool", resumable=True)
    # time the trained child end to end on latency.device
    measure_latency: bool = setting(True, "bool", resumable=True)
    # float32 | bf16 | fp16 (CUDA): autocast (fbnas.training.precision)
    precision: str = setting("float32", "str", choices=PRECISIONS, added="float32")
    # NHWC weights and inputs
    channels_last: bool | str = setting("auto", "raw", resumable=True, added=False,
                                        convert=layout_setting)

    @classmethod
    def from_dict(cls, d: Any, where: str = "retrain") -> RetrainConfig:
        return _trainer_section(cls, d, where, lambda c: [
            (c.warmup_epochs >= c.epochs, f"warmup_epochs: {c.warmup_epochs} is not below "
                                          f"retrain.epochs {c.epochs}"),
            (c.lr_min > c.lr, f"lr_min: {c.lr_min} is above lr {c.lr}")])

    def lr_at(self, step: int, steps_per_epoch: int) -> float:
        """Learning rate of (0-based) optimizer step `step`."""
        warm = self.warmup_epochs * steps_per_epoch
        total = self.epochs * steps_per_epoch
        if step < warm:
            return self.lr * (step + 1) / warm
        if self.schedule == "constant":
            return self.lr
        t = (step - warm) / max(1, total - warm)
        return self.lr_min + 0.5 * (self.lr - self.lr_min) * (1 + math.cos(math.pi * min(t, 1.0)))


@dataclass(frozen=True)
class RunConfig:
    dir: str = setting("runs/search", "str", resumable=True)
    # 0: only at the end of each epoch
    checkpoint_every_steps: int = setting(0, "int", min=0, resumable=True)
    tensorboard: bool = setting(True, "bool", resumable=True)
    progress: bool = setting(True, "bool", resumable=True)
    # multi-process runs under torchrun (docs/distributed.md): average the weights' gradients
    # every step (1), or take K local steps between averages of weights and optimizer state
    ddp_sync_every: int = setting(1, "int", min=1, added=1)
    # auto: nccl on CUDA, gloo on CPU
    ddp_backend: str = setting("auto", "str", choices=("auto", "gloo", "nccl"), resumable=True)
    # how a NaN/inf loss is caught (fbnas.training._guard): `step` reads a flag every step;
    # `deferred` skips the update on the device and reads the flags at most twice a second; auto:
    # deferred on CUDA, step elsewhere
    nan_check: str = setting("auto", "str", choices=NAN_CHECKS, resumable=True, added="auto")

    @classmethod
    def from_dict(cls, d: Any, where: str = "run") -> RunConfig:
        return read_fields(cls, d, where)


@dataclass(frozen=True)
class Config:
    space: SearchSpace
    data: DataConfig
    latency: LatencyConfig
    loss: LossConfig
    search: SearchConfig
    run: RunConfig
    source: str = "<dict>"
    retrain: RetrainConfig = RetrainConfig()
    # the (section, key) pairs the file (and --set) gave, not defaults
    given: frozenset[tuple[str, str]] = dataclasses.field(default=frozenset(), compare=False,
                                                          repr=False)

    def resolved(self) -> dict[str, Any]:
        """Every field with its default filled in; loading this gives the same Config."""
        return {
            "space": self.space.to_dict(),
            "data": self.data.to_dict(),
            "latency": asdict(self.latency),
            "loss": self.loss.to_dict(),
            "search": asdict(self.search),
            "retrain": asdict(self.retrain),
            "run": asdict(self.run),
        }


def section_types() -> dict[str, type]:
    """Each section of `Config` read as `setting` fields (data, latency, loss, search, retrain,
    run), with its dataclass."""
    hints = typing.get_type_hints(Config)
    return {s: hints[s] for s in SECTIONS if dataclasses.is_dataclass(hints[s])
            and settings_of(hints[s])}


def with_retrain_epochs(d: dict[str, Any], epochs: int) -> dict[str, Any]:
    """Config dict `d` with its retrain shortened or lengthened to `epochs` epochs (a sweep's or
    fidelity's `--retrain-epochs`): its warm-up kept where it fits, else cut to epochs - 1
    (`retrain.warmup_epochs` must stay below the epochs); a section or value of the wrong kind
    is left for the config check to name."""
    r = d.get("retrain") or {}
    if not isinstance(r, dict):
        return d
    w = r.get("warmup_epochs", RetrainConfig().warmup_epochs)
    r = {**r, "epochs": epochs}
    if isinstance(w, int) and not isinstance(w, bool):
        r["warmup_epochs"] = min(w, epochs - 1)
    return {**d, "retrain": r}


def apply_overrides(data: dict, overrides: list[str], where: str = "--set") -> dict:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a copy of `data`. With overrides,
    the `search:` section's groups are written flat first and a group's key in an override
    (`search.fit.tolerance`) names its flat setting, so an override wins however the file or
    the override spells the setting."""
    data = copy.deepcopy(data)
    if overrides and isinstance(data.get("search"), dict):
        data["search"] = ungroup(data["search"], f"{where}: search")
    groups = search_groups() if overrides else {}
    for item in overrides or []:
        if "=" not in item:
            raise FbnasError(f"{where} {item!r}: expected key=value, e.g. search.epochs=3")
        key, _, raw = item.partition("=")
        parts = key.strip().split(".")
        if not all(parts):
            raise FbnasError(f"{where} {item!r}: bad key {key!r}")
        if len(parts) == 3 and parts[0] == "search" and parts[2] in groups.get(parts[1], {}):
            parts = ["search", groups[parts[1]][parts[2]]]  # a group's key: its flat setting
        if parts[0] not in SECTIONS:
            raise FbnasError(f"{where} {key}: unknown section '{parts[0]}' "
                             f"({suggest(parts[0], SECTIONS, 'sections')})")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        except (ValueError, RecursionError) as e:  # e.g. 2001-13-45, deeply nested brackets
            raise FbnasError(f"{where} {key.strip()}: cannot read the value "
                             f"({type(e).__name__})") from None
        node = data
        for p in parts[:-1]:
            if isinstance(node, list) and not p.isdigit():
                raise FbnasError(f"{where} {key}: bad list index '{p}' (a number is needed)")
            if p.isdigit() and isinstance(node, list):
                idx = int(p)
                if idx >= len(node):
                    raise FbnasError(f"{where} {key}: index {idx} out of range")
                node = node[idx]
                continue
            nxt = node.get(p) if isinstance(node, dict) else None
            if nxt is None:
                nxt = {}
                node[p] = nxt
            if not isinstance(nxt, (dict, list)):
                raise FbnasError(f"{where} {key}: '{p}' is not a section")
            node = nxt
        last = parts[-1]
        if isinstance(node, list):
            if not last.isdigit() or int(last) >= len(node):
                raise FbnasError(f"{where} {key}: bad list index '{last}'")
            node[int(last)] = value
        else:
            node[last] = value
    return data


def config_from_dict(data: dict, source: str = "<dict>", finished: bool = False) -> Config:
    """The config in `data` validated (errors name `source`). A θ mode refused as one
    (`search.mode: single_path`) is an error here, where a config is read, unless `finished`:
    a finished run's config, which is only read (sampled, scored, retrained from)."""
    check_sections(data, source)
    if "space" not in data:
        raise FbnasError(f"{source}: missing key 'space' (the search space section)")
    loss = {} if data.get("loss") is None else data["loss"]
    if not isinstance(loss, dict):
        raise FbnasError(f"{source}: loss: expected a mapping")
    loss_cfg = LossConfig.from_dict(loss, f"{source}: loss")  # validated first, as before
    latency = LatencyConfig.from_dict(data.get("latency"), f"{source}: latency")
    if loss_cfg.time_target and not is_measured(latency.cost):
        raise FbnasError(f"{source}: loss.target: {loss_cfg.target!r} is a time, but "
                         f"latency.cost is {latency.cost}; give the target in {latency.cost} "
                         "or as a position in the space's range (e.g. 0.6x)")
    space = SearchSpace.from_dict(data["space"], f"{source}: space")
    data_cfg = DataConfig.from_dict({} if data.get("data") is None else data["data"],
                                    f"{source}: data")
    if data_cfg.classes is not None and data_cfg.classes != space.macro.num_classes:
        # the head follows data.classes: N classes kept, N outputs
        space = SearchSpace.from_dict({**data["space"], "num_classes": data_cfg.classes},
                                      f"{source}: space")
    search = SearchConfig.from_dict(data.get("search"), f"{source}: search")
    if not finished:
        try:
            refuse_as_theta_mode(search.mode)
        except FbnasError as e:
            raise FbnasError(f"{source}: {e}") from None
    return Config(
        space=space,
        data=data_cfg,
        latency=latency,
        loss=loss_cfg,
        search=search,
        run=RunConfig.from_dict(data.get("run"), f"{source}: run"),
        source=source,
        retrain=RetrainConfig.from_dict(data.get("retrain"), f"{source}: retrain"),
        given=frozenset((s, k) for s in SECTIONS if s != "space" and isinstance(data.get(s), dict)
                        for k, v in (ungroup(data[s]) if s == "search" else data[s]).items()
                        if v is not None),
    )


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """A config file, or the shipped config of that name (`quickstart`), with `overrides`
    (`--set KEY=VALUE` strings) applied."""
    path, raw = load_config_data(path)
    data = apply_overrides(raw, overrides or [])
    try:
        return config_from_dict(data, str(path))
    except FbnasError as e:
        if not overrides:
            raise
        try:
            config_from_dict(raw, str(path))
        except FbnasError:
            raise e from None  # the file is at fault (too)
        raise blame_overrides(e, str(path), overrides) from None


def blame_overrides(e: FbnasError, path: str, overrides: list[str]) -> FbnasError:
    """An error of a config that its file alone does not raise, said of the `--set` at fault:
    the one whose key the message names (`search.epochz=3`), else all of them."""
    msg = str(e).removeprefix(f"{path}: ")
    keys = [(o, o.partition("=")[0].strip()) for o in overrides]
    named = [o for o, k in keys
             if k in msg or (k.count(".") and f"'{k.rsplit('.', 1)[1]}'" in msg
                             and msg.startswith(k.split(".")[0]))]
    return FbnasError(f"--set {' '.join(named if len(named) == 1 else overrides)}: {msg}")


# ---- what a resumed run may change -----------------------------------------------------------
@dataclass(frozen=True)
class ResumePolicy:
    """`compared`: the config sections a resumed run must keep, but for the keys their
    settings declare `resumable` (where and how it runs, not what it computes); `also_kept`:
    single (section, key) pairs of other sections it must keep. A key older checkpoints lack
    counts as the value its setting declares `added`."""

    compared: tuple[str, ...]
    also_kept: tuple[tuple[str, str], ...] = ()

    @property
    def resumable(self) -> frozenset[tuple[str, str]]:
        """(section, key) pairs of `compared` a resumed run may change."""
        types = section_types()
        return frozenset((s, k) for s in self.compared for k in resumable_keys(types[s]))

    @property
    def added(self) -> dict[tuple[str, str], Any]:
        """(section, key) -> the value runs had before the key existed, for the keys kept."""
        types = section_types()
        out = {(s, k): v for s in self.compared for k, v in added_values(types[s]).items()}
        for s, k in self.also_kept:
            if k in (old := added_values(types[s])):
                out[(s, k)] = old[k]
        return out

    def check(self, saved: dict[str, Any], now: dict[str, Any], where: Path) -> None:
        added = self.added
        check_kept_settings(saved, now, self.compared, self.resumable, added, where)
        for section, key in self.also_kept:
            _keep(where, section, key, saved.get(section, {}).get(key, added.get(
                (section, key))), now.get(section, {}).get(key))


def check_kept_settings(saved: dict[str, Any], now: dict[str, Any], sections: Sequence[str],
                        resumable: set[tuple[str, str]] | frozenset[tuple[str, str]],
                        added: dict[tuple[str, str], Any], where: Path) -> None:
    """A resumed run must keep its settings: every key of `sections` in the checkpoint's
    resolved config `saved` equals `now`'s, except the `resumable` ones; a key missing from an
    older checkpoint counts as its `added` value."""
    for section in sections:
        a, b = saved.get(section, {}), now.get(section, {})
        for key in sorted(set(a) | set(b)):
            if (section, key) not in resumable:
                _keep(where, section, key, a.get(key, added.get((section, key))), b.get(key))


def _keep(where: Path, section: str, key: str, old: Any, new: Any) -> None:
    if old != new:
        raise FbnasError(f"{where}: {section}.{key} was {old!r} in this run, now {new!r}; a "
                         "resumed run must keep its settings (start a new run to change them)")
