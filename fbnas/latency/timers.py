"""Timers per backend behind one interface: cpu, cuda, xla (torch-xla, optional) and fake.

A timer turns a module into a `Runnable` (module in eval mode on the device, in the table's
dtype and memory format, with a fixed random input of the table's batch size) and times
`number` consecutive forward passes of it under `torch.inference_mode()`, returning seconds
per call. Whatever the backend, the clock is read only after the device has finished:

- cpu:  `time.perf_counter_ns`, a fixed and recorded thread count (default 1), and a fixed and
        recorded memory allocator (`fbnas.latency.allocator`; default `retain`, timed in a
        worker process started with it);
- cuda: CUDA events recorded around the loop, read after `Event.synchronize()`; warm-up runs
        absorb cuDNN autotuning (`cudnn.benchmark` is switched on and recorded);
- xla:  `xm.mark_step()` after each call and `xm.wait_device_ops()` before reading the clock;
        `prepare` runs untimed calls to absorb compilation, and `check()` raises if timed
        calls compiled anything new;
- fake: no clock at all: a deterministic cost from the module's FLOPs and layer count, with
        optional seeded noise and machine drift, so that build and validate are testable.

The interleaving, the reference op and the statistics live in `fbnas.latency.measure`; a
timer only times.
"""

from __future__ import annotations

import math
import os
import platform
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fbnas.errors import FbnasError, first_line
from fbnas.latency import allocator as alloc

DEVICES = ("cpu", "cuda", "xla", "fake", "executorch", "ort")
# host-CPU backends: the allocator setting applies to them
HOST_DEVICES = ("cpu", "fake", "executorch", "ort")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class Runnable:
    """One module ready to time: `fn()` runs a single forward pass on the prepared input."""

    fn: Callable[[], Any]
    module: nn.Module
    cost_s: float = 0.0  # the fake timer's modelled time per call (unused by real backends)
    label: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def cpu_model() -> str:
    """The CPU's marketing name, from /proc/cpuinfo where there is one."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


class Timer:
    """Base class: subclasses set `backend` and implement `_to_device`, `sample`."""

    backend = "base"

    # The host allocator shapes CPU timings only (docs/latency.md); device backends keep the
    # system one, and refuse another.
    allocator_default = alloc.SYSTEM
    allocator_choice = False

    def __init__(self, threads: int = 1, batch: int = 1, dtype: str = "float32",
                 channels_last: bool = False, allocator: str | None = None):
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise FbnasError(f"timer: threads must be a positive integer, got {threads!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise FbnasError(f"timer: batch must be a positive integer, got {batch!r}")
        if dtype not in DTYPES:
            raise FbnasError(f"timer: dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
        self.threads, self.batch, self.dtype = threads, batch, dtype
        self.channels_last = bool(channels_last)
        if allocator not in (None, alloc.SYSTEM) and not self.allocator_choice:
            raise FbnasError(f"timer: allocator {allocator!r} applies to the cpu backend; "
                             f"{self.backend} timings use allocator 'system'")
        self.allocator, self.allocator_library = alloc.resolve(
            self.allocator_default if allocator is None else allocator, "timer: allocator")
        self._saved_threads: int | None = None
        self._depth = 0

    # ---- thread count: fixed while the timer is active ------------------------------------
    def __enter__(self) -> Timer:
        if self._depth == 0:
            self._saved_threads = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            self._activate()
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._deactivate()
            if self._saved_threads is not None:
                torch.set_num_threads(self._saved_threads)

    def _activate(self) -> None:
        """Backend hook: global settings to hold while timing (restored by _deactivate)."""

    def _deactivate(self) -> None:
        pass

    # ---- description recorded in a table's meta --------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device_name": self.device_name(),
            "cpu_model": cpu_model(),
            "threads": self.threads,
            "torch_version": torch.__version__,
            "batch": self.batch,
            "dtype": self.dtype,
            "memory_format": "channels_last" if self.channels_last else "contiguous",
            "mode": "eval+inference_mode",
            **alloc.describe(self.allocator, self.allocator_library),
        }

    def device_name(self) -> str:
        return cpu_model()

    # ---- preparing and timing ----------------------------------------------------------------
    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def _device(self) -> torch.device:
        return torch.device("cpu")

    def prepare(self, module: nn.Module, input_chw: tuple[int, int, int],
                label: str = "") -> Runnable:
        """Put `module` in eval mode on the device and bind it to a fixed random input."""
        dev = self._device()
        mf = torch.channels_last if self.channels_last else torch.contiguous_format
        if isinstance(module, torch.jit.ScriptModule):
            # an exported model is timed as it was exported: it cannot be cast in place
            module = module.eval()
            p = next(iter(module.parameters()), None)
            if p is not None and (p.device.type != dev.type or p.dtype != self.torch_dtype):
                raise FbnasError(f"timer: a TorchScript model ({p.dtype} on {p.device.type}) is "
                                 f"timed as exported; export it for {self.torch_dtype} on "
                                 f"{dev.type} or time the retrain checkpoint instead")
        else:
            # the layout is the timer's, whatever the model was trained in (retrain.channels_last)
            module = module.eval().to(device=dev, dtype=self.torch_dtype).to(memory_format=mf)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(self.batch, *input_chw, generator=gen).to(dev, self.torch_dtype)
        x = x.contiguous(memory_format=mf)

        def fn():
            return module(x)

        run = Runnable(fn, module, label=label)
        self._after_prepare(run)
        return run

    def _after_prepare(self, run: Runnable) -> None:
        """Backend hook (xla: compile now, outside any timed call)."""

    def empty_program(self) -> nn.Module:
        """What a timer with `per_call_overhead` times as a call that computes nothing."""
        return nn.Identity()

    def sample(self, run: Runnable, number: int) -> float:
        """Seconds per call over `number` consecutive calls, device work included."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise if something invalidated the timings taken so far (xla: recompilation)."""


class CpuTimer(Timer):
    """CPU: a fixed thread count, inference mode, and one of two clocks.

    `clock="thread"` (the default with 1 thread) reads the calling thread's CPU time
    (CLOCK_THREAD_CPUTIME_ID). With one thread PyTorch runs every op inline on that thread,
    so on an idle machine this equals wall time; on a shared machine it leaves out the time
    the thread was descheduled for other processes, which wall time would count as latency.
    Wall time is read as well, and the share of time lost to descheduling is recorded.
    `clock="wall"` (the default with several threads, where CPU time is not latency) reads
    `time.perf_counter_ns`.
    """

    backend = "cpu"
    allocator_default = alloc.DEFAULT
    allocator_choice = True

    def __init__(self, *args, clock: str | None = None, **kw):
        super().__init__(*args, **kw)
        clock = clock or ("thread" if self.threads == 1 else "wall")
        if clock not in ("thread", "wall"):
            raise FbnasError(f"timer: clock must be thread or wall, got {clock!r}")
        if clock == "thread" and self.threads != 1:
            raise FbnasError("timer: clock 'thread' measures one thread; with "
                             f"{self.threads} threads use clock 'wall'")
        self.clock = clock
        self.wall_s = 0.0
        self.cpu_s = 0.0

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["clock"] = self.clock
        return d

    def descheduled_share(self) -> float:
        """Share of wall time the timing thread was not running (other processes, steal)."""
        return max(0.0, 1.0 - self.cpu_s / self.wall_s) if self.wall_s > 0 else 0.0

    def sample(self, run: Runnable, number: int) -> float:
        fn = run.fn
        with self, torch.inference_mode():
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            for _ in range(number):
                fn()
            t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        wall, cpu = (t1 - t0) * 1e-9, (c1 - c0) * 1e-9
        self.wall_s += wall
        self.cpu_s += cpu
        return (cpu if self.clock == "thread" else wall) / number


class CudaTimer(Timer):
    """CUDA: events around the loop, read after the end event has completed."""

    backend = "cuda"

    def __init__(self, *args, device_index: int = 0, **kw):
        super().__init__(*args, **kw)
        if not torch.cuda.is_available():
            raise FbnasError("timer: --device cuda asked for, but torch sees no CUDA device "
                             f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
        self.index = device_index
        self._saved_benchmark = torch.backends.cudnn.benchmark

    # cuDNN picks its fastest algorithm per shape while timing (as deployed code would);
    # the warm-up calls of every entry absorb that autotuning.
    def _activate(self) -> None:
        self._saved_benchmark = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True

    def _deactivate(self) -> None:
        torch.backends.cudnn.benchmark = self._saved_benchmark

    def _device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.index)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["gpu_name"] = self.device_name()
        d["cuda_version"] = torch.version.cuda
        d["cudnn_version"] = torch.backends.cudnn.version()
        d["cudnn_benchmark"] = True
        return d

    def sample(self, run: Runnable, number: int) -> float:
        fn = run.fn
        with self, torch.inference_mode(), torch.cuda.device(self.index):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(number):
                fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        return ms * 1e-3 / number


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


class FakeTimer(Timer):
    """Deterministic stand-in for a device: time per call = overhead per leaf module + FLOPs /
    throughput, times seeded noise and a slow 'machine speed' drift. For tests only."""

    backend = "fake"
    allocator_choice = True  # tests run it in a worker; in process by default

    def __init__(self, *args, noise: float = 0.0, drift: float = 0.0, seed: int = 0,
                 flops_per_s: float = 2e9, overhead_s: float = 4e-6, **kw):
        super().__init__(*args, **kw)
        self.noise, self.drift = float(noise), float(drift)
        self.flops_per_s, self.overhead_s = flops_per_s, overhead_s
        self.rng = random.Random(seed)
        self.samples_taken = 0

    def device_name(self) -> str:
        return "fake device"

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["cpu_model"] = "fake"
        d["torch_version"] = "fake"  # so that fake tables are identical across torch versions
        return d

    def prepare(self, module: nn.Module, input_chw: tuple[int, int, int],
                label: str = "") -> Runnable:
        # Shapes are all the fake needs: run on the meta device, which computes nothing.
        where = "meta"
        if isinstance(module, torch.jit.ScriptModule):  # cannot move: count on the CPU
            module, where = module.eval(), "cpu"
        else:
            module = module.eval().to("meta")
        leaves = sum(1 for m in module.modules() if not list(m.children()))
        cost = self.batch * conv_linear_flops(module, input_chw, where) / self.flops_per_s \
            + leaves * self.overhead_s
        return Runnable(lambda: None, module, cost_s=cost, label=label)

    def speed(self) -> float:
        """The fake machine's slowness factor now (1 = nominal)."""
        return 1.0 + self.drift * (0.5 + 0.5 * math.sin(self.samples_taken / 7.0))

    def sample(self, run: Runnable, number: int) -> float:
        self.samples_taken += 1
        jitter = 1.0 + self.noise * abs(self.rng.gauss(0.0, 1.0))
        return run.cost_s * self.speed() * jitter


def conv_linear_flops(module: nn.Module, input_chw: tuple[int, int, int],
                      device: str = "cpu") -> int:
    """FLOPs (2 per multiply-add) of the convolutions and linear layers in one forward at
    batch 1, by forward hooks: a cheap stand-in for torch's FlopCounterMode."""
    total = 0

    def hook(m, inp, out):
        nonlocal total
        if isinstance(m, nn.Conv2d):
            k = m.weight.shape[1] * m.weight.shape[2] * m.weight.shape[3]
            total += 2 * out.numel() * k
        else:
            total += 2 * out.numel() * m.in_features

    handles = [m.register_forward_hook(hook) for m in module.modules()
               if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        with torch.inference_mode():
            module(torch.zeros(1, *input_chw, device=device))
    finally:
        for h in handles:
            h.remove()
    return total


def make_timer(device: str = "cpu", threads: int | None = None, batch: int = 1,
               dtype: str = "float32", channels_last: bool = False,
               allocator: str | None = None, **kw) -> Timer:
    """A timer for `device` ('cpu', 'cuda', 'xla', 'fake', or the exported runtimes
    'executorch' and 'ort' of `fbnas.latency.runtimes`). `threads` defaults to 1 on CPU
    (and is recorded either way); `allocator` (cpu: default `retain`, see
    `fbnas.latency.allocator`); extra keywords go to the backend (fake: noise, drift, seed)."""
    if device not in DEVICES:
        raise FbnasError(f"timer: device must be one of {', '.join(DEVICES)}; got {device!r}")
    if device in ("executorch", "ort"):
        from fbnas.latency.runtimes import ExecuTorchTimer, OrtTimer
        cls = {"executorch": ExecuTorchTimer, "ort": OrtTimer}[device]
    else:
        cls = {"cpu": CpuTimer, "cuda": CudaTimer, "xla": XlaTimer, "fake": FakeTimer}[device]
    return cls(threads=1 if threads is None else threads, batch=batch, dtype=dtype,
               channels_last=channels_last, allocator=allocator, **kw)
