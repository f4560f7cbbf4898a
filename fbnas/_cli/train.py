"""`fbnas train --config CONFIG.yaml [--set key=value ...]` / `fbnas train --resume RUN_DIR`.

Under `torchrun --nproc-per-node N -m fbnas train ...` it runs as one rank of a distributed
search (docs/distributed.md).
"""

from __future__ import annotations

from pathlib import Path

from fbnas.errors import FbnasError
from fbnas.runs.files import RunFiles


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="run the architecture search (the supernet training)")
    p.add_argument("--config", help="config YAML (space, data, latency, loss, search, run), "
                   "or a shipped config's name (fbnas configs lists them)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set search.epochs=3 (repeatable)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its last checkpoint")
    p.set_defaults(func=run)


def run(args) -> int:
    from fbnas.config import load_config
    from fbnas.trainer import SearchTrainer
    from fbnas.training.loop import run_trainer

    if args.resume:
        run_dir = Path(args.resume)
        cfg_path = Path(args.config) if args.config else RunFiles(run_dir).config
        if not cfg_path.is_file():
            raise FbnasError(f"{run_dir}: no config.yaml there (is it a search run directory?)")
        cfg = load_config(cfg_path, args.set)
    else:
        if not args.config:
            raise FbnasError("give --config CONFIG (a file, or a shipped config: --config "
                             "quickstart; fbnas configs lists them), or --resume RUN_DIR")
        cfg = load_config(args.config, args.set)
        run_dir = Path(cfg.run.dir)
    # under torchrun (WORLD_SIZE > 1) every process runs this; rank 0 writes
    ctx, result = run_trainer(
        lambda ctx: SearchTrainer(cfg, run_dir, resume=bool(args.resume), dist=ctx),
        cfg.search.device, cfg.run.ddp_backend)
    if result is None:
        return 130  # interrupted after saving; the trainer said how to resume
    if ctx.is_main:
        print(f"architecture: {result['choices']}")
        print(f"written: {RunFiles(run_dir).arch}  (fbnas sample {run_dir} --soft -n 5 for "
              "more)")
    return 0
