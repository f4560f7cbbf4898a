"""Backends: one module per device or runtime, each holding its timer and/or its export
format and registering them (TIMERS, FORMATS in `base`).

    cpu, cuda, xla, fake     timers (xla needs torch-xla: `fbnas[tpu]`)
    torchscript, pt2         export formats (torch only)
    onnx                     the `onnx` format and the `ort` timer (`fbnas[onnx]`)
    executorch               the `pte` format and the `executorch` timer (`fbnas[executorch]`)

`base` holds the Timer and Format interfaces, `exported` what the runtime timers share (the
program cache), `allocator` / `worker` the host allocator a CPU timing runs under. Importing
this package registers every backend; optional packages are imported only when used. A new
runtime (Core ML, LiteRT, TensorRT) is one module here, imported below, and its extra in
pyproject.toml.
"""

# the import order is the registration order, the order choices are listed in
# isort: off
from fbnas.backends import cpu, cuda, xla, fake
from fbnas.backends import torchscript, onnx, pt2, executorch
# isort: on

from fbnas.backends.base import (
    DTYPES,
    FORMATS,
    QUANTIZATIONS,
    TIMERS,
    Format,
    Runnable,
    Timer,
    clock_choices,
    make_timer,
)

__all__ = ["DTYPES", "FORMATS", "QUANTIZATIONS", "TIMERS", "Format", "Runnable", "Timer",
           "clock_choices", "cpu", "cuda", "executorch", "fake", "make_timer", "onnx", "pt2",
           "torchscript", "xla"]
