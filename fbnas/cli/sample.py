"""`fbnas sample RUN_DIR [--hard | --soft -n K]`: architectures out of a search run."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from fbnas.arch import (
    Architecture,
    arch_from_indices,
    arch_log_prob,
    child_stats,
    sample_hard,
    sample_soft,
)
from fbnas.checkpoint import load_checkpoint
from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.latency import LatencyTable
from fbnas.target import cost_lists, cost_range, fit_to_target


def add_parser(sub) -> None:
    p = sub.add_parser("sample", help="write architecture YAML from a search run's θ")
    p.add_argument("run_dir", help="a search run directory")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--hard", action="store_true", help="argmax θ per layer (default)")
    mode.add_argument("--soft", action="store_true", help="draw from softmax θ per layer")
    p.add_argument("-n", type=int, default=5, help="draws for --soft (deduplicated by hash)")
    p.add_argument("--seed", type=int, default=0, help="random seed for --soft")
    p.add_argument("--out", help="output folder (default RUN_DIR/samples)")
    p.set_defaults(func=run)


def run(args) -> int:
    run_dir = Path(args.run_dir)
    ckpt = run_dir / "checkpoint.pt"
    state = load_checkpoint(ckpt, kind="search")
    cfg = config_from_dict(state["config"], str(ckpt))
    space = cfg.space
    theta = []
    for i, cands in enumerate(space.layer_candidates()):
        t = state["model"].get(f"theta.{i}")
        if t is None or t.ndim != 1 or len(t) != len(cands) or not t.is_floating_point():
            raise FbnasError(f"{ckpt}: damaged checkpoint: model.theta.{i} does not fit layer "
                             f"{i} of its search space '{space.name}' ({len(cands)} candidates)")
        theta.append(t)
    table = _load_table(run_dir)
    out = Path(args.out) if args.out else run_dir / "samples"
    if args.soft:
        if args.n < 1:
            raise FbnasError(f"sample: -n must be >= 1, got {args.n}")
        g = torch.Generator().manual_seed(args.seed)
        seen: dict[str, Architecture] = {}
        for _ in range(args.n):
            a = sample_soft(space, theta, g)
            seen.setdefault(a.hash(), a)
        archs = sorted(seen.values(), key=lambda a: -arch_log_prob(space, theta, a))
        names = [f"soft_{i + 1}" for i in range(len(archs))]
    else:
        archs, names = [_hard(cfg, theta, table)], ["hard"]
    probs = [torch.softmax(t.float(), -1) for t in theta]
    for a, name in zip(archs, names, strict=True):
        stats = child_stats(a)
        lp = arch_log_prob(space, theta, a)
        meta = {
            "run": str(run_dir), "epoch": int(state["epoch"]), "selection": name,
            "probability": math.exp(lp), "log_probability": lp,
            "layer_probabilities": [round(float(p[space.layer_candidates()[i].index(op)]), 4)
                                    for i, (p, op) in enumerate(zip(probs, a.ops, strict=True))],
            "params": stats["params"], "flops": stats["flops"],
        }
        if table is not None:
            meta[f"predicted_{table.cost}"] = round(table.predict(a, "auto", space), 3)
            meta["cost_unit"] = table.unit
        arch = Architecture(a.macro, a.ops, f"{space.name}_{name}", space.name, meta)
        path = out / f"arch_{name}.yaml"
        arch.save(path)
        pred = (f"  predicted {meta[f'predicted_{table.cost}']:.1f} {table.unit}"
                if table is not None else "")
        print(f"{path}: p={math.exp(lp):.3g}{pred}  params {stats['params'] / 1e6:.3f} M  "
              f"FLOPs {stats['flops'] / 1e6:.1f} M  [{arch.short_hash}]")
        print(f"  {' '.join(a.ops)}")
    return 0


def _hard(cfg, theta, table) -> Architecture:
    """argmax θ, fitted to the run's loss.target as `fbnas train` fitted arch_hard.yaml."""
    space = cfg.space
    a = sample_hard(space, theta)
    if table is None or cfg.loss.target is None or not cfg.search.fit_target:
        return a
    row_maps, fixed = table.costs_for(space)
    rows = cost_lists(row_maps, space.layer_candidates())
    target = cfg.loss.build(cost_range(rows, fixed)).target
    fit = fit_to_target(theta, rows, fixed, target, cfg.search.fit_tolerance)
    return arch_from_indices(space, fit.indices, a.name)


def _load_table(run_dir: Path):
    p = run_dir / "cost_table.json"
    if not p.exists():  # optional; but one that is there must be readable
        return None

    return LatencyTable.load(p)

