"""Backends: one module per device or runtime, each holding its timer and/or its export
format, declared below in the registries TIMERS and FORMATS.

    cpu, cuda, xla, fake     timers (xla needs torch-xla: `fbnas[tpu]`)
    torchscript, pt2         export formats (torch only)
    onnx                     the `onnx` format and the `ort` timer (`fbnas[onnx]`)
    executorch               the `pte` format and the `executorch` timer (`fbnas[executorch]`)

`base` holds the Timer and Format interfaces, `exported` what the runtime timers share (the
program cache), `allocator` / `worker` the host allocator a CPU timing runs under. This
package imports no backend (nor torch): each is declared by name and place, and imported the
first time it is used, so the command line lists the choices at once. A new runtime (Core ML,
LiteRT, TensorRT) is one module here, one declaration below, and its extra in pyproject.toml.
"""

from __future__ import annotations

import importlib
from typing import Any

from fbnas.registry import Registry

# the dtypes a table is timed in (latency.dtype, --dtype), torch's names
DTYPES = ("float32", "float16", "bfloat16")
# how the timed programs are quantized (latency.quantization, --quantization): `none`, or
# `int8` post-training static quantization as the deployed runtime runs it (each timer lists
# the ones it can lower in `quantizations`; the exported runtimes: int8)
QUANTIZATIONS = ("none", "int8")
# the clocks a CPU timing reads (`--clock`, latency.clock): the thread's CPU time or wall time
CLOCKS = ("thread", "wall")

# the Timer subclasses (fbnas.backends.base.Timer) and the Format objects, by name
TIMERS: Registry = Registry("timer backend", "latency.device")
FORMATS: Registry = Registry("export format", "--format")

# the registration order is the order choices are listed in; `clocks`: the clocks a timer
# reads (`--clock`, its class's `clocks`); `bundle`: a runtime `fbnas latency bundle` writes
# programs for; `test_only`: accepted, not offered in help
TIMERS.register("cpu", at="fbnas.backends.cpu:CpuTimer", clocks=CLOCKS)
TIMERS.register("cuda", at="fbnas.backends.cuda:CudaTimer")
TIMERS.register("xla", at="fbnas.backends.xla:XlaTimer")
TIMERS.register("fake", at="fbnas.backends.fake:FakeTimer", test_only=True)
TIMERS.register("ort", at="fbnas.backends.onnx:OrtTimer", clocks=CLOCKS)
TIMERS.register("executorch", at="fbnas.backends.executorch:ExecuTorchTimer", clocks=CLOCKS,
                bundle=True)
# `quantizations`: what a format writes (`fbnas export --quantize`, its object's `quantizations`)
FORMATS.register("torchscript", at="fbnas.backends.torchscript:FORMAT", quantizations=("none",))
FORMATS.register("onnx", at="fbnas.backends.onnx:FORMAT", quantizations=QUANTIZATIONS)
FORMATS.register("pt2", at="fbnas.backends.pt2:FORMAT", quantizations=("none",))
FORMATS.register("pte", at="fbnas.backends.executorch:FORMAT", quantizations=QUANTIZATIONS)



def clock_choices() -> tuple[str, ...]:
    """Every clock a registered timer reads (`--clock`), in registration order."""
    return tuple(dict.fromkeys(c for n in TIMERS for c in TIMERS.attr(n, "clocks", ())))


def offered(registry: Registry) -> tuple[str, ...]:
    """The choices help lists: the registered names less the test-only ones."""
    return tuple(n for n in registry if not registry.attr(n, "test_only"))


_FROM_BASE = ("Format", "Runnable", "Timer", "make_timer")


def __getattr__(name: str) -> Any:
    """The interfaces of `base`, imported (with torch) when first asked for."""
    if name in _FROM_BASE:
        return getattr(importlib.import_module("fbnas.backends.base"), name)
    raise AttributeError(f"module 'fbnas.backends' has no attribute {name!r}")


__all__ = ["CLOCKS", "DTYPES", "FORMATS", "QUANTIZATIONS", "TIMERS", "clock_choices", "offered",
           *_FROM_BASE]
