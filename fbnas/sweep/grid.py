"""A sweep's grid: its axes (`--grid KEY=V1,V2`, or a loss parameter's `--beta` / `--target`
values), the config of one point of it, its label, and the searches a sweep's folder holds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from fbnas.config import Config, apply_overrides, config_from_dict
from fbnas.errors import FbnasError
from fbnas.loss import parse_target
from fbnas.runs.files import RunFiles
from fbnas.sweep import PARAMS, WEIGHTS


@dataclass(frozen=True)
class Axis:
    """One axis of a sweep's grid: a config key and its values (a loss parameter's values are
    parsed as `--alpha/--beta/--lambda/--target` parse them)."""
    key: str
    values: tuple[float | str, ...]

    @property
    def short(self) -> str:
        return self.key.rsplit(".", 1)[-1]

    @property
    def loss_param(self) -> str | None:
        """`beta` for `loss.beta` (a sweep's special loss parameters), else None."""
        part = self.key.removeprefix("loss.")
        return part if self.key.startswith("loss.") and part in PARAMS else None


def parse_axis(spec: str) -> Axis:
    """`KEY=V1,V2,...` (a `--grid` argument) as an Axis; a one-line error for a malformed one."""
    key, eq, raw = spec.partition("=")
    key = key.strip()
    if not eq or not key or not raw.strip():
        raise FbnasError(f"--grid: {spec!r} is not KEY=V1,V2,... (e.g. search.mode=full,"
                         "reinforce)")
    if "." not in key:
        raise FbnasError(f"--grid: {key!r} names no section (write section.key, e.g. "
                         "search.seed)")
    part = key.removeprefix("loss.")
    if key.startswith("loss.") and part in PARAMS:
        return Axis(key, tuple(parse_values(raw, part)))
    vals = [v.strip() for v in raw.split(",") if v.strip()]
    if len(set(vals)) != len(vals):
        raise FbnasError(f"--grid: repeated value in {spec!r}")
    return Axis(key, tuple(vals))


def parse_values(raw: str, param: str) -> list[float | str]:
    """The swept values: numbers >= 0, and for --target also times and range positions
    (`1.2ms`, `900us`, `0.5x`), kept as written."""
    vals: list[float | str] = []
    for tok in raw.split(","):
        tok = tok.strip()
        if not tok:
            continue
        if param == "target" and tok[-1:].isalpha():
            parse_target(tok, f"--{param}")
            vals.append(tok)
            continue
        try:
            v = float(tok)
        except ValueError:
            raise FbnasError(f"--{param}: {tok!r} is not a number") from None
        if not math.isfinite(v) or v < 0:
            raise FbnasError(f"--{param}: {tok!r} must be a finite number >= 0")
        vals.append(v)
    if not vals:
        raise FbnasError(f"--{param}: give at least one value, e.g. --{param} 0,2,4")
    if len(set(vals)) != len(vals):
        raise FbnasError(f"--{param}: repeated value in {raw!r}")
    return vals


def fmt_value(v: float | str) -> str:
    return v if isinstance(v, str) else f"{v:g}"


def axis_label(param: str, v: float | str) -> str:
    return f"{param}{fmt_value(v)}"


def point_config(base: dict, param: str, value: float | str, search_dir: Path,
                 seed: int | None = None, settings: tuple = ()) -> Config:
    """The search config of one sweep point: `param = value` (a loss parameter given as
    `beta` or `loss.beta`: a 0 weight is kind ce), the other axes' `settings` ((key, value)
    pairs), `search.seed = seed` when given."""
    axes = ((param, value), *settings)
    sets = [f"{k}={fmt_value(v)}" for k, v in axes if not _is_loss(k)]
    d = apply_overrides(base, [f"run.dir={search_dir}", *sets]
                        + ([f"search.seed={seed}"] if seed is not None else []))
    for k, v in axes:
        if _is_loss(k):
            d = _set_loss(d, k.removeprefix("loss."), v)
    return config_from_dict(d, "sweep point " + ", ".join(f"{k}={fmt_value(v)}" for k, v in axes)
                            + (f" seed {seed}" if seed is not None else ""))


def _is_loss(key: str) -> bool:
    return key.removeprefix("loss.") in PARAMS and (key in PARAMS or key.startswith("loss."))


def _set_loss(d: dict, param: str, value: float | str) -> dict:
    loss = dict(d.get("loss") or {})
    if param in WEIGHTS and value == 0 and not isinstance(value, str):
        loss = {"kind": "ce", **({"label_smoothing": loss["label_smoothing"]}
                                 if "label_smoothing" in loss else {})}
    else:
        loss[param] = value
    return {**d, "loss": loss}


def searched_runs(paths: list[str | Path]) -> list[Path]:
    """Search run directories: each path that is one as it is, a sweep's folder as its finished
    searches (`search-<label>` holding the returned architecture), in label order."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        inner = sorted(d for d in p.glob("search-*") if RunFiles(d).arch.is_file())
        out += inner if inner and not RunFiles(p).checkpoint.is_file() else [p]
    return out
