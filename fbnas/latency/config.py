"""The `latency:` section of a config: where the per-(layer, op) costs come from and the timer
settings (`make_timer`, `for_timing`: the one merge of a table's settings, the config's and the
command line's)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fbnas.backends import DTYPES, QUANTIZATIONS, TIMERS, Timer, make_timer
from fbnas.backends.allocator import resolve as resolve_allocator
from fbnas.errors import FbnasError
from fbnas.io import load_config_data
from fbnas.latency.kinds import COST_KINDS
from fbnas.settings import read_fields, setting


@dataclass(frozen=True)
class LatencyConfig:
    """Where the per-(layer, op) costs come from.

    cost: latency (µs, from `table` or measured on `device`), flops (MFLOPs) or params (K).
    table: a latency table file; if absent, `fbnas train` measures one on `device` (or reuses
    a cached table for the same space signatures and device settings from `cache_dir`).
    """

    cost: str = setting("latency", "str", choices=COST_KINDS)
    table: str | None = setting(None, "str")
    # a timer backend of fbnas.backends (executorch / ort: exported runtimes, docs/latency.md)
    device: str = setting("cpu", "str", choices=TIMERS)
    threads: int = setting(1, "int", min=1)
    batch: int = setting(1, "int", min=1)
    dtype: str = setting("float32", "str", choices=tuple(DTYPES))
    channels_last: bool = setting(False, "bool")
    # none, or int8: the programs timed quantized as the runtime deploys them (executorch:
    # PT2E + XNNPACK; ort: static QDQ); a property of the table (docs/latency.md, "int8")
    quantization: str = setting("none", "str", choices=QUANTIZATIONS)
    # cpu: the memory allocator timed under (fbnas.backends.allocator; None: retain on cpu)
    allocator: str | None = setting(None, "str")
    cache_dir: str = setting("~/.cache/fbnas/tables", "str")

    @classmethod
    def from_dict(cls, d: Any, where: str = "latency") -> LatencyConfig:
        cfg = read_fields(cls, d, where)
        if cfg.allocator is not None:
            if not TIMERS.get(cfg.device).host and cfg.allocator != "system":
                raise FbnasError(f"{where}: allocator: {cfg.allocator!r} applies to device cpu "
                                 f"only; {cfg.device} timings use 'system'")
            resolve_allocator(cfg.allocator, f"{where}: allocator")
        return cfg

    @classmethod
    def from_file(cls, path: str | Path | None) -> LatencyConfig:
        """The `latency:` section of the config file at `path` (every default without a file
        or a section)."""
        if not path:
            return cls()
        path, data = load_config_data(path)
        return cls.from_dict(data.get("latency"), f"{path}: latency")

    def for_timing(self, meta: dict[str, Any] | None = None, **flags: Any) -> LatencyConfig:
        """The one merge of timer settings (`fbnas latency build / measure / validate`): these
        settings (a config's `latency:` section), a latency table's metadata `meta` over them,
        then the command-line `flags` given over both (device, threads, batch, dtype,
        channels_last, allocator, quantization; None, False or "" is not given). The device
        is the flag's, else the table's backend where it is registered, else this section's;
        the table's allocator is taken only for the backend it was timed on. Not checked here:
        the timer checks what it is given (`make_timer`)."""
        meta = meta or {}
        given = {k: v for k, v in flags.items() if v is not None and v is not False and v != ""}
        device = given.pop("device", None) or (
            meta["backend"] if meta.get("backend") in TIMERS else self.device)
        merged: dict[str, Any] = {"device": device}
        if meta:
            merged.update(threads=meta.get("threads"), batch=meta.get("batch"),
                          dtype=meta.get("dtype"),
                          channels_last=meta.get("memory_format") == "channels_last",
                          quantization=meta.get("quantization", "none"))
            if meta.get("backend") == device:
                merged["allocator"] = meta.get("allocator", "system")
        return replace(self, **{**merged, **given})

    def make_timer(self, **backend_kw: Any) -> Timer:
        """The timer these settings describe (device, threads, batch, dtype, layout,
        allocator, quantization); `backend_kw` go to the backend (cpu: clock)."""
        return make_timer(self.device, threads=self.threads, batch=self.batch, dtype=self.dtype,
                          channels_last=self.channels_last, allocator=self.allocator,
                          quantization=self.quantization, **backend_kw)
