"""ExecuTorch: the `pte` export format and the `executorch` timer (XNNPACK delegate).

A deployed network does not run in PyTorch eager: ExecuTorch's XNNPACK delegate fuses ops and
has its own depthwise kernels. Both the format and the timer lower with
`to_edge_transform_and_lower(..., XnnpackPartitioner())` and run through `executorch.runtime`.
What XNNPACK does not take falls back to the portable kernels; the share of delegated graph
nodes is recorded per entry (`delegated`; 1.0 = fully delegated). ExecuTorch's threadpool is
sized to the timer's thread count before the first program loads (and recorded); it stays so
for the process (resizing it breaks loaded delegates). A `.pte` has fixed shapes and no place
for fbnas metadata. Optional: `pip install 'fbnas[executorch]'`; the cache and the clock are
`fbnas.backends.exported`'s.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fbnas.backends import FORMATS, QUANTIZATIONS
from fbnas.backends.base import Format, static_input_shape
from fbnas.backends.exported import ExportedTimer, calibration_inputs
from fbnas.errors import FbnasError, first_line

INSTALL = "pip install 'fbnas[executorch]'"


class ExecuTorchTimer(ExportedTimer):
    """ExecuTorch with the XNNPACK delegate (see module docstring)."""

    backend = "executorch"
    runtime = "executorch"
    suffix = ".pte"
    packages = ("executorch",)
    install = INSTALL
    quantizations = QUANTIZATIONS  # int8: PT2E with the XNNPACK quantizer

    def _activate(self) -> None:
        self._pool()

    def _pool(self) -> None:
        if size_executorch_pool(self.threads):
            self._loaded.clear()  # programs loaded under the old pool no longer run

    def _lower(self, module, x, where):
        calibration = calibration_inputs(x) if self.quantization == "int8" else None
        return lower_executorch(module, x, where=where, int8_calibration=calibration)

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


def quantize_xnnpack(module: nn.Module, x: torch.Tensor, calibration: list[torch.Tensor]
                     ) -> nn.Module:
    """`module` quantized to int8 as ExecuTorch deploys it on XNNPACK: PT2E post-training
    static quantization with the XNNPACK quantizer's symmetric config (per-channel weights),
    its activation ranges observed on `calibration`; the quantize / dequantize pairs that
    lowering fuses into XNNPACK's int8 kernels."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True))
    with torch.no_grad():
        graph = torch.export.export(module.eval(), (x,)).module()
        prepared = prepare_pt2e(graph, quantizer)
        for c in calibration:
            prepared(c)
        return convert_pt2e(prepared)


def lower_executorch(module: nn.Module, x: torch.Tensor, where: str = "module",
                     int8_calibration: list[torch.Tensor] | None = None, *,
                     quantized: bool = False) -> tuple[bytes, dict[str, Any]]:
    """`module` on input `x` as an XNNPACK-lowered ExecuTorch program: (.pte bytes, info with
    `delegated`, the share of compute nodes XNNPACK took, and the node counts). With
    `int8_calibration`, quantized to int8 first (`quantize_xnnpack`) on those inputs;
    `quantized`: `module` is `quantize_xnnpack`'s result already."""
    ExecuTorchTimer.require()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    try:
        if int8_calibration is not None:
            module, quantized = quantize_xnnpack(module, x, int8_calibration), True
        with torch.no_grad():
            ep = torch.export.export(module if quantized else module.eval(), (x,))
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


def size_executorch_pool(threads: int) -> bool:
    """Size ExecuTorch's threadpool to `threads`; True if it was resized. Resizing invalidates
    the XNNPACK delegates loaded under the old pool (they hang or crash when called), so size
    it before the first program loads and leave it: a process keeps one thread count."""
    from executorch.extension.pybindings import portable_lib

    if portable_lib._threadpool_get_thread_count() == threads:
        return False
    portable_lib._unsafe_reset_threadpool(threads)
    return True


class PteModule:
    """An ExecuTorch program (`executorch.runtime`) called like a module."""

    def __init__(self, path: str | os.PathLike):
        from executorch.runtime import Runtime

        self.path = str(path)
        self.program = Runtime.get().load_program(Path(path).read_bytes())
        self.method = self.program.load_method("forward")  # keeps pointing into the program

    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.method.metadata.input_tensor_meta(0).sizes())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.execute([x.contiguous()])[0]

    def eval(self) -> PteModule:
        return self


class PteNet(nn.Module):
    """An ExecuTorch program as a module the timers can prepare (no parameters to move)."""

    def __init__(self, path: Path, threads: int = 1):
        super().__init__()
        if not path.is_file():
            raise FbnasError(f"{path}: no such file")
        FORMATS.get("pte").require()
        size_executorch_pool(threads)  # before the program loads
        try:
            self._pte = PteModule(path)
            self.input_shape = self._pte.input_shape()
        except Exception as e:  # noqa: BLE001 - any failure to read is the file's
            raise FbnasError(f"{path}: cannot load as an ExecuTorch program "
                             f"({first_line(e)})") from None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._pte(x)


class PteFormat(Format):
    """`.pte`: an ExecuTorch program lowered to XNNPACK (static shapes, no fbnas metadata)."""

    name = "pte"
    suffixes = (".pte",)
    tolerance = (1e-4, 1e-4)  # XNNPACK's kernels, BN folded: like onnxruntime

    def require(self, verify: bool = True) -> None:
        if importlib.util.find_spec("executorch") is None:
            raise FbnasError(f"pte export needs executorch, not installed: {INSTALL}")

    def dynamic_batch(self, asked: bool) -> bool:
        return False

    quantizations = QUANTIZATIONS
    # the int8 program (XNNPACK's int8 kernels) against the PT2E fake-quantized module it was
    # lowered from: requantization rounds differently; measured in scripts/latency/int8.py
    int8_tolerance = (0.05, 0.02)  # atol: a fraction of the largest |logit|

    def export(self, model, example, arch, record, opset=None):
        buf, info = lower_executorch(model, example, where=record["path"])
        record["method"] = "to_edge_transform_and_lower(XnnpackPartitioner)"
        record["delegated"] = info["delegated"]
        return lambda f: f.write(buf)

    def export_int8(self, model, example, arch, record, calibration, opset=None):
        where = record["path"]
        try:
            fake = quantize_xnnpack(model.eval(), example, calibration)
        except Exception as e:
            raise FbnasError(f"{where}: cannot quantize to int8 for XNNPACK "
                             f"({first_line(e)})") from None
        buf, info = lower_executorch(fake, example, where=where, quantized=True)
        record["method"] = ("PT2E (XNNPACKQuantizer, symmetric, per-channel) + "
                            "to_edge_transform_and_lower(XnnpackPartitioner)")
        record["delegated"] = info["delegated"]
        # a plain callable: an exported graph module refuses .eval()
        return (lambda f: f.write(buf)), (lambda path: lambda x: fake(x))

    def load(self, path):
        return PteModule(path)

    def metadata(self, path):
        raise FbnasError(f"{path}: a .pte program holds no fbnas metadata; the architecture is "
                         "the one its export printed (time it with --input-shape)")

    def timed_module(self, path, input_shape, batch, threads):
        net = PteNet(path, threads)
        return None, net, static_input_shape(net.input_shape, input_shape, batch, path)


FORMAT = PteFormat()  # registered as "pte" in fbnas/backends/__init__.py
