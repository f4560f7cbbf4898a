"""What the timers of exported runtimes share (ONNX Runtime in `onnx.py`, ExecuTorch in
`executorch.py`, the next runtime in its own file): export and lower a module once, cache the
program on disk, bind it to a fixed random input, and time calls with the CPU timer's clocks,
so the interleaved, drift-compensated protocol of `fbnas.latency.measure` (reference op
included, itself run through the runtime) is the same as eager's.

Lowering takes seconds per block, so programs are cached on disk by what they compute (runtime
and version, the module's structure, input shape and batch), under `cache_dir`
(default `~/.cache/fbnas/exported`, or $FBNAS_EXPORT_CACHE).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fbnas.backends.base import Runnable
from fbnas.backends.cpu import CpuTimer
from fbnas.errors import FbnasError
from fbnas.io import atomic_write, write_json_atomic


def default_cache_dir() -> Path:
    return Path(os.environ.get("FBNAS_EXPORT_CACHE",
                               Path.home() / ".cache" / "fbnas" / "exported"))


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class ExportedTimer(CpuTimer):
    """Base of the runtime timers: export, lower (cached), bind an input, time calls.
    A runtime supplies `packages` (the first one's version is recorded), `install`, `suffix`
    and `_lower` / `_load` / `_caller`."""

    runtime = ""
    suffix = ""
    packages: tuple[str, ...] = ()
    install = ""
    per_call_overhead = True  # build_table times an empty program and takes it off entries
    # names how an int8 program is quantized, in its cache key: a changed recipe re-lowers
    int8_recipe = "pt2e"

    def __init__(self, *args, cache_dir: str | os.PathLike | None = None, **kw):
        super().__init__(*args, **kw)
        if self.dtype != "float32" or self.channels_last:
            raise FbnasError(f"timer: device {self.backend!r} times float32 contiguous programs "
                             f"(the runtime picks its own layout); got {self.dtype}"
                             f"{', channels_last' if self.channels_last else ''}")
        self.runtime_version = self.require()
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self._loaded: dict[str, Any] = {}

    @classmethod
    def require(cls) -> str:
        """The runtime's version; a one-line error naming how to install it if it is missing."""
        missing = [p for p in cls.packages if _version(p) is None]
        if missing:
            raise FbnasError(f"timer: device {cls.backend!r} needs {', '.join(missing)}, not "
                             f"installed; {cls.install}")
        return _version(cls.packages[0])

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_loaded"] = {}  # runtime objects stay in their process (a worker reloads from disk)
        return d

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update({"runtime": self.runtime, "runtime_version": self.runtime_version,
                  "mode": "exported (torch.export), inference"})
        return d

    def device_name(self) -> str:
        return f"{super().device_name()} ({self.runtime} {self.runtime_version})"

    # ---- preparing ------------------------------------------------------------------------
    def cache_key(self, module: nn.Module, input_chw: tuple[int, int, int]) -> str:
        h = hashlib.sha256()
        for part in (self.runtime, self.runtime_version, torch.__version__, repr(module),
                     str(tuple(input_chw)), str(self.batch),
                     *(() if self.quantization == "none" else (self.quantization,
                                                               self.int8_recipe))):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:24]

    def prepare(self, module: nn.Module, input_chw: tuple[int, int, int],
                label: str = "") -> Runnable:
        if isinstance(module, torch.jit.ScriptModule):
            raise FbnasError(f"timer: device {self.backend!r} exports with torch.export and "
                             "cannot take a TorchScript model; time its .pt2 program or the "
                             "retrain checkpoint")
        module = module.eval().to(device="cpu", dtype=torch.float32)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(self.batch, *input_chw, generator=gen)
        key = self.cache_key(module, input_chw)
        if key not in self._loaded:
            path = self.cache_dir / self.runtime / f"{key}{self.suffix}"
            info_path = path.with_suffix(".json")
            if not path.is_file():
                program, info = self._lower(module, x, label or "module")
                write_json_atomic(info_path, info)
                atomic_write(path, lambda f: f.write(program), mode="wb")
            self._loaded[key] = (self._load(path), _read_info(info_path))
        program, info = self._loaded[key]
        call = self._caller(program, x)
        run = Runnable(call, module, label=label)
        run.extra["stats"] = {k: v for k, v in info.items() if isinstance(v, (int, float))}
        run.extra["cache"] = key
        return run

    def _lower(self, module: nn.Module, x: torch.Tensor, where: str) -> tuple[bytes, dict]:
        """Export and lower `module` for input `x`, quantized as `self.quantization` says
        (int8: calibrated on `calibration_inputs(x)`): (the program file's bytes, what to
        record; its numbers go into table entries)."""
        raise NotImplementedError

    def _load(self, path: Path):
        raise NotImplementedError

    def _caller(self, program, x: torch.Tensor):
        raise NotImplementedError

    def run_once(self, run: Runnable) -> torch.Tensor:
        """One call's output as a tensor (for checking a runtime against eager)."""
        out = run.fn()
        if isinstance(out, (list, tuple)):
            out = out[0]
        return torch.as_tensor(np.asarray(out)) if not isinstance(out, torch.Tensor) else out


CALIBRATION_BATCHES = 8  # inputs an int8 program's activation ranges are observed on


def calibration_inputs(x: torch.Tensor, n: int = CALIBRATION_BATCHES) -> list[torch.Tensor]:
    """`n` inputs shaped like `x` for post-training calibration of a timed block: `x` and
    seeded normal draws (a block's timing does not depend on what the ranges are)."""
    gen = torch.Generator().manual_seed(1)
    return [x, *(torch.randn(x.shape, generator=gen, dtype=x.dtype) for _ in range(n - 1))]


def _read_info(path: Path) -> dict:
    """A program's record; {} when it is missing or unreadable (it only annotates entries)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
