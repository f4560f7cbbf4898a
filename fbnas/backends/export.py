"""Exporting a retrained child network (`fbnas export`), and checking that the exported model
computes what the eager one does. What depends on the format lives in its backend
(`fbnas.backends`: torchscript, onnx, pt2, pte in FORMATS); this module is what they share.

Every export is verified by default before it lands at its path: it is written to a temporary
file, run on random inputs at the example batch size and at another one, and compared with
the eager model within the format's tolerance (`Format.tolerance`); a failing file is deleted
and the previous file at the path, if any, is left alone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fbnas import __version__
from fbnas.arch import Architecture
from fbnas.backends import FORMATS, Format
from fbnas.errors import FbnasError, first_line
from fbnas.io import atomic_write

VERIFY_SEED = 0          # the verification inputs are N(0, 1) from this seed, not the global RNG
VERIFY_EXTRA_BATCH = 3   # verify also at batch + this, to exercise a dynamic batch axis


# ---- formats and paths ----------------------------------------------------------------------
def check_format(fmt: str, where: str = "format") -> str:
    """The registered format `fmt` names (any case); a one-line error naming the choices."""
    return FORMATS.entry(str(fmt).strip().lower(), where).name


def format_of(path: str | os.PathLike) -> str:
    """The export format a file's suffix names (.ts/.pt/.pth -> torchscript, .onnx -> onnx)."""
    p = Path(path)
    e = FORMATS.find(lambda e: p.suffix.lower() in e.obj.suffixes)
    if e is None:
        known = sorted(s for _, f in FORMATS.items() for s in f.suffixes)
        raise FbnasError(f"{p}: cannot tell the format from suffix {p.suffix!r} "
                         f"(expected one of {', '.join(known)})")
    return e.name


def _format(path: Path, fmt: str | None) -> Format:
    return FORMATS.get(check_format(fmt) if fmt else format_of(path))


def program_name(fmt: str, quantize: str = "none") -> str:
    """`model.pte`, `model_int8.pte`: the file name an export of `fmt` is written under."""
    tail = "" if quantize == "none" else f"_{quantize}"
    return f"model{tail}{FORMATS.get(check_format(fmt)).suffix}"


def opset_formats() -> tuple[str, ...]:
    """The formats that take an opset (onnx)."""
    return tuple(n for n, f in FORMATS.items() if f.has_opset)


def require_extras(fmt: str, verify: bool = True) -> None:
    """Raise FbnasError naming the extra to install when `fmt` (export, and checking when
    `verify`) needs a package that is missing. TorchScript and pt2 need only torch."""
    FORMATS.get(check_format(fmt)).require(verify)


# ---- export ---------------------------------------------------------------------------------
def require_quantization(fmt: str, quantize: str) -> None:
    """One line where the format `fmt` cannot write `quantize` programs (naming those that
    can)."""
    if quantize not in FORMATS.get(check_format(fmt)).quantizations:
        can = [n for n in FORMATS.choices() if quantize in FORMATS.get(n).quantizations]
        raise FbnasError(f"--quantize {quantize}: the {fmt} format cannot be quantized"
                         + (f"; export {' or '.join(can)}" if can else ""))


def export_child(model: nn.Module, arch: Architecture, fmt: str, out_path: str | os.PathLike,
                 batch: int = 1, dynamic_batch: bool = True, opset: int | None = None, *,
                 verify: bool = True, quantize: str = "none",
                 calibration: torch.Tensor | None = None) -> dict[str, Any]:
    """Export the eval-mode child network `model` of `arch` to `out_path` as `fmt`
    (a name in FORMATS), traced/exported on a random example of `batch` images.

    With `verify` (the default) the file is checked against the eager model (check_equivalence)
    before it replaces anything at `out_path`; outside the format's tolerance it is deleted and
    FbnasError
    raised. Returns a record: format, path, bytes, method, batch, dynamic_batch, opset,
    arch_hash, arch_name, and `check` (the check_equivalence result, or None).

    `quantize="int8"`: the program is quantized post-training as its runtime deploys it
    (`Format.export_int8`), its activation ranges observed on `calibration` (N×C×H×W images,
    e.g. `fbnas.data.calibration_images`: training images), and checked against its
    fake-quantized reference within the format's `int8_tolerance` instead of the eager model.
    """
    fmt = check_format(fmt)
    form = FORMATS.get(fmt)
    if batch < 1:
        raise FbnasError(f"batch must be >= 1, got {batch}")
    require_quantization(fmt, quantize)
    chunks = None
    if quantize != "none":
        chunks = _calibration_chunks(calibration, arch, batch)
    if opset is not None and not form.has_opset:
        raise FbnasError(f"opset {opset}: only the {' and '.join(opset_formats())} format has "
                         "an opset")
    form.require(verify)
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
        "dynamic_batch": form.dynamic_batch(bool(dynamic_batch)),
        "arch_hash": arch.hash(), "arch_name": arch.name, "fbnas_version": __version__,
        "torch_version": torch.__version__,
        **({} if quantize == "none" else {"quantization": quantize,
                                          "calibration_images": sum(map(len, chunks))}),
    }
    record["input_shape"] = [None if record["dynamic_batch"] else batch,
                             arch.macro.in_channels, *arch.macro.input_size]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.unverified")
    try:
        if chunks is None:
            write, reference = form.export(model, example, arch, record, opset), None
        else:
            write, reference = form.export_int8(model, example, arch, record,
                                                [c.to(device) for c in chunks], opset)
        atomic_write(tmp if verify else out, write, mode="wb")
        record["check"] = None
        if verify:
            inputs = [_random_inputs(arch, batch, VERIFY_SEED)] if chunks is None else \
                chunks[:max(1, 64 // batch)]  # int8: checked on images (noise has other ranges)
            if record["dynamic_batch"] and chunks is None:
                inputs.append(_random_inputs(arch, batch + VERIFY_EXTRA_BATCH, VERIFY_SEED + 2))
            check = (check_equivalence(model, tmp, fmt, inputs) if reference is None else
                     check_equivalence(reference(tmp), tmp, fmt, inputs, form.int8_tolerance,
                                       scaled_atol=True))
            record["check"] = check
            if not check["ok"]:
                rtol, atol = check["rtol"], check["atol"]
                what = "eager model" if reference is None else f"fake-quantized {quantize} model"
                if reference is not None:
                    atol = f"{atol:g}·max|y|"
                raise FbnasError(
                    f"{out}: the exported {fmt} model differs from the {what} (max abs "
                    f"diff {check['max_abs_diff']:.3g}, max rel diff {check['max_rel_diff']:.3g},"
                    f" allowed {atol} + {rtol:g}·|y|); not written")
            os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        model.train(was_training)
    record["bytes"] = out.stat().st_size
    return record


# ---- loading and checking -------------------------------------------------------------------
def load_exported(path: str | os.PathLike, fmt: str | None = None):
    """A callable taking an NCHW float tensor and returning logits (the TorchScript module in
    eval mode on the CPU, an OnnxModule, ...); the format comes from the suffix unless given."""
    p = Path(path)
    return _format(p, fmt).load_file(p)


class ExportedModel:
    """An exported file called like the eager model on batches of any size (a static
    program, .pte, runs them in slices of its own batch, the last one padded): what
    `fbnas eval --model` measures the accuracy of."""

    def __init__(self, path: str | os.PathLike, fmt: str | None = None):
        self.run = load_exported(path, fmt)
        shape = getattr(self.run, "input_shape", None)
        self.batch = int(shape()[0]) if callable(shape) else None

    def eval(self) -> ExportedModel:
        return self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.cpu().float()
        if self.batch is None:
            return torch.as_tensor(self.run(x))
        out = []
        for part in x.split(self.batch):
            n = len(part)
            if n < self.batch:
                part = torch.cat([part, part.new_zeros(self.batch - n, *part.shape[1:])])
            out.append(torch.as_tensor(self.run(part))[:n])
        return torch.cat(out)


def exported_metadata(path: str | os.PathLike, fmt: str | None = None) -> dict[str, Any]:
    """What an export embeds about its architecture: {"arch_hash", "arch_name", "arch" (the
    architecture mapping)} and, for TorchScript and pt2, "record" (export_child's record)."""
    p = Path(path)
    return _format(p, fmt).read_metadata(p)


@torch.no_grad()
def check_equivalence(model: nn.Module, exported_path: str | os.PathLike, fmt: str,
                      inputs: torch.Tensor | Sequence[torch.Tensor],
                      tolerance: tuple[float, float] | None = None,
                      scaled_atol: bool = False) -> dict[str, Any]:
    """Run the exported model and the eager `model` (eval mode) on the same `inputs` (one
    batch, or a list of batches) and compare the outputs.

    Returns {"format", "samples", "max_abs_diff", "max_rel_diff", "argmax_agreement", "rtol",
    "atol", "ok"}. `ok` is |exported - eager| <= atol + rtol·|eager| everywhere, with (rtol,
    atol) = `tolerance` or the format's. The relative diff is elementwise |Δ| / |eager| over
    the logits whose magnitude is at least 1e-3 of the batch's largest (so a near-zero logit
    does not dominate it); argmax agreement is the fraction of rows whose top class agrees.
    `scaled_atol`: atol is a fraction of the batch's largest |eager| logit (an int8 program's
    error scales with its logits: each layer rounds to a step of its own range).
    """
    fmt = check_format(fmt)
    rtol, atol = tolerance if tolerance is not None else FORMATS.get(fmt).tolerance
    batches = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    if not batches:
        raise FbnasError("check_equivalence: no inputs")
    exported = load_exported(exported_path, fmt)
    is_module = isinstance(model, nn.Module)
    was_training = is_module and model.training
    if is_module:
        model.eval()
    params = next(model.parameters(), None) if is_module else None
    device = params.device if params is not None else torch.device("cpu")
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
            a = atol * float(mag.max(initial=0.0)) if scaled_atol else atol
            ok = ok and bool(np.all(diff <= a + rtol * mag)) and bool(np.isfinite(got).all())
            rows = ref.reshape(ref.shape[0], -1)
            agree += int((rows.argmax(1) == got.reshape(got.shape[0], -1).argmax(1)).sum())
            n += rows.shape[0]
    finally:
        if is_module:
            model.train(was_training)
    return {"format": fmt, "samples": n, "max_abs_diff": max_abs, "max_rel_diff": max_rel,
            "argmax_agreement": agree / n if n else 1.0, "rtol": rtol, "atol": atol, "ok": ok}


# ---- helpers --------------------------------------------------------------------------------
def _calibration_chunks(images: torch.Tensor | None, arch: Architecture, batch: int
                        ) -> list[torch.Tensor]:
    """An int8 export's calibration images as batches of the example's size (a static
    program observes its ranges at that batch); one line where they are missing or shaped
    unlike the network's input."""
    want = (arch.macro.in_channels, *arch.macro.input_size)
    if images is None or len(images) == 0:
        raise FbnasError("--quantize int8: needs calibration images (the checkpoint's "
                         "training data); none given")
    if images.dim() != 4 or tuple(images.shape[1:]) != want:
        raise FbnasError(f"--quantize int8: calibration images of shape "
                         f"{tuple(images.shape)}, the network takes N×{'×'.join(map(str, want))}")
    if len(images) < batch:
        raise FbnasError(f"--quantize int8: {len(images)} calibration image(s), fewer than "
                         f"--batch {batch}")
    return list(images[:len(images) - len(images) % batch].float().split(batch))


def _random_inputs(arch: Architecture, batch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, arch.macro.in_channels, *arch.macro.input_size, generator=g)
