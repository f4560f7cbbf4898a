"""The `xla` timer (torch-xla, optional: `pip install 'fbnas[tpu]'`): `torch_xla.sync()` after
each call and `xm.wait_device_ops()` before reading the clock; `prepare` runs untimed calls to
absorb compilation, and `check()` raises if timed calls compiled anything new."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import torch
from torch import nn

from fbnas.backends.base import Runnable, Timer
from fbnas.errors import FbnasError, first_line

XLA_INSTALL = "pip install 'fbnas[tpu]'"


def _import_xla():
    """torch_xla's model and metrics modules; a missing torch-xla, or one built for another
    torch, is a one-line error naming the extra (torch-xla pins the torch it was built for)."""
    try:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met
    except (ImportError, OSError) as e:  # OSError: a .so built against another torch
        raise FbnasError(f"timer: --device xla needs torch-xla built for torch "
                         f"{torch.__version__} ({first_line(e)}); install the extra: {XLA_INSTALL} "
                         "with its matching torch") from None
    want = _major_minor(torch.__version__)
    got = _major_minor(getattr(torch_xla, "__version__", ""))
    if got != want:
        raise FbnasError(f"timer: torch-xla {torch_xla.__version__} does not match torch "
                         f"{torch.__version__} (torch-xla {got[0]}.{got[1]} needs torch "
                         f"{got[0]}.{got[1]}); install the matching pair: {XLA_INSTALL}")
    return torch_xla, xm, met


def _major_minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (-1, -1)


class XlaTimer(Timer):
    """XLA through PJRT (TPU, or the CPU client with PJRT_DEVICE=CPU): each call is traced and
    its graph executed by `torch_xla.sync()` with the output kept alive (a dropped output
    leaves nothing to run), `xm.wait_device_ops()` before each clock read, wall clock.
    Each runnable is compiled by two untimed calls at prepare; timings during which the
    compile count grew (a graph that changes from call to call) are refused. Runs under
    `torch.no_grad()` (XLA tensors cannot be inference tensors). `threads` is recorded;
    on the CPU client it is applied only if the XLA runtime has not started yet, through
    XLA_FLAGS (intra-op threads of XLA's CPU backend), and recorded as applied or not."""

    backend = "xla"
    per_call_overhead = True  # build_table times an empty graph and takes it off entries

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.torch_xla, self.xm, self.met = _import_xla()
        self._threads_applied = self._apply_xla_threads()
        self._compiles_after_prepare: int | None = None

    def _apply_xla_threads(self) -> bool:
        """Ask XLA's CPU backend for `threads` intra-op threads (before its client starts)."""
        started = getattr(getattr(self.torch_xla, "_XLAC", None),
                          "_xla_runtime_is_initialized", None)
        if started is None or started():
            return False  # the client exists: its thread count is fixed
        flags = os.environ.get("XLA_FLAGS", "")
        if "intra_op_parallelism_threads" in flags or "xla_cpu_multi_thread_eigen" in flags:
            return False  # the user's own setting wins; recorded as not ours
        extra = f"--xla_cpu_multi_thread_eigen={'false' if self.threads == 1 else 'true'}"
        os.environ["XLA_FLAGS"] = f"{flags} {extra}".strip()
        return True

    def _device(self) -> torch.device:
        dev = getattr(self.torch_xla, "device", None)
        return dev() if callable(dev) else self.xm.xla_device()

    def _sync(self) -> None:
        sync = getattr(self.torch_xla, "sync", None)
        sync() if callable(sync) else self.xm.mark_step()

    def device_name(self) -> str:
        try:
            return f"XLA {self.xm.xla_device_hw(self._device())}"
        except Exception:  # noqa: BLE001 - older torch-xla: the device string will do
            return str(self._device())

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["mode"] = "eval+no_grad"
        d["runtime"] = "torch_xla"
        d["runtime_version"] = getattr(self.torch_xla, "__version__", "unknown")
        d["pjrt_device"] = os.environ.get("PJRT_DEVICE", "")
        d["xla_threads_applied"] = self._threads_applied
        return d

    def empty_program(self) -> nn.Module:
        # an Identity leaves no graph to execute; one trivial op makes it a real (empty) call
        return _Touch()

    def _compiles(self) -> int:
        data = self.met.metric_data("CompileTime")
        return int(data[0]) if data else 0

    def _step(self, fn) -> None:
        out = fn()  # kept alive through the sync: the graph executes only what is live
        self._sync()
        del out

    def _after_prepare(self, run: Runnable) -> None:
        # Untimed calls compile the graph (twice, in case the first call traces differently).
        with self, torch.no_grad():
            for _ in range(2):
                self._step(run.fn)
            self.xm.wait_device_ops()
        self._compiles_after_prepare = self._compiles()

    def sample(self, run: Runnable, number: int) -> float:
        fn = run.fn
        with self, torch.no_grad():
            self.xm.wait_device_ops()
            t0 = time.perf_counter_ns()
            for _ in range(number):
                self._step(fn)
            self.xm.wait_device_ops()
            t1 = time.perf_counter_ns()
        return (t1 - t0) * 1e-9 / number

    def check(self) -> None:
        if self._compiles_after_prepare is not None and \
                self._compiles() != self._compiles_after_prepare:
            raise FbnasError("timer: XLA recompiled during timed runs "
                             f"({self._compiles() - self._compiles_after_prepare} new "
                             "compilations: the graph changes from call to call); the timings "
                             "include compile time and are refused")


class _Touch(nn.Module):
    """x·1: the smallest graph XLA still executes (the per-call overhead probe)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0
