"""Exporting a retrained child network to TorchScript or ONNX (`fbnas export`), and checking
that the exported model computes what the eager one does.

TorchScript: `torch.jit.script` of the eval-mode ChildNet (falling back to `torch.jit.trace`
for a block that does not script); the architecture YAML and an export record ride along as
`_extra_files` (`fbnas_arch.yaml`, `fbnas_export.json`).

ONNX: the torch.export-based exporter (`torch.onnx.export(..., dynamo=True)`, needs onnx and
onnxscript), with the legacy TorchScript-based exporter as a fallback should it fail; the
batch axis is dynamic (named `batch`) unless asked otherwise. The architecture hash, name and
JSON are stored in the model's `metadata_props` (`fbnas.arch_hash`, `fbnas.arch`, ...).
Checking needs onnxruntime. All three come with `pip install 'fbnas[onnx]'`.

Every export is verified by default before it lands at its path: it is written to a temporary
file, run on random inputs at the example batch size and at another one, and compared with
the eager model within TOLERANCE; a failing file is deleted and the previous file at the path,
if any, is left alone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from fbnas import __version__
from fbnas.arch import Architecture
from fbnas.errors import FbnasError, first_line
from fbnas.io import atomic_write

FORMATS = ("torchscript", "onnx", "pt2", "pte")
SUFFIX = {"torchscript": ".ts", "onnx": ".onnx", "pt2": ".pt2", "pte": ".pte"}
_SUFFIX_FORMAT = {".ts": "torchscript", ".pt": "torchscript", ".pth": "torchscript",
                  ".torchscript": "torchscript", ".onnx": "onnx", ".pt2": "pt2", ".pte": "pte"}

# (rtol, atol) for |exported - eager| <= atol + rtol * |eager|, elementwise on the logits
# (numpy.allclose). From scripts/bench_export.py (5 random quickstart children, random weights
# and BN statistics, 64 N(0, 1) inputs): TorchScript reproduces eager bit for bit (max abs
# diff 0), since it runs the same ATen kernels; onnxruntime folds BN into the convolutions and
# uses its own kernels: max abs diff 3.6e-7 at logits of magnitude up to ~0.6, max rel diff
# 3.6e-6 (on the 22-layer CIFAR space: 1.8e-7 and 1.6e-5). The bounds leave a wide margin for
# other machines, deeper networks and larger logits while still catching a wrong weight, a
# dropped block or a train-mode BN.
TOLERANCE: dict[str, tuple[float, float]] = {
    "torchscript": (1e-5, 1e-5),
    "onnx": (1e-4, 1e-4),
    "pt2": (1e-5, 1e-5),  # the same ATen kernels as eager
    "pte": (1e-4, 1e-4),  # XNNPACK's kernels, BN folded: like onnxruntime
}
VERIFY_SEED = 0          # the verification inputs are N(0, 1) from this seed, not the global RNG
VERIFY_EXTRA_BATCH = 3   # verify also at batch + this, to exercise a dynamic batch axis
ONNX_INSTALL = "pip install 'fbnas[onnx]'"
INPUT_NAME, OUTPUT_NAME = "input", "logits"
DYNAMO_MIN_OPSET = 18    # lower opsets go to the legacy exporter (dynamo's down-conversion fails)
LEGACY_OPSET = 17        # the legacy exporter's opset when none is asked for
TS_ARCH_FILE, TS_RECORD_FILE = "fbnas_arch.yaml", "fbnas_export.json"


# ---- formats and paths ----------------------------------------------------------------------
def check_format(fmt: str, where: str = "format") -> str:
    f = str(fmt).strip().lower()
    if f not in FORMATS:
        raise FbnasError(f"{where}: unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    return f


def format_of(path: str | os.PathLike) -> str:
    """The export format a file's suffix names (.ts/.pt/.pth -> torchscript, .onnx -> onnx)."""
    p = Path(path)
    try:
        return _SUFFIX_FORMAT[p.suffix.lower()]
    except KeyError:
        raise FbnasError(f"{p}: cannot tell the format from suffix {p.suffix!r} "
                         f"(expected one of {', '.join(sorted(_SUFFIX_FORMAT))})") from None


def default_out(checkpoint: str | os.PathLike, fmt: str) -> Path:
    """`<run_dir>/model.ts` or `model.onnx`: next to the checkpoint (or in the run directory)."""
    p = Path(checkpoint)
    folder = p if p.is_dir() else p.parent
    return folder / f"model{SUFFIX[check_format(fmt)]}"


def require_extras(fmt: str, verify: bool = True) -> None:
    """Raise FbnasError naming the extra to install when `fmt` (export, and checking when
    `verify`) needs a package that is missing. TorchScript and pt2 need only torch."""
    if check_format(fmt) == "pte":
        if importlib.util.find_spec("executorch") is None:
            raise FbnasError("pte export needs executorch, not installed: "
                             "pip install 'fbnas[executorch]'")
        return
    if check_format(fmt) != "onnx":
        return
    needed = ["onnx", "onnxscript"] + (["onnxruntime"] if verify else [])
    missing = []
    for name in needed:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise FbnasError(f"ONNX export needs {', '.join(missing)}, not installed: "
                         f"{ONNX_INSTALL}")


# ---- export ---------------------------------------------------------------------------------
def export_child(model: nn.Module, arch: Architecture, fmt: str, out_path: str | os.PathLike,
                 batch: int = 1, dynamic_batch: bool = True, opset: int | None = None, *,
                 verify: bool = True) -> dict[str, Any]:
    """Export the eval-mode child network `model` of `arch` to `out_path` as `fmt`
    ("torchscript" or "onnx"), traced/exported on a random example of `batch` images.

    With `verify` (the default) the file is checked against the eager model (check_equivalence)
    before it replaces anything at `out_path`; outside TOLERANCE it is deleted and FbnasError
    raised. Returns a record: format, path, bytes, method, batch, dynamic_batch, opset,
    arch_hash, arch_name, and `check` (the check_equivalence result, or None).
    """
    fmt = check_format(fmt)
    if batch < 1:
        raise FbnasError(f"batch must be >= 1, got {batch}")
    if opset is not None and fmt != "onnx":
        raise FbnasError(f"opset {opset}: only the onnx format has an opset")
    require_extras(fmt, verify)
    out = Path(out_path)
    if out.is_dir():
        raise FbnasError(f"{out}: is a directory, expected a file name for the {fmt} export")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    example = _random_inputs(arch, batch, VERIFY_SEED + 1).to(device)
    record: dict[str, Any] = {
        "format": fmt, "path": str(out), "batch": batch,
        # TorchScript is batch-agnostic; an ExecuTorch program has fixed shapes
        "dynamic_batch": (bool(dynamic_batch) if fmt in ("onnx", "pt2")
                          else fmt == "torchscript"),
        "arch_hash": arch.hash(), "arch_name": arch.name, "fbnas_version": __version__,
        "torch_version": torch.__version__,
    }
    record["input_shape"] = [None if record["dynamic_batch"] else batch,
                             arch.macro.in_channels, *arch.macro.input_size]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.unverified")
    try:
        if fmt == "torchscript":
            write = _torchscript(model, example, arch, record)
        elif fmt == "pt2":
            write = _pt2(model, example, arch, record, record["dynamic_batch"])
        elif fmt == "pte":
            write = _pte(model, example, arch, record)
        else:
            write = _onnx(model, example, arch, record, dynamic_batch, opset)
        atomic_write(tmp if verify else out, write, mode="wb")
        record["check"] = None
        if verify:
            inputs = [_random_inputs(arch, batch, VERIFY_SEED)]
            if record["dynamic_batch"]:
                inputs.append(_random_inputs(arch, batch + VERIFY_EXTRA_BATCH, VERIFY_SEED + 2))
            check = check_equivalence(model, tmp, fmt, inputs)
            record["check"] = check
            if not check["ok"]:
                rtol, atol = check["rtol"], check["atol"]
                raise FbnasError(
                    f"{out}: the exported {fmt} model differs from the eager model (max abs "
                    f"diff {check['max_abs_diff']:.3g}, max rel diff {check['max_rel_diff']:.3g},"
                    f" allowed {atol:g} + {rtol:g}·|y|); not written")
            os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        model.train(was_training)
    record["bytes"] = out.stat().st_size
    return record


def _torchscript(model: nn.Module, example: torch.Tensor, arch: Architecture,
                 record: dict[str, Any]):
    with _quiet(), torch.no_grad():
        try:
            module = torch.jit.script(model)
            record["method"] = "torch.jit.script"
        except Exception:  # a block that does not script: tracing needs only tensor ops
            module = torch.jit.trace(model, example, check_trace=False)
            record["method"] = "torch.jit.trace"
    extra = {TS_ARCH_FILE: _arch_yaml(arch), TS_RECORD_FILE: json.dumps(record, indent=1)}

    def write(f) -> None:
        buf = io.BytesIO()  # in memory first: torch turns a full disk's OSError into noise
        with _quiet():
            torch.jit.save(module, buf, _extra_files=extra)
        f.write(buf.getbuffer())

    return write


def _pt2(model: nn.Module, example: torch.Tensor, arch: Architecture, record: dict[str, Any],
         dynamic_batch: bool):
    """torch.export program (`torch.export.save`), the architecture and record as extra files."""
    dyn = ({"x": {0: torch.export.Dim("batch", min=1, max=4096)}} if dynamic_batch else None)
    if dynamic_batch and example.shape[0] == 1:  # torch.export specialises a size-1 dimension
        example = example.expand(2, *example.shape[1:]).contiguous()
    try:
        with torch.no_grad():
            program = torch.export.export(model, (example,), dynamic_shapes=dyn)
    except Exception as e:
        raise FbnasError(f"torch.export failed ({first_line(e)})") from None
    record["method"] = "torch.export.export"
    extra = {TS_ARCH_FILE: _arch_yaml(arch), TS_RECORD_FILE: json.dumps(record, indent=1)}

    def write(f) -> None:
        buf = io.BytesIO()
        torch.export.save(program, buf, extra_files=extra)
        f.write(buf.getbuffer())

    return write


def _pte(model: nn.Module, example: torch.Tensor, arch: Architecture, record: dict[str, Any]):
    """ExecuTorch program lowered to XNNPACK. A .pte has no place for fbnas metadata, so the
    architecture is not stored with it (`exported_metadata` says so)."""
    from fbnas.latency.runtimes import lower_executorch

    buf, info = lower_executorch(model, example, where=record["path"])
    record["method"] = "to_edge_transform_and_lower(XnnpackPartitioner)"
    record["delegated"] = info["delegated"]

    def write(f) -> None:
        f.write(buf)

    return write


def _onnx(model: nn.Module, example: torch.Tensor, arch: Architecture, record: dict[str, Any],
          dynamic_batch: bool, opset: int | None):
    import onnx

    proto = onnx_proto(model, example, record, dynamic_batch, opset,
                       where=f"architecture {arch.short_hash}")
    meta = {
        "fbnas.arch_hash": arch.hash(), "fbnas.arch_name": arch.name,
        "fbnas.arch_space": arch.space or "", "fbnas.arch": json.dumps(arch.to_dict(), default=str),
        "fbnas.version": __version__, "fbnas.input_shape": json.dumps(record["input_shape"]),
        "fbnas.num_classes": str(arch.macro.num_classes),
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


def onnx_proto(model: nn.Module, example: torch.Tensor, record: dict[str, Any],
               dynamic_batch: bool = False, opset: int | None = None, where: str = "model"):
    """`model` on `example` as an ONNX ModelProto: the torch.export-based exporter, the legacy
    TorchScript-based one as a fallback (and for opsets below DYNAMO_MIN_OPSET). Notes the
    method, the opset and any fallback reason in `record`. Also the ONNX Runtime timer's
    exporter (fbnas.latency.runtimes)."""
    import onnx

    errors = []
    proto = None
    with _quiet(), torch.no_grad():
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


# ---- loading and checking -------------------------------------------------------------------
class OnnxModule:
    """An onnxruntime CPU session called like a module: float tensor in, logits tensor out."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None):
        import onnxruntime as ort

        opts = ort.SessionOptions()
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


def load_exported(path: str | os.PathLike, fmt: str | None = None):
    """A callable taking an NCHW float tensor and returning logits: the TorchScript module
    (eval mode, CPU) or an OnnxModule; the format comes from the suffix unless given."""
    p = Path(path)
    fmt = check_format(fmt) if fmt else format_of(p)
    if not p.is_file():
        raise FbnasError(f"{p}: no such file")
    if fmt == "onnx":
        require_extras("onnx", verify=True)
    if fmt == "pte":
        require_extras("pte")
    try:
        if fmt == "torchscript":
            with _quiet():
                return torch.jit.load(str(p), map_location="cpu").eval()
        if fmt == "pt2":
            return torch.export.load(str(p)).module()
        if fmt == "pte":
            return PteModule(p)
        return OnnxModule(p)
    except Exception as e:
        raise FbnasError(f"{p}: cannot load as {fmt} ({first_line(e)})") from None


def exported_metadata(path: str | os.PathLike, fmt: str | None = None) -> dict[str, Any]:
    """What an export embeds about its architecture: {"arch_hash", "arch_name", "arch" (the
    architecture mapping)} and, for TorchScript, "record" (export_child's record)."""
    p = Path(path)
    fmt = check_format(fmt) if fmt else format_of(p)
    if not p.is_file():
        raise FbnasError(f"{p}: no such file")
    if fmt == "pte":
        raise FbnasError(f"{p}: a .pte program holds no fbnas metadata; the architecture is "
                         "the one its export printed (time it with --input-shape)")
    try:
        if fmt in ("torchscript", "pt2"):
            extra = {TS_ARCH_FILE: "", TS_RECORD_FILE: ""}
            if fmt == "pt2":
                torch.export.load(str(p), extra_files=extra)
            else:
                with _quiet():
                    torch.jit.load(str(p), map_location="cpu", _extra_files=extra)
            arch = yaml.safe_load(extra[TS_ARCH_FILE]) if extra[TS_ARCH_FILE] else None
            record = json.loads(extra[TS_RECORD_FILE]) if extra[TS_RECORD_FILE] else None
            if not isinstance(arch, dict):
                raise FbnasError(f"{p}: no fbnas architecture inside ({TS_ARCH_FILE} missing)")
            return {"arch_hash": arch.get("hash"), "arch_name": arch.get("name"), "arch": arch,
                    "record": record}
        require_extras("onnx", verify=False)
        import onnx

        props = {q.key: q.value for q in onnx.load(str(p), load_external_data=False)
                 .metadata_props}
    except FbnasError:
        raise
    except Exception as e:
        raise FbnasError(f"{p}: cannot read as {fmt} ({first_line(e)})") from None
    if "fbnas.arch_hash" not in props:
        raise FbnasError(f"{p}: no fbnas metadata inside (fbnas.arch_hash missing)")
    return {"arch_hash": props["fbnas.arch_hash"], "arch_name": props.get("fbnas.arch_name"),
            "arch": json.loads(props.get("fbnas.arch", "null")), "props": props}


@torch.no_grad()
def check_equivalence(model: nn.Module, exported_path: str | os.PathLike, fmt: str,
                      inputs: torch.Tensor | Sequence[torch.Tensor],
                      tolerance: tuple[float, float] | None = None) -> dict[str, Any]:
    """Run the exported model and the eager `model` (eval mode) on the same `inputs` (one
    batch, or a list of batches) and compare the outputs.

    Returns {"format", "samples", "max_abs_diff", "max_rel_diff", "argmax_agreement", "rtol",
    "atol", "ok"}. `ok` is |exported - eager| <= atol + rtol·|eager| everywhere, with (rtol,
    atol) = `tolerance` or TOLERANCE[fmt]. The relative diff is elementwise |Δ| / |eager| over
    the logits whose magnitude is at least 1e-3 of the batch's largest (so a near-zero logit
    does not dominate it); argmax agreement is the fraction of rows whose top class agrees.
    """
    fmt = check_format(fmt)
    rtol, atol = tolerance if tolerance is not None else TOLERANCE[fmt]
    batches = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    if not batches:
        raise FbnasError("check_equivalence: no inputs")
    exported = load_exported(exported_path, fmt)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    max_abs = max_rel = 0.0
    agree = n = 0
    ok = True
    try:
        for x in batches:
            ref = model(x.to(device).clone()).float().cpu().numpy().astype(np.float64)
            try:
                got = exported(x.cpu().clone())
            except Exception as e:
                raise FbnasError(f"{exported_path}: the exported {fmt} model fails on input "
                                 f"{tuple(x.shape)} ({first_line(e)})") from None
            got = got.float().cpu().numpy().astype(np.float64)
            if got.shape != ref.shape:
                raise FbnasError(f"{exported_path}: the exported {fmt} model gives shape "
                                 f"{got.shape} for input {tuple(x.shape)}, eager gives "
                                 f"{ref.shape}")
            diff = np.abs(got - ref)
            mag = np.abs(ref)
            max_abs = max(max_abs, float(diff.max(initial=0.0)))
            keep = mag >= 1e-3 * mag.max(initial=0.0)
            if keep.any():
                max_rel = max(max_rel, float((diff[keep] / mag[keep]).max()))
            ok = ok and bool(np.all(diff <= atol + rtol * mag)) and bool(np.isfinite(got).all())
            rows = ref.reshape(ref.shape[0], -1)
            agree += int((rows.argmax(1) == got.reshape(got.shape[0], -1).argmax(1)).sum())
            n += rows.shape[0]
    finally:
        model.train(was_training)
    return {"format": fmt, "samples": n, "max_abs_diff": max_abs, "max_rel_diff": max_rel,
            "argmax_agreement": agree / n if n else 1.0, "rtol": rtol, "atol": atol, "ok": ok}


# ---- helpers --------------------------------------------------------------------------------
def _random_inputs(arch: Architecture, batch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, arch.macro.in_channels, *arch.macro.input_size, generator=g)


def _arch_yaml(arch: Architecture) -> str:
    return yaml.safe_dump(json.loads(json.dumps(arch.to_dict(), default=str)), sort_keys=False,
                          default_flow_style=None)


def _opset(proto) -> int | None:
    return next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


@contextlib.contextmanager
def _quiet():
    """Silence the deprecation and tracer warnings torch.jit / torch.onnx print on every call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield
