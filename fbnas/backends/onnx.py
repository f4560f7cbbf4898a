"""ONNX: the `onnx` export format and the `ort` timer (ONNX Runtime's CPU execution provider).

Export: the torch.export-based exporter (`torch.onnx.export(..., dynamo=True)`, needs onnx and
onnxscript), with the legacy TorchScript-based exporter as a fallback should it fail; the batch
axis is dynamic (named `batch`) unless asked otherwise. The architecture hash, name and JSON are
stored in the model's `metadata_props` (`fbnas.arch_hash`, `fbnas.arch`, ...). Checking needs
onnxruntime. All three come with `pip install 'fbnas[onnx]'`.

Timer `ort`: each module exported by the same exporter and run by an onnxruntime session,
`intra_op_num_threads` = the timer's thread count, one inter-op thread, sequential execution,
all graph optimisations (ONNX Runtime folds BN into convolutions); see
`fbnas.backends.exported` for the cache and the clock.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fbnas import __version__
from fbnas.backends import QUANTIZATIONS
from fbnas.backends.base import Format, missing_modules, quiet
from fbnas.backends.exported import ExportedTimer, calibration_inputs
from fbnas.errors import FbnasError, first_line

INSTALL = "pip install 'fbnas[onnx]'"
INPUT_NAME, OUTPUT_NAME = "input", "logits"
DYNAMO_MIN_OPSET = 18    # lower opsets go to the legacy exporter (dynamo's down-conversion fails)
LEGACY_OPSET = 17        # the legacy exporter's opset when none is asked for


class OnnxFormat(Format):
    """`.onnx`, the architecture in `metadata_props`; checked with onnxruntime."""

    name = "onnx"
    suffixes = (".onnx",)
    # onnxruntime folds BN into the convolutions and uses its own kernels: max abs diff 3.6e-7
    # at logits of magnitude up to ~0.6, max rel diff 3.6e-6 (on the 22-layer CIFAR space:
    # 1.8e-7 and 1.6e-5), measured with scripts/latency/export.py
    tolerance = (1e-4, 1e-4)
    has_opset = True

    def require(self, verify: bool = True) -> None:
        missing = missing_modules(["onnx", "onnxscript"] + (["onnxruntime"] if verify else []))
        if missing:
            raise FbnasError(f"ONNX export needs {', '.join(missing)}, not installed: "
                             f"{INSTALL}")

    quantizations = QUANTIZATIONS
    # onnxruntime's int8 kernels (fused QDQ) against the same QDQ model run node by node in
    # float: measured in scripts/latency/int8.py
    int8_tolerance = (0.05, 0.02)  # atol: a fraction of the largest |logit|

    def export(self, model, example, arch, record, opset=None):
        proto = onnx_proto(model, example, record, record["dynamic_batch"], opset,
                           where=f"architecture {arch.short_hash}")
        return self._finish(proto, arch, record)

    def export_int8(self, model, example, arch, record, calibration, opset=None):
        where = f"architecture {arch.short_hash}"
        proto = onnx_proto(model, example, record, record["dynamic_batch"], opset, where=where)
        proto = quantize_qdq(proto, calibration, where)
        record["method"] = f"{record.get('method', 'export')} + quantize_static (QDQ)"
        return self._finish(proto, arch, record), (lambda path: OnnxModule(path, optimize=False))

    def _finish(self, proto, arch, record):
        """The file's bytes: `proto` with the architecture in its metadata, checked."""
        import onnx

        meta = {
            "fbnas.arch_hash": arch.hash(), "fbnas.arch_name": arch.name,
            "fbnas.arch_space": arch.space or "",
            "fbnas.arch": json.dumps(arch.to_dict(), default=str),
            "fbnas.version": __version__, "fbnas.input_shape": json.dumps(record["input_shape"]),
            "fbnas.num_classes": str(arch.macro.num_classes),
            **({"fbnas.quantization": record["quantization"]}
               if record.get("quantization", "none") != "none" else {}),
        }
        for k, v in meta.items():
            entry = next((p for p in proto.metadata_props if p.key == k), None) \
                or proto.metadata_props.add()
            entry.key, entry.value = k, v
        proto.doc_string = f"fbnas child network {arch.name} [{arch.short_hash}]"
        try:
            onnx.checker.check_model(proto)
        except Exception as e:
            raise FbnasError(f"architecture {arch.short_hash}: exported ONNX model is invalid "
                             f"({first_line(e)})") from None
        data = proto.SerializeToString()
        return lambda f: f.write(data)

    def load(self, path):
        return OnnxModule(path)

    def metadata(self, path):
        self.require(verify=False)
        import onnx

        props = {q.key: q.value for q in onnx.load(str(path), load_external_data=False)
                 .metadata_props}
        if "fbnas.arch_hash" not in props:
            raise FbnasError(f"{path}: no fbnas metadata inside (fbnas.arch_hash missing)")
        return {"arch_hash": props["fbnas.arch_hash"], "arch_name": props.get("fbnas.arch_name"),
                "arch": json.loads(props.get("fbnas.arch", "null")), "props": props}

    def timed_module(self, path, input_shape, batch, threads):
        raise FbnasError(f"{path}: ONNX models are timed by onnxruntime's own tools; give the "
                         "TorchScript or .pt2 export, or the retrain checkpoint")


FORMAT = OnnxFormat()  # registered as "onnx" in fbnas/backends/__init__.py


def onnx_proto(model: nn.Module, example: torch.Tensor, record: dict[str, Any],
               dynamic_batch: bool = False, opset: int | None = None, where: str = "model"):
    """`model` on `example` as an ONNX ModelProto: the torch.export-based exporter, the legacy
    TorchScript-based one as a fallback (and for opsets below DYNAMO_MIN_OPSET). Notes the
    method, the opset and any fallback reason in `record`. Also the ONNX Runtime timer's
    exporter."""
    import onnx

    errors = []
    proto = None
    with quiet(), torch.no_grad():
        if opset is not None and opset < DYNAMO_MIN_OPSET:
            errors.append(f"dynamo exporter: implements opset >= {DYNAMO_MIN_OPSET}, "
                          f"{opset} asked for")
        else:  # the torch.export-based exporter, torch's default since 2.9
            try:
                kw: dict[str, Any] = {"opset_version": opset} if opset is not None else {}
                program = torch.onnx.export(
                    model, (example,), None, dynamo=True, input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME], verbose=False,
                    dynamic_shapes=({0: torch.export.Dim("batch")},) if dynamic_batch else None,
                    **kw)
                proto = program.model_proto
                record["method"] = "torch.onnx.export(dynamo=True)"
                got = _opset(proto)
                if opset is not None and got != opset:  # it keeps its own when conversion fails
                    errors.append(f"dynamo exporter: gave opset {got}, {opset} asked for")
                    proto = None
            except Exception as e:
                errors.append(f"dynamo exporter: {first_line(e)}")
        if proto is None:
            try:  # the legacy TorchScript-based exporter (deprecated, still in torch 2.x)
                buf = io.BytesIO()
                torch.onnx.export(
                    model, (example,), buf, dynamo=False, input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME], opset_version=opset or LEGACY_OPSET,
                    do_constant_folding=True,
                    dynamic_axes=({INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}}
                                  if dynamic_batch else None))
                proto = onnx.load_from_string(buf.getvalue())
                record["method"] = "torch.onnx.export(dynamo=False)"
                record["fallback_reason"] = errors[0]
            except Exception as e:
                errors.append(f"legacy exporter: {first_line(e)}")
    if proto is None:
        raise FbnasError(f"{where}: ONNX export failed ({'; '.join(errors)})")
    record["opset"] = _opset(proto)
    return proto


def _opset(proto) -> int | None:
    return next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


class OnnxModule:
    """An onnxruntime CPU session called like a module: float tensor in, logits tensor out."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None,
                 optimize: bool = True):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if not optimize:  # each node as written: a QDQ model's quantize / dequantize in float
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.intra_op_num_threads = threads or torch.get_num_threads()
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self.path = str(path)
        self.session = ort.InferenceSession(self.path, opts, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        arr = x.detach().cpu().numpy().astype(np.float32, copy=False)
        return torch.from_numpy(self.session.run(None, {self.input_name: arr})[0])

    def eval(self) -> OnnxModule:
        return self


class OrtTimer(ExportedTimer):
    """ONNX Runtime, CPU execution provider (see module docstring)."""

    backend = "ort"
    runtime = "ort"
    suffix = ".onnx"
    packages = ("onnxruntime", "onnx", "onnxscript")
    install = INSTALL
    quantizations = QUANTIZATIONS  # int8: static QDQ quantization (onnxruntime)
    int8_recipe = "qdq-reduce-range"

    def _lower(self, module, x, where):
        record: dict[str, Any] = {}
        proto = onnx_proto(module.eval(), x, record, where=where)
        if self.quantization == "int8":
            proto = quantize_qdq(proto, calibration_inputs(x), where)
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


def quantize_qdq(proto, calibration: list[torch.Tensor], where: str = "model"):
    """An ONNX model quantized to int8 as ONNX Runtime deploys it on CPUs: static
    quantization in QDQ format (per-channel int8 weights in 7-bit range, uint8 activations
    calibrated by
    min-max on `calibration`), after onnxruntime's pre-processing (shape inference, graph
    optimisation: BatchNorm folded into the convolutions)."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    name = proto.graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{name: c.numpy()} for c in calibration])

        def get_next(self):
            return next(self.feeds, None)

    with tempfile.TemporaryDirectory() as tmp, quiet():
        src, pre, out = (Path(tmp) / f for f in ("model.onnx", "pre.onnx", "int8.onnx"))
        src.write_bytes(proto.SerializeToString())
        try:
            quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
            # reduce_range (7-bit weights): without it, onnxruntime's u8s8 kernels saturate
            # on x86 CPUs without VNNI, and the program's logits leave its own QDQ
            # reference (the figures: docs/latency.md, int8)
            quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ,
                            per_channel=True, reduce_range=True, weight_type=QuantType.QInt8,
                            activation_type=QuantType.QUInt8)
        except Exception as e:
            raise FbnasError(f"{where}: onnxruntime cannot quantize it to int8 "
                             f"({first_line(e)})") from None
        return onnx.load(str(out))
