"""`fbnas eval --checkpoint CKPT [--split val|test]`: top-1/top-5 of a retrained child."""

from __future__ import annotations

from pathlib import Path

from fbnas.errors import FbnasError
from fbnas.io import write_json_atomic
from fbnas.runs.results import record_program, run_results
from fbnas.settings import DEVICES


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval", help="top-1/top-5 of a retrained child on a data split",
        description="Evaluate a retrain checkpoint on the val or test split of the data it was "
                    "trained with (or of --config's data section). The child's own BatchNorm "
                    "statistics are used, as a deployed model would.")
    p.add_argument("--checkpoint", required=True,
                   help="a retrain checkpoint, or the retrain run directory holding it")
    p.add_argument("--split", choices=("val", "test"), default="test",
                   help="the data split evaluated")
    p.add_argument("--config", help="take the data section from this config instead")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set data.root=/data (repeatable)")
    p.add_argument("--model", metavar="FILE",
                   help="evaluate this export of the checkpoint (.pte, .onnx, .ts, .pt2; e.g. "
                        "an int8 program) instead of its eager model, on the CPU; on the test "
                        "split of the checkpoint's own data, a program `fbnas export` wrote "
                        "into the run gets its figures in the run's results.json")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="where to evaluate (default %(default)s: a GPU where there is one)")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    p.set_defaults(func=run)


def run(args) -> int:

    import torch

    from fbnas.backends.export import ExportedModel
    from fbnas.config import apply_overrides, config_from_dict, load_config
    from fbnas.data import build_eval_data
    from fbnas.training.checkpoint import load_child
    from fbnas.training.evaluate import evaluate
    from fbnas.training.loop import resolve_device

    device = resolve_device(args.device, "--device")
    arch, model, state = load_child(args.checkpoint, device)
    if args.config:
        cfg = load_config(args.config, args.set)
    elif not isinstance(state.get("config"), dict) or not state["config"]:
        raise FbnasError(f"{args.checkpoint}: the checkpoint holds no config; give --config "
                         "CONFIG.yaml for its data section")
    else:
        cfg = config_from_dict(apply_overrides(state["config"], args.set),
                               f"{args.checkpoint}: config", finished=True)
    m = arch.macro
    loader = build_eval_data(cfg.data, m.input_size, m.in_channels, m.num_classes,
                             seed=cfg.search.seed, split=args.split,
                             pin_memory=device.type == "cuda")
    what = ""
    if args.model:
        model, device, what = ExportedModel(args.model), torch.device("cpu"), f" {args.model}:"
    res = evaluate(model, loader, device)
    print(f"{what}{arch.name} [{arch.short_hash}] {args.split} ({res['n']} images, epoch "
          f"{state.get('epoch', '?')}): top-1 {100 * res['top1']:.2f}%  "
          f"top-5 {100 * res['top5']:.2f}%  CE {res['ce']:.4f}")
    if args.model and args.split == "test" and not args.config and not args.set:
        key = record_program(run_results(args.checkpoint), args.model, top1=res["top1"],
                             top5=res["top5"], test_ce=res["ce"])
        if key is not None:
            print(f"recorded in the run's results.json for {key}")
    if args.json:
        write_json_atomic(args.json, {"checkpoint": str(Path(args.checkpoint)),
                                      **({"model": str(args.model)} if args.model else {}),
                                      "arch_hash": arch.hash(), "split": args.split,
                                      "epoch": state.get("epoch"), **res})
    return 0
