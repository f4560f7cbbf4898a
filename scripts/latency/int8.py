"""The found network deployed int8: accuracy and latency of a retrained child exported as int8
programs, beside its fp32 programs.

    fbnas train --config configs/quickstart.yaml --set run.dir=runs/qs
    fbnas retrain --arch runs/qs/arch_hard.yaml --config configs/quickstart.yaml \\
        --set run.dir=runs/qs_rt
    python -m scripts.latency.int8 --checkpoint runs/qs_rt/retrain-HASH [--rounds 30]

For the checkpoint: `.pte` (ExecuTorch/XNNPACK) and `.onnx` (ONNX Runtime) exports in fp32
and in int8 (`fbnas export --quantize int8`: calibrated on the first --calibration-images
training images, each checked against its fake-quantized model: max abs diff and argmax
agreement printed), the test accuracy of the eager model and of every program (as `fbnas eval
--model` reads it), and the programs timed end to end in one interleaved measurement (one
thread, batch 1; ONNX Runtime's fp32 and int8 sessions of the same network as its timer
builds them): median µs, IQR, and the int8 speed-up over fp32 per runtime. Nothing else may
run on the machine while it times.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from fbnas.backends import make_timer
from fbnas.backends.base import input_chw
from fbnas.backends.export import ExportedModel, export_child
from fbnas.config import config_from_dict
from fbnas.data import build_eval_data
from fbnas.latency.measure import Protocol, measure
from fbnas.latency.timed_models import ModelSpec, load_model
from fbnas.retrain import checkpoint_calibration
from fbnas.training.checkpoint import load_child
from fbnas.training.evaluate import evaluate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a retrain run directory or checkpoint")
    ap.add_argument("--calibration-images", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=30, help="interleaved timing rounds")
    ap.add_argument("--no-timing", action="store_true", help="accuracy only")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    arch, model, state = load_child(args.checkpoint)
    cfg = config_from_dict(state["config"], f"{args.checkpoint}: config", finished=True)
    m = arch.macro
    images = checkpoint_calibration(args.checkpoint, arch, state, args.calibration_images)
    test = build_eval_data(cfg.data, m.input_size, m.in_channels, m.num_classes,
                           seed=cfg.search.seed, split="test")
    eager = evaluate(model, test, "cpu")
    print(f"{arch.name} [{arch.short_hash}] {' '.join(arch.ops)}; {len(images)} calibration "
          f"images; test: {eager['n']} images; torch {torch.__version__}")
    print(f"{'program':<12} {'test top-1':>10} {'vs eager':>9} {'check: max|Δ|':>14} "
          f"{'argmax':>7}")
    print(f"{'eager fp32':<12} {100 * eager['top1']:>9.2f}% {'':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for fmt in ("pte", "onnx"):
            for q in ("none", "int8"):
                label = f"{fmt} {'fp32' if q == 'none' else q}"
                path = Path(tmp) / f"{fmt}_{q}.{fmt}"
                rec = export_child(model, arch, fmt, path, quantize=q,
                                   calibration=images if q != "none" else None)
                files[label] = path
                acc = evaluate(ExportedModel(path), test, "cpu")
                c = rec["check"]
                print(f"{label:<12} {100 * acc['top1']:>9.2f}% "
                      f"{100 * (acc['top1'] - eager['top1']):>+8.2f}pt "
                      f"{c['max_abs_diff']:>14.4f} {c['argmax_agreement']:>7.1%}")
        if args.no_timing:
            return 0
        cpu = make_timer("cpu", threads=1)
        runs = {}
        for label in ("pte fp32", "pte int8"):
            _, net, chw = load_model(ModelSpec(label, "model", str(files[label])), 1, 1)
            runs[label] = cpu.prepare(net, chw, label)
        for q in ("none", "int8"):
            ort = make_timer("ort", threads=1, quantization=q)
            label = f"onnx {'fp32' if q == 'none' else q}"
            runs[label] = ort.prepare(model, input_chw(arch), label)
        mm = measure(cpu, runs, Protocol(rounds=args.rounds))
        scale_us = mm.ref_scale_s * 1e6
        print(f"\nend to end, one thread, batch 1 ({args.rounds} interleaved rounds):")
        med = {}
        for label in runs:
            st = mm.entries[label]
            med[label] = st.quantiles()[1] * scale_us
            print(f"  {label:<10} {med[label]:>9.1f} us  (IQR {st.rel_iqr:.1%})")
        for fmt in ("pte", "onnx"):
            up = med[f"{fmt} fp32"] / med[f"{fmt} int8"]
            print(f"  {fmt}: int8 speed-up over fp32 {up:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
