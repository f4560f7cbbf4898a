"""What every backend builds on: the `Timer` interface (timer backends, registry TIMERS) and
the `Format` interface (export formats, registry FORMATS), with the code they share.

A timer turns a module into a `Runnable` (module in eval mode on the device, in the table's
dtype and memory format, with a fixed random input of the table's batch size) and times
`number` consecutive forward passes of it, returning seconds per call. Whatever the backend,
the clock is read only after the device has finished. The interleaving, the reference op and
the statistics live in `fbnas.latency.measure`; a timer only times.

An export format writes a child network to a file (with what fbnas knows of it, where the
format has room), loads the file back as a callable for the export check, reads the
architecture it carries, and hands `fbnas latency measure --model` a module to time.

    class CpuTimer(Timer): ...          # fbnas/backends/cpu.py
    FORMAT = OnnxFormat()               # fbnas/backends/onnx.py

each declared in TIMERS / FORMATS (fbnas/backends/__init__.py) by name and place.
`latency.device`, `--device` and `fbnas export --format` take their choices from those
registries.
"""

from __future__ import annotations

import contextlib
import json
import platform
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch
import yaml
from torch import nn

from fbnas.arch import Architecture
from fbnas.backends import DTYPES, QUANTIZATIONS, TIMERS
from fbnas.backends.allocator import SYSTEM
from fbnas.backends.allocator import describe as describe_allocator
from fbnas.backends.allocator import resolve as resolve_allocator
from fbnas.errors import FbnasError, first_line


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
    """Base class: subclasses set `backend` (their registered name) and implement `sample`
    (and `_device`, `prepare` hooks as needed)."""

    backend = "base"

    # The host allocator shapes CPU timings only (docs/latency.md): a backend that runs on the
    # host CPU sets `host` (the allocator setting applies to it); device backends keep the
    # system allocator, and refuse another.
    host = False
    allocator_default = SYSTEM
    clocks: tuple[str, ...] = ()  # the clocks it reads from (`clock=`; cpu: thread or wall)

    quantizations: tuple[str, ...] = ("none",)  # latency.quantization values it can time

    def __init__(self, threads: int = 1, batch: int = 1, dtype: str = "float32",
                 channels_last: bool = False, allocator: str | None = None,
                 quantization: str = "none"):
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise FbnasError(f"timer: threads must be a positive integer, got {threads!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise FbnasError(f"timer: batch must be a positive integer, got {batch!r}")
        if dtype not in DTYPES:
            raise FbnasError(f"timer: dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
        self.threads, self.batch, self.dtype = threads, batch, dtype
        if quantization not in QUANTIZATIONS:
            raise FbnasError(f"timer: quantization must be one of {', '.join(QUANTIZATIONS)}; "
                             f"got {quantization!r}")
        if quantization not in self.quantizations:
            can = [n for n, t in TIMERS.items() if quantization in t.quantizations]
            raise FbnasError(f"timer: device {self.backend!r} cannot time {quantization} "
                             f"programs; {quantization} is timed on "
                             f"{' or '.join(can) or 'no registered device'} (latency.device), "
                             "as the runtime deployed runs it")
        self.quantization = quantization
        self.channels_last = bool(channels_last)
        if allocator not in (None, SYSTEM) and not self.host:
            raise FbnasError(f"timer: allocator {allocator!r} applies to the cpu backend; "
                             f"{self.backend} timings use allocator 'system'")
        self.allocator, self.allocator_library = resolve_allocator(
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
            **describe_allocator(self.allocator, self.allocator_library),
            # only where quantized: an unquantized table's meta (and its cache key) as before
            **({} if self.quantization == "none" else {"quantization": self.quantization}),
        }

    def device_name(self) -> str:
        return cpu_model()

    # ---- preparing and timing ----------------------------------------------------------------
    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

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


def make_timer(device: str = "cpu", threads: int | None = None, batch: int = 1,
               dtype: str = "float32", channels_last: bool = False,
               allocator: str | None = None, quantization: str = "none", **kw) -> Timer:
    """A timer for `device`, a name registered in TIMERS ('cpu', 'cuda', 'xla', 'fake', and
    the exported runtimes 'ort' and 'executorch'). `threads` defaults to 1 on CPU (and is
    recorded either way); `allocator` (cpu: default `retain`, see
    `fbnas.backends.allocator`); extra keywords go to the backend (fake: noise, drift, seed)."""
    cls = TIMERS.get(device, "timer: device")
    return cls(threads=1 if threads is None else threads, batch=batch, dtype=dtype,
               channels_last=channels_last, allocator=allocator, quantization=quantization,
               **kw)


# ---- export formats ----------------------------------------------------------------------------
class Format:
    """An export format (`fbnas export --format NAME`): subclasses set `name` (their
    registered name), `suffixes` and `tolerance`, and implement `export` and `load`."""

    name = ""
    suffixes: tuple[str, ...] = ()  # the first is the one written; all are recognised
    # (rtol, atol) of the export check: |exported - eager| <= atol + rtol * |eager|,
    # elementwise on the logits (numpy.allclose), measured per format
    tolerance: tuple[float, float] = (1e-5, 1e-5)
    has_opset = False  # takes --opset
    # `fbnas export --quantize` values it writes (`none`: the float program; `int8`:
    # `export_int8`), and the check of an int8 file against its fake-quantized reference
    quantizations: tuple[str, ...] = ("none",)
    int8_tolerance: tuple[float, float] = (0.0, 0.0)

    @property
    def suffix(self) -> str:
        return self.suffixes[0]

    def require(self, verify: bool = True) -> None:
        """Raise FbnasError naming the extra to install when exporting (and checking, with
        `verify`) needs a package that is missing. Torch-only formats need nothing."""

    def dynamic_batch(self, asked: bool) -> bool:
        """Whether a file exported with the batch axis dynamic when `asked` takes any batch."""
        return asked

    def export(self, model: nn.Module, example: torch.Tensor, arch: Architecture,
               record: dict[str, Any], opset: int | None = None
               ) -> Callable[[BinaryIO], None]:
        """Export the eval-mode `model` of `arch` traced on `example` (batch axis dynamic if
        `record["dynamic_batch"]`); return what writes the file. Notes `method` (and what
        else is worth keeping) in `record`."""
        raise NotImplementedError

    def export_int8(self, model: nn.Module, example: torch.Tensor, arch: Architecture,
                    record: dict[str, Any], calibration: list[torch.Tensor],
                    opset: int | None = None
                    ) -> tuple[Callable[[BinaryIO], None], Callable[[Path], Any]]:
        """`export`, the program quantized to int8 post-training as its runtime deploys it, the
        activation ranges observed on `calibration` (batches shaped like `example`); with what
        the written file is checked against: its fake-quantized reference (quantize /
        dequantize computed in float), a function of the file's path returning a callable."""
        raise NotImplementedError

    def load(self, path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
        """The file as a callable: NCHW float tensor in, logits out (CPU)."""
        raise NotImplementedError

    def metadata(self, path: Path) -> dict[str, Any]:
        """{"arch_hash", "arch_name", "arch" (the architecture mapping), ...} of the file."""
        raise FbnasError(f"{path}: a {self.name} file holds no fbnas metadata")

    def load_file(self, path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
        """`load`, with the file and the packages checked and a failure told in one line."""
        if not path.is_file():
            raise FbnasError(f"{path}: no such file")
        self.require(verify=True)
        try:
            return self.load(path)
        except Exception as e:
            raise FbnasError(f"{path}: cannot load as {self.name} ({first_line(e)})") from None

    def read_metadata(self, path: Path) -> dict[str, Any]:
        """`metadata`, with the file checked and a failure told in one line."""
        if not path.is_file():
            raise FbnasError(f"{path}: no such file")
        try:
            return self.metadata(path)
        except FbnasError:
            raise
        except Exception as e:
            raise FbnasError(f"{path}: cannot read as {self.name} ({first_line(e)})") from None

    def timed_module(self, path: Path, input_shape: tuple[int, int, int] | None, batch: int,
                     threads: int) -> tuple[Architecture | None, nn.Module, tuple[int, int, int]]:
        """(the architecture the file carries or None, a module the timers can prepare, its
        C,H,W) for timing the file end to end (`fbnas latency measure --model`)."""
        raise FbnasError(f"{path}: {self.name} files are not timed by fbnas")


# ---- what formats share ----------------------------------------------------------------------
ARCH_FILE, RECORD_FILE = "fbnas_arch.yaml", "fbnas_export.json"  # stored inside the archive


def extra_files(arch: Architecture, record: dict[str, Any]) -> dict[str, str]:
    """The architecture (YAML) and the export record (JSON), as files stored in an archive."""
    arch_yaml = yaml.safe_dump(json.loads(json.dumps(arch.to_dict(), default=str)),
                               sort_keys=False, default_flow_style=None)
    return {ARCH_FILE: arch_yaml, RECORD_FILE: json.dumps(record, indent=1)}


class ArchiveFormat(Format):
    """A format whose file is an archive with room for files of its own (TorchScript, pt2):
    the architecture (YAML) and the export record (JSON) ride along (`extra_files`)."""

    def _load_extra(self, path: Path, extra: dict[str, str]) -> None:
        """Load the archive's files named in `extra` into it."""
        raise NotImplementedError

    def metadata(self, path: Path) -> dict[str, Any]:
        extra = {ARCH_FILE: "", RECORD_FILE: ""}
        self._load_extra(path, extra)
        arch = yaml.safe_load(extra[ARCH_FILE]) if extra[ARCH_FILE] else None
        record = json.loads(extra[RECORD_FILE]) if extra[RECORD_FILE] else None
        if not isinstance(arch, dict):
            raise FbnasError(f"{path}: no fbnas architecture inside ({ARCH_FILE} missing)")
        return {"arch_hash": arch.get("hash"), "arch_name": arch.get("name"), "arch": arch,
                "record": record}


def embedded_arch(meta: dict[str, Any], path: Path) -> Architecture:
    return Architecture.from_dict(meta["arch"], f"{path}: embedded architecture")


def input_chw(arch: Architecture) -> tuple[int, int, int]:
    return (arch.macro.in_channels, *arch.macro.input_size)


def static_input_shape(shape: tuple[int, ...], chw: tuple[int, int, int] | None, batch: int,
                       path: Path) -> tuple[int, int, int]:
    """C,H,W to time a program with: its traced input shape (checked against --input-shape
    and the timer's batch) or, for a dynamic one, `chw`."""
    if len(shape) == 4 and min(shape[1:]) > 0:
        if chw is not None and tuple(chw) != shape[1:]:
            raise FbnasError(f"{path}: exported for input {shape[1:]}, not --input-shape "
                             f"{','.join(map(str, chw))}")
        if shape[0] not in (batch, -1):
            raise FbnasError(f"{path}: exported for batch {shape[0]}, but the timer's batch "
                             f"is {batch}; export it for that batch or pass --batch "
                             f"{shape[0]}")
        return shape[1:]  # type: ignore[return-value]
    if chw is None:
        raise FbnasError(f"{path}: its input shape is dynamic; give --input-shape C,H,W")
    return tuple(chw)  # type: ignore[return-value]


def missing_modules(names: list[str]) -> list[str]:
    """Those of `names` that cannot be imported."""
    missing = []
    for name in names:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the deprecation and tracer warnings torch.jit / torch.onnx print on every call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield
