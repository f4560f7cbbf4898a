"""`fbnas retrain --arch ARCH.yaml --config CONFIG.yaml` / `fbnas retrain --resume RUN_DIR`.

Under `torchrun --nproc-per-node N -m fbnas retrain ...` it runs as one rank of a distributed
(DDP) training (docs/distributed.md).
"""

from __future__ import annotations

from pathlib import Path

from fbnas.errors import FbnasError
from fbnas.io import load_yaml
from fbnas.runs.files import RunFiles

RUN_KEYS = ("arch", "init_from", "extra")  # what a retrain run adds to config.yaml


def add_parser(sub) -> None:
    p = sub.add_parser(
        "retrain", help="train a chosen architecture from scratch; ends with results.json",
        description="Train the child network of ARCH.yaml with the config's retrain recipe "
                    "(data, retrain, latency and run sections; a search config works as is). "
                    "Ends by printing predicted latency (table), measured latency, accuracy, "
                    "params and FLOPs and writing them to RUN_DIR/results.json.")
    p.add_argument("--arch", help="architecture YAML (e.g. RUN/arch_hard.yaml)")
    p.add_argument("--config", help="config YAML (data, retrain, latency, run sections)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set retrain.epochs=5 (repeatable)")
    p.add_argument("--out", metavar="DIR",
                   help="run directory (default: <run.dir>/retrain-<arch hash>)")
    p.add_argument("--init-from-supernet", metavar="SEARCH_RUN",
                   help="start from the supernet weights of the chosen paths in this search run")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the retrain run in RUN_DIR from its last checkpoint")
    p.set_defaults(func=run)


def load_run_config(run_dir: Path, overrides: list[str]):
    """The Config saved in a retrain run directory (without the run's own keys)."""
    from fbnas.config import apply_overrides, config_from_dict

    path = RunFiles(run_dir).config
    if not path.is_file():
        raise FbnasError(f"{run_dir}: no config.yaml there (is it a retrain run directory?)")
    data = load_yaml(path)
    for k in RUN_KEYS:
        data.pop(k, None)
    return config_from_dict(apply_overrides(data, overrides), str(path))


def run(args) -> int:
    from fbnas.arch import Architecture
    from fbnas.config import load_config
    from fbnas.retrain import ChildTrainer
    from fbnas.training.loop import run_trainer

    arch = Architecture.load(args.arch) if args.arch else None
    if args.resume:
        run_dir = Path(args.resume)
        cfg = (load_config(args.config, args.set) if args.config
               else load_run_config(run_dir, args.set))
        if args.init_from_supernet:
            raise FbnasError("retrain: --init-from-supernet applies to a new run, not --resume")
    else:
        if arch is None or not args.config:
            raise FbnasError("retrain: give --arch ARCH.yaml and --config CONFIG.yaml "
                             "(or --resume RUN_DIR)")
        cfg = load_config(args.config, args.set)
        run_dir = (Path(args.out) if args.out
                   else Path(cfg.run.dir) / f"retrain-{arch.short_hash}")
    # under torchrun (WORLD_SIZE > 1) every process runs this; rank 0 writes
    ctx, res = run_trainer(
        lambda ctx: ChildTrainer(cfg, arch, run_dir, resume=bool(args.resume),
                                 init_from=args.init_from_supernet, dist=ctx),
        cfg.retrain.device, cfg.run.ddp_backend)
    if res is None:
        return 130  # interrupted after saving; the trainer said how to resume
    # its one-line report was logged by the trainer
    if ctx.is_main:
        print(f"written: {RunFiles(run_dir).results}  (fbnas runs {run_dir.parent} lists it)")
    return 0
