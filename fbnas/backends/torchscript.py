"""TorchScript: the `torchscript` export format (`.ts`; `.pt`, `.pth`, `.torchscript` read).

`torch.jit.script` of the eval-mode child network, falling back to `torch.jit.trace` for a
block that does not script; the architecture YAML and the export record ride along as
`_extra_files` (`fbnas_arch.yaml`, `fbnas_export.json`). Batch-agnostic; it runs the same ATen
kernels as eager. Any TorchScript file can be timed (`fbnas latency measure --model`); one
fbnas did not write needs its input shape.
"""

from __future__ import annotations

import io

import torch

from fbnas.backends.base import ArchiveFormat, embedded_arch, extra_files, input_chw, quiet
from fbnas.errors import FbnasError


class TorchScriptFormat(ArchiveFormat):
    """`.ts`: a TorchScript archive with the architecture inside."""

    name = "torchscript"
    suffixes = (".ts", ".pt", ".pth", ".torchscript")
    # reproduces eager bit for bit (max abs diff 0 in scripts/latency/export.py), since it runs
    # the same ATen kernels
    tolerance = (1e-5, 1e-5)

    def dynamic_batch(self, asked: bool) -> bool:
        return True

    def export(self, model, example, arch, record, opset=None):
        with quiet(), torch.no_grad():
            try:
                module = torch.jit.script(model)
                record["method"] = "torch.jit.script"
            except Exception:  # a block that does not script: tracing needs only tensor ops
                module = torch.jit.trace(model, example, check_trace=False)
                record["method"] = "torch.jit.trace"
        extra = extra_files(arch, record)

        def write(f) -> None:
            buf = io.BytesIO()  # in memory first: torch turns a full disk's OSError into noise
            with quiet():
                torch.jit.save(module, buf, _extra_files=extra)
            f.write(buf.getbuffer())

        return write

    def load(self, path):
        with quiet():
            return torch.jit.load(str(path), map_location="cpu").eval()

    def _load_extra(self, path, extra):
        with quiet():
            torch.jit.load(str(path), map_location="cpu", _extra_files=extra)

    def timed_module(self, path, input_shape, batch, threads):
        net = self.load_file(path)
        try:
            meta = self.read_metadata(path)
        except FbnasError:  # a TorchScript file fbnas did not write: time it as it is
            if input_shape is None:
                raise FbnasError(f"{path}: a TorchScript model without an fbnas architecture "
                                 "inside; give its input shape with --input-shape C,H,W"
                                 ) from None
            return None, net, input_shape
        a = embedded_arch(meta, path)
        return a, net, input_chw(a)


FORMAT = TorchScriptFormat()  # registered as "torchscript" in fbnas/backends/__init__.py
