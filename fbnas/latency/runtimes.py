"""Timers for exported runtimes: ExecuTorch (XNNPACK) and ONNX Runtime (CPU).

A deployed network does not run in PyTorch eager: ExecuTorch's XNNPACK delegate fuses ops and
has its own depthwise kernels, ONNX Runtime folds BN into convolutions. These timers time what
the runtime runs. `prepare` exports the module with `torch.export` (ONNX: the exporter of
`fbnas export`), hands the program to the runtime, and binds it to a fixed random input;
`sample` times consecutive calls with the CPU timer's clocks, so the interleaved,
drift-compensated protocol of `fbnas.latency.measure` (reference op included, itself run
through the runtime) is the same as eager's.

- `executorch`: `to_edge_transform_and_lower(..., XnnpackPartitioner())`, run through
  `executorch.runtime`. What XNNPACK does not take falls back to the portable kernels; the
  share of delegated graph nodes is recorded per entry (`delegated`; 1.0 = fully delegated).
  ExecuTorch's threadpool is sized to the timer's thread count before the first program loads
  (and recorded); it stays so for the process (resizing it breaks loaded delegates).
- `ort`: ONNX Runtime's CPU execution provider, `intra_op_num_threads` = the thread count,
  one inter-op thread, sequential execution, all graph optimisations.

Lowering takes seconds per block, so programs are cached on disk by what they compute (runtime
and version, the module's structure, input shape and batch), under `cache_dir`
(default `~/.cache/fbnas/exported`). Both runtimes are optional: `pip install
'fbnas[executorch]'`, `'fbnas[onnx]'` (or `'fbnas[runtimes]'` for both).
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

from fbnas.errors import FbnasError, first_line
from fbnas.export import OnnxModule, PteModule, onnx_proto
from fbnas.io import atomic_write, write_json_atomic
from fbnas.latency.timers import CpuTimer, Runnable

RUNTIMES = ("executorch", "ort")
INSTALL = {"executorch": "pip install 'fbnas[executorch]'",
           "ort": "pip install 'fbnas[onnx]'"}
PACKAGES = {"executorch": ("executorch",), "ort": ("onnxruntime", "onnx", "onnxscript")}


def default_cache_dir() -> Path:
    return Path(os.environ.get("FBNAS_EXPORT_CACHE",
                               Path.home() / ".cache" / "fbnas" / "exported"))


def require(runtime: str) -> str:
    """The runtime's version; a one-line error naming how to install it if it is missing."""
    missing = [p for p in PACKAGES[runtime] if _version(p) is None]
    if missing:
        raise FbnasError(f"timer: device {runtime!r} needs {', '.join(missing)}, not installed; "
                         f"{INSTALL[runtime]}")
    return _version(PACKAGES[runtime][0])


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class ExportedTimer(CpuTimer):
    """Base of the runtime timers: export, lower (cached), bind an input, time calls."""

    runtime = ""
    suffix = ""
    per_call_overhead = True  # build_table times an empty program and takes it off entries

    def __init__(self, *args, cache_dir: str | os.PathLike | None = None, **kw):
        super().__init__(*args, **kw)
        if self.dtype != "float32" or self.channels_last:
            raise FbnasError(f"timer: device {self.backend!r} times float32 contiguous programs "
                             f"(the runtime picks its own layout); got {self.dtype}"
                             f"{', channels_last' if self.channels_last else ''}")
        self.runtime_version = require(self.runtime)
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self._loaded: dict[str, Any] = {}

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
                     str(tuple(input_chw)), str(self.batch)):
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
        """Export and lower `module` for input `x`: (the program file's bytes, what to record;
        its numbers go into table entries)."""
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


class ExecuTorchTimer(ExportedTimer):
    """ExecuTorch with the XNNPACK delegate (see module docstring)."""

    backend = "executorch"
    runtime = "executorch"
    suffix = ".pte"

    def _activate(self) -> None:
        self._pool()

    def _pool(self) -> None:
        if size_executorch_pool(self.threads):
            self._loaded.clear()  # programs loaded under the old pool no longer run

    def _lower(self, module, x, where):
        return lower_executorch(module, x, where=where)

    def _load(self, path):
        self._pool()
        try:
            return PteModule(path)
        except Exception as e:
            raise FbnasError(f"timer: executorch cannot load {path} ({first_line(e)})") from None

    def _caller(self, pte, x):
        method = pte.method
        n = method.metadata.num_inputs()
        if n not in (0, 1):
            raise FbnasError(f"timer: an executorch program with {n} inputs; fbnas times "
                             "single-input networks")
        # an op-free block (identity `skip`) lowers to a program that does not read its input
        inputs = [x] if n == 1 else []

        def call():
            return method.execute(inputs)
        call.keep = pte  # noqa: B018 (lifetime: the method points into its program)
        return call


class OrtTimer(ExportedTimer):
    """ONNX Runtime, CPU execution provider (see module docstring)."""

    backend = "ort"
    runtime = "ort"
    suffix = ".onnx"

    def _lower(self, module, x, where):
        record: dict[str, Any] = {}
        proto = onnx_proto(module.eval(), x, record, where=where)
        return proto.SerializeToString(), {"exporter": record["method"]}

    def _load(self, path):
        try:  # fbnas export's session: intra-op threads as given, one inter-op thread
            return OnnxModule(path, threads=self.threads).session
        except Exception as e:
            raise FbnasError(f"timer: onnxruntime cannot load {path} ({first_line(e)})") from None

    def _caller(self, session, x):
        feed = {session.get_inputs()[0].name: x.numpy()}

        def call():
            return session.run(None, feed)
        return call


# ---- exporting ----------------------------------------------------------------------------
def lower_executorch(module: nn.Module, x: torch.Tensor, where: str = "module"
                     ) -> tuple[bytes, dict[str, Any]]:
    """`module` on input `x` as an XNNPACK-lowered ExecuTorch program: (.pte bytes, info with
    `delegated`, the share of compute nodes XNNPACK took, and the node counts)."""
    require("executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    try:
        with torch.no_grad():
            ep = torch.export.export(module.eval(), (x,))
        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        d = get_delegation_info(edge.exported_program().graph_module)
        buf = edge.to_executorch().buffer
    except FbnasError:
        raise
    except Exception as e:
        raise FbnasError(f"{where}: cannot lower to executorch/XNNPACK ({first_line(e)})"
                         ) from None
    # `getitem` nodes only unpack a delegate's outputs: count the ops that compute
    ops = {k: v for k, v in d.delegation_by_operator.items() if k != "getitem"}
    deleg = sum(v.delegated for v in ops.values())
    portable = sum(v.non_delegated for v in ops.values())
    return bytes(buf), {"delegated": deleg / (deleg + portable) if deleg + portable else 1.0,
                        "delegated_ops": deleg, "portable_ops": portable}


# ---- small helpers ------------------------------------------------------------------------
def _read_info(path: Path) -> dict:
    """A program's record; {} when it is missing or unreadable (it only annotates entries)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def size_executorch_pool(threads: int) -> bool:
    """Size ExecuTorch's threadpool to `threads`; True if it was resized. Resizing invalidates
    the XNNPACK delegates loaded under the old pool (they hang or crash when called), so size
    it before the first program loads and leave it: a process keeps one thread count."""
    from executorch.extension.pybindings import portable_lib

    if portable_lib._threadpool_get_thread_count() == threads:
        return False
    portable_lib._unsafe_reset_threadpool(threads)
    return True
