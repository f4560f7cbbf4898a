"""`fbnas export --checkpoint PATH --format torchscript|onnx|pt2|pte`: a retrained child network
as a TorchScript, ONNX, torch.export (.pt2) or ExecuTorch/XNNPACK (.pte) file, checked against
the eager model before it is written."""

from __future__ import annotations

from pathlib import Path

from fbnas.backends import FORMATS
from fbnas.errors import FbnasError
from fbnas.runs.results import record_program, run_results


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a retrained child network to TorchScript, ONNX, "
                                      ".pt2 or .pte")
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="a retrain checkpoint file, or a retrain run directory")
    p.add_argument("--format", required=True, action="append", metavar="FMT", dest="formats",
                   help=f"{', '.join(FORMATS.choices())} (pt2: torch.export, pte: ExecuTorch, "
                        "XNNPACK); a comma list (pt2,pte,onnx) or repeated to export several")
    p.add_argument("--out", metavar="DIR",
                   help="the folder the programs are written into, as model.ts, model.onnx, "
                        "model.pt2, model.pte (int8: model_int8.pte) (default: the "
                        "checkpoint's run folder). A program written into the checkpoint's run "
                        "folder is recorded in its results.json (`fbnas runs` shows it)")
    p.add_argument("--batch", type=int, default=1, metavar="N",
                   help="batch size of the example input (default 1); the batch axis stays "
                        "dynamic unless --static-batch")
    p.add_argument("--static-batch", action="store_true",
                   help="ONNX and pt2: fix the batch axis at --batch (a .pte is always "
                        "static)")
    p.add_argument("--opset", type=int, metavar="N", help="ONNX opset (default: torch's)")
    p.add_argument("--quantize", choices=("none", "int8"), default="none",
                   help="int8: post-training static quantization as the runtime deploys it "
                        "(pte: XNNPACK's quantizer; onnx: onnxruntime's QDQ), calibrated on "
                        "the checkpoint's training images and checked against the "
                        "fake-quantized model")
    p.add_argument("--calibration-images", type=int, default=256, metavar="N",
                   help="training images the int8 ranges are observed on (default 256)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip comparing the exported model's outputs with the eager model's")
    p.set_defaults(func=run)


def run(args) -> int:
    from fbnas.backends.export import (
        check_format,
        export_child,
        opset_formats,
        require_extras,
        require_quantization,
    )
    from fbnas.retrain import checkpoint_calibration
    from fbnas.training.checkpoint import load_child

    formats: list[str] = []
    for item in args.formats:
        for part in str(item).split(","):
            if part.strip():
                fmt = check_format(part, "--format")
                if fmt not in formats:
                    formats.append(fmt)
    if not formats:
        raise FbnasError(f"--format: give one or more of {', '.join(FORMATS.choices())}")
    if args.batch < 1:
        raise FbnasError(f"--batch: must be >= 1, got {args.batch}")
    with_opset = opset_formats()
    if args.opset is not None and not set(formats) & set(with_opset):
        raise FbnasError(f"--opset: only applies to --format {' or '.join(with_opset)}")
    verify = not args.no_verify
    for fmt in formats:  # before any work, so that a missing extra does not leave half a job
        require_extras(fmt, verify)
    outs = _outputs(args.out, args.checkpoint, formats, args.quantize)

    if args.calibration_images < 1:
        raise FbnasError(f"--calibration-images: must be >= 1, got {args.calibration_images}")
    for fmt in formats:  # before the checkpoint loads
        require_quantization(fmt, args.quantize)
    arch, model, state = load_child(args.checkpoint)
    images = (checkpoint_calibration(args.checkpoint, arch, state, args.calibration_images)
              if args.quantize != "none" else None)
    for fmt in formats:
        rec = export_child(model, arch, fmt, outs[fmt], batch=args.batch,
                           dynamic_batch=not args.static_batch,
                           opset=args.opset if fmt in with_opset else None, verify=verify,
                           quantize=args.quantize, calibration=images)
        check = rec["check"]
        verified = (f"max abs diff {check['max_abs_diff']:.2g} (atol {check['atol']:g}), "
                    f"argmax agree {check['argmax_agreement']:.0%} on {check['samples']}"
                    if check else "not verified")
        note = (f"  (legacy ONNX exporter: {rec['fallback_reason']})"
                if rec.get("fallback_reason") else "")
        if "quantization" in rec:
            fmt = f"{fmt} {rec['quantization']} ({rec['calibration_images']} calibration images)"
        key = record_program(run_results(args.checkpoint), rec["path"], fresh=True,
                             format=rec["format"], quantization=args.quantize,
                             bytes=rec["bytes"])
        if key is not None:
            note += f"  (recorded in the run's results.json as {key})"
        print(f"{rec['path']}: {fmt} {_size(rec['bytes'])}  {verified}  "
              f"[{arch.short_hash}]{note}")
    return 0


def _outputs(out: str | None, checkpoint: str, formats: list[str], quantize: str
             ) -> dict[str, Path]:
    from fbnas.backends.export import program_name
    from fbnas.runs.files import RunFiles

    if out is None:  # beside the checkpoint, in its run folder
        return {fmt: RunFiles.of(checkpoint).dir / program_name(fmt, quantize)
                for fmt in formats}
    if Path(out).is_file():
        raise FbnasError(f"--out: {out} is a file; give the folder to write "
                         f"{', '.join(program_name(f, quantize) for f in formats)} into")
    return {fmt: Path(out) / program_name(fmt, quantize) for fmt in formats}


def _size(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / 1024:.1f} KiB"
