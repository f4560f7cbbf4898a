"""torch.export: the `pt2` export format (`.pt2`, `torch.export.save`).

The batch axis is dynamic unless asked otherwise; the architecture YAML and the export record
are stored as extra files; it runs the same ATen kernels as eager. Any `.pt2` program can be
timed (`fbnas latency measure --model`), at the input shape it was traced with.
"""

from __future__ import annotations

import contextlib
import io

import torch

from fbnas.backends.base import (
    ArchiveFormat,
    embedded_arch,
    extra_files,
    input_chw,
    static_input_shape,
)
from fbnas.errors import FbnasError, first_line


class Pt2Format(ArchiveFormat):
    """`.pt2`: a torch.export program with the architecture inside."""

    name = "pt2"
    suffixes = (".pt2",)
    tolerance = (1e-5, 1e-5)  # the same ATen kernels as eager

    def export(self, model, example, arch, record, opset=None):
        dynamic = record["dynamic_batch"]
        dyn = {"x": {0: torch.export.Dim("batch", min=1, max=4096)}} if dynamic else None
        if dynamic and example.shape[0] == 1:  # torch.export specialises a size-1 dimension
            example = example.expand(2, *example.shape[1:]).contiguous()
        try:
            with torch.no_grad():
                program = torch.export.export(model, (example,), dynamic_shapes=dyn)
        except Exception as e:
            raise FbnasError(f"torch.export failed ({first_line(e)})") from None
        record["method"] = "torch.export.export"
        extra = extra_files(arch, record)

        def write(f) -> None:
            buf = io.BytesIO()
            torch.export.save(program, buf, extra_files=extra)
            f.write(buf.getbuffer())

        return write

    def load(self, path):
        return torch.export.load(str(path)).module()

    def _load_extra(self, path, extra):
        torch.export.load(str(path), extra_files=extra)

    def timed_module(self, path, input_shape, batch, threads):
        if not path.is_file():
            raise FbnasError(f"{path}: no such file")
        try:
            program = torch.export.load(str(path))
        except Exception as e:  # noqa: BLE001 - any failure to read is the file's
            raise FbnasError(f"{path}: cannot load as a torch.export program "
                             f"({first_line(e)})") from None
        a = None
        with contextlib.suppress(FbnasError):  # an fbnas export carries its architecture
            a = embedded_arch(self.read_metadata(path), path)
        chw = input_shape or (None if a is None else input_chw(a))
        chw = static_input_shape(_input_shape(program, path), chw, batch, path)
        net = program.module()
        # A program runs the graph it was traced with, whatever its train/eval flag; torch
        # makes its train and eval methods raise, and the timer sets eval mode: drop them.
        for name in ("train", "eval"):
            net.__dict__.pop(name, None)
        return a, net, chw


def _input_shape(program, path) -> tuple[int, ...]:
    """The (static) input shape a torch.export program was traced with."""
    spec = program.graph_signature
    names = set(spec.user_inputs)
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in names:
            val = node.meta.get("val")
            if val is not None and hasattr(val, "shape"):
                # -1 for a symbolic (dynamic) dimension, such as fbnas export's batch axis
                return tuple(-1 if isinstance(d, torch.SymInt) else int(d) for d in val.shape)
    raise FbnasError(f"{path}: the program has no tensor input to time")


FORMAT = Pt2Format()  # registered as "pt2" in fbnas/backends/__init__.py
