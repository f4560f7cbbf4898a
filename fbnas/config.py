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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from fbnas.errors import FbnasError
from fbnas.io import Fields, load_yaml
from fbnas.search_space import SearchSpace

SECTIONS = ("space", "data", "latency", "loss", "search", "retrain", "run")
TAU_SCHEDULES = ("exp", "linear")
COSTS = ("latency", "flops", "params")
DEVICES = ("auto", "cpu", "cuda")
NAN_POLICIES = ("stop", "skip")
SEARCH_MODES = ("full", "single_path", "two_path")  # fbnas.supernet.SEARCH_MODES
PRECISIONS = ("float32", "bf16", "fp16")  # fbnas.precision.PRECISIONS


@dataclass(frozen=True)
class LatencyConfig:
    """Where the per-(layer, op) costs come from.

    cost: latency (µs, from `table` or measured on `device`), flops (MFLOPs) or params (K).
    table: a latency table file; if absent, `fbnas train` measures one on `device` (or reuses
    a cached table for the same space signatures and device settings from `cache_dir`).
    """

    cost: str = "latency"
    table: str | None = None
    device: str = "cpu"
    threads: int = 1
    batch: int = 1
    dtype: str = "float32"
    channels_last: bool = False
    cache_dir: str = "~/.cache/fbnas/tables"

    @classmethod
    def from_dict(cls, d: Any, where: str = "latency") -> LatencyConfig:
        f = Fields({} if d is None else d, where)
        c = cls(
            cost=f.str("cost", "latency", choices=COSTS),
            table=f.str("table", None),
            device=f.str("device", "cpu", choices=("cpu", "cuda", "xla", "fake")),
            threads=f.int("threads", 1, min=1),
            batch=f.int("batch", 1, min=1),
            dtype=f.str("dtype", "float32", choices=("float32", "float16", "bfloat16")),
            channels_last=f.bool("channels_last", False),
            cache_dir=f.str("cache_dir", "~/.cache/fbnas/tables"),
        )
        f.done()
        return c


@dataclass(frozen=True)
class SearchConfig:
    """The alternating trainer (paper defaults).

    mode: how each step samples and computes paths (docs/search_modes.md): `full` computes
    every candidate (FBNet; `hard` picks one-hot straight-through samples), `single_path` only
    one hard straight-through Gumbel sample per layer (GDAS), `two_path` only two candidates
    drawn from softmax(θ) (ProxylessNAS). `hard` applies to `full` only.
    checkpoint_activations: recompute each layer's activations in backward instead of
    storing them (less memory, more time; same gradients and BN statistics).
    precision / channels_last: autocast to bf16 (CPU or CUDA) or fp16 (CUDA, loss-scaled) and
    NHWC memory layout for the training steps (fbnas.precision).
    """

    epochs: int = 90
    warmup_epochs: int = 10
    w_lr: float = 0.1
    w_lr_min: float = 0.0
    w_momentum: float = 0.9
    w_weight_decay: float = 1e-4
    w_nesterov: bool = False
    theta_lr: float = 0.01
    theta_weight_decay: float = 5e-4
    tau0: float = 5.0
    tau_schedule: str = "exp"
    tau_decay: float = 0.045  # exp: τ = τ0·exp(−decay·(epoch − warmup))
    tau_min: float = 0.1  # linear: τ0 → tau_min over the θ epochs; exp: floor
    hard: bool = False
    grad_clip: float | None = 5.0
    seed: int = 0
    device: str = "auto"
    nan_policy: str = "stop"
    bn_calib_samples: int = 1024  # re-estimate BN stats of the argmax path before validation
    mode: str = "full"
    checkpoint_activations: bool = False
    precision: str = "float32"
    channels_last: bool = False

    @classmethod
    def from_dict(cls, d: Any, where: str = "search") -> SearchConfig:
        f = Fields({} if d is None else d, where)
        c = cls(
            epochs=f.int("epochs", 90, min=1),
            warmup_epochs=f.int("warmup_epochs", 10, min=0),
            w_lr=f.float("w_lr", 0.1, gt=0.0),
            w_lr_min=f.float("w_lr_min", 0.0, min=0.0),
            w_momentum=f.float("w_momentum", 0.9, min=0.0, max=1.0),
            w_weight_decay=f.float("w_weight_decay", 1e-4, min=0.0),
            w_nesterov=f.bool("w_nesterov", False),
            theta_lr=f.float("theta_lr", 0.01, gt=0.0),
            theta_weight_decay=f.float("theta_weight_decay", 5e-4, min=0.0),
            tau0=f.float("tau0", 5.0, gt=0.0),
            tau_schedule=f.str("tau_schedule", "exp", choices=TAU_SCHEDULES),
            tau_decay=f.float("tau_decay", 0.045, min=0.0),
            tau_min=f.float("tau_min", 0.1, gt=0.0),
            hard=f.bool("hard", False),
            grad_clip=f.float("grad_clip", 5.0, gt=0.0, nullable=True),  # null: no clipping
            seed=f.int("seed", 0, min=0),
            device=f.str("device", "auto", choices=DEVICES),
            nan_policy=f.str("nan_policy", "stop", choices=NAN_POLICIES),
            bn_calib_samples=f.int("bn_calib_samples", 1024, min=0),
            mode=f.str("mode", "full", choices=SEARCH_MODES),
            checkpoint_activations=f.bool("checkpoint_activations", False),
            precision=f.str("precision", "float32", choices=PRECISIONS),
            channels_last=f.bool("channels_last", False),
        )
        f.done()
        if c.warmup_epochs >= c.epochs:
            raise FbnasError(f"{where}.warmup_epochs: {c.warmup_epochs} leaves no θ epochs "
                             f"(search.epochs is {c.epochs})")
        if c.tau_min > c.tau0:
            raise FbnasError(f"{where}.tau_min: {c.tau_min} is above tau0 {c.tau0}")
        return c

    def tau(self, epoch: int) -> float:
        """Temperature at `epoch` (0-based): τ0 during warm-up, then annealed."""
        k = max(0, epoch - self.warmup_epochs)
        if self.tau_schedule == "exp":
            import math

            return max(self.tau_min, self.tau0 * math.exp(-self.tau_decay * k))
        n = max(1, self.epochs - self.warmup_epochs - 1)
        return self.tau0 + (self.tau_min - self.tau0) * min(1.0, k / n)


OPTIMIZERS = ("sgd", "adamw")
LR_SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class RetrainConfig:
    """Training a child network from scratch: the standard recipe (SGD + Nesterov momentum,
    linear warm-up then cosine decay, label smoothing, the data section's augmentation)."""

    epochs: int = 30
    optimizer: str = "sgd"
    lr: float = 0.05
    lr_min: float = 0.0
    schedule: str = "cosine"
    warmup_epochs: int = 1  # linear warm-up from lr/steps to lr, per step
    momentum: float = 0.9  # sgd only
    nesterov: bool = True  # sgd only
    weight_decay: float = 4e-5
    label_smoothing: float = 0.1
    grad_clip: float | None = None
    seed: int = 0
    device: str = "auto"
    compile: bool = False  # torch.compile the child for training
    measure_latency: bool = True  # time the trained child end to end on latency.device
    precision: str = "float32"  # float32 | bf16 | fp16 (CUDA): autocast (fbnas.precision)
    channels_last: bool = False  # NHWC weights and inputs

    @classmethod
    def from_dict(cls, d: Any, where: str = "retrain") -> RetrainConfig:
        f = Fields({} if d is None else d, where)
        c = cls(
            epochs=f.int("epochs", 30, min=1),
            optimizer=f.str("optimizer", "sgd", choices=OPTIMIZERS),
            lr=f.float("lr", 0.05, gt=0.0),
            lr_min=f.float("lr_min", 0.0, min=0.0),
            schedule=f.str("schedule", "cosine", choices=LR_SCHEDULES),
            warmup_epochs=f.int("warmup_epochs", 1, min=0),
            momentum=f.float("momentum", 0.9, min=0.0, max=1.0),
            nesterov=f.bool("nesterov", True),
            weight_decay=f.float("weight_decay", 4e-5, min=0.0),
            label_smoothing=f.float("label_smoothing", 0.1, min=0.0, max=1.0),
            grad_clip=f.float("grad_clip", None, gt=0.0, nullable=True),
            seed=f.int("seed", 0, min=0),
            device=f.str("device", "auto", choices=DEVICES),
            compile=f.bool("compile", False),
            measure_latency=f.bool("measure_latency", True),
            precision=f.str("precision", "float32", choices=PRECISIONS),
            channels_last=f.bool("channels_last", False),
        )
        f.done()
        if c.warmup_epochs >= c.epochs:
            raise FbnasError(f"{where}.warmup_epochs: {c.warmup_epochs} is not below "
                             f"retrain.epochs {c.epochs}")
        if c.lr_min > c.lr:
            raise FbnasError(f"{where}.lr_min: {c.lr_min} is above lr {c.lr}")
        return c

    def lr_at(self, step: int, steps_per_epoch: int) -> float:
        """Learning rate of (0-based) optimizer step `step`."""
        import math

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
    dir: str = "runs/search"
    checkpoint_every_steps: int = 0  # 0: only at the end of each epoch
    tensorboard: bool = True
    progress: bool = True
    # multi-process runs under torchrun (docs/distributed.md): average the weights' gradients
    # every step (1), or take K local steps between averages of weights and optimizer state
    ddp_sync_every: int = 1
    ddp_backend: str = "auto"  # auto: nccl on CUDA, gloo on CPU

    @classmethod
    def from_dict(cls, d: Any, where: str = "run") -> RunConfig:
        f = Fields({} if d is None else d, where)
        c = cls(dir=f.str("dir", "runs/search"),
                checkpoint_every_steps=f.int("checkpoint_every_steps", 0, min=0),
                tensorboard=f.bool("tensorboard", True), progress=f.bool("progress", True),
                ddp_sync_every=f.int("ddp_sync_every", 1, min=1),
                ddp_backend=f.str("ddp_backend", "auto", choices=("auto", "gloo", "nccl")))
        f.done()
        return c


@dataclass(frozen=True)
class Config:
    space: SearchSpace
    data: Any  # fbnas.data.DataConfig
    latency: LatencyConfig
    loss: dict
    search: SearchConfig
    run: RunConfig
    source: str = "<dict>"
    retrain: RetrainConfig = RetrainConfig()

    def resolved(self) -> dict[str, Any]:
        """Every field with its default filled in; loading this gives the same Config."""
        return {
            "space": self.space.to_dict(),
            "data": self.data.to_dict(),
            "latency": asdict(self.latency),
            "loss": _resolved_loss(self.loss),
            "search": asdict(self.search),
            "retrain": asdict(self.retrain),
            "run": asdict(self.run),
        }


def _resolved_loss(loss: dict) -> dict:
    from fbnas.loss import build_loss

    built = build_loss(loss)
    out = {"kind": loss.get("kind", "fbnet")}
    for key, attr in (("alpha", "alpha"), ("beta", "beta"), ("target", "target"),
                      ("lambda", "lam"), ("label_smoothing", "label_smoothing")):
        if hasattr(built, attr):
            out[key] = getattr(built, attr)
    return out


def apply_overrides(data: dict, overrides: list[str], where: str = "--set") -> dict:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a copy of `data`."""
    data = copy.deepcopy(data)
    for item in overrides or []:
        if "=" not in item:
            raise FbnasError(f"{where} {item!r}: expected key=value, e.g. search.epochs=3")
        key, _, raw = item.partition("=")
        parts = key.strip().split(".")
        if not all(parts):
            raise FbnasError(f"{where} {item!r}: bad key {key!r}")
        if parts[0] not in SECTIONS:
            raise FbnasError(f"{where} {key}: unknown section '{parts[0]}' "
                             f"(sections: {', '.join(SECTIONS)})")
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


def config_from_dict(data: dict, source: str = "<dict>") -> Config:
    from fbnas.data import DataConfig

    unknown = [k for k in data if k not in SECTIONS]
    if unknown:
        raise FbnasError(f"{source}: unknown section '{unknown[0]}' "
                         f"(sections: {', '.join(SECTIONS)})")
    if "space" not in data:
        raise FbnasError(f"{source}: missing key 'space' (the search space section)")
    loss = {} if data.get("loss") is None else data["loss"]
    if not isinstance(loss, dict):
        raise FbnasError(f"{source}: loss: expected a mapping")
    from fbnas.loss import build_loss

    build_loss(loss, f"{source}: loss")  # validate now
    return Config(
        space=SearchSpace.from_dict(data["space"], f"{source}: space"),
        data=DataConfig.from_dict({} if data.get("data") is None else data["data"],
                                 f"{source}: data"),
        latency=LatencyConfig.from_dict(data.get("latency"), f"{source}: latency"),
        loss=dict(loss),
        search=SearchConfig.from_dict(data.get("search"), f"{source}: search"),
        run=RunConfig.from_dict(data.get("run"), f"{source}: run"),
        source=source,
        retrain=RetrainConfig.from_dict(data.get("retrain"), f"{source}: retrain"),
    )


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    data = apply_overrides(load_yaml(path), overrides or [])
    return config_from_dict(data, str(path))
