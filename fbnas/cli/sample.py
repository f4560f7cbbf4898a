"""`fbnas sample RUN_DIR [--hard | --soft -n K]`: architectures out of a search run.

`--hard` is the architecture `fbnas train` returned: argmax θ fitted onto the run's target by
its table, then timed here and re-fitted where this machine can time the table's device
(`search.fit_measure`, `--fit-measure`). For a device fbnas cannot run on, `--near-target K
--bundle DIR` writes the K most probable architectures predicted near the target as a runtime
bundle, and `--pick DIR/results.json` (after `run_bundle.py` ran on the device) chooses the
most probable one measured inside the band.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from fbnas.arch import (
    Architecture,
    arch_from_indices,
    arch_log_prob,
    child_stats,
    sample_soft,
)
from fbnas.errors import FbnasError
from fbnas.fit.costs import fit_search_run, load_search_run, run_costs, run_table, run_target
from fbnas.fit.onto_target import Round, cost_lists, near_target, predicted_cost
from fbnas.io import write_json_atomic
from fbnas.latency.bundle import RUNTIMES, network_latencies_us, read_results, write_bundle

NEAR_TARGET = "near_target_bundle.json"  # which bundle `--near-target` wrote for the run


def add_parser(sub) -> None:
    p = sub.add_parser("sample", help="write architecture YAML from a search run's θ")
    p.add_argument("run_dir", help="a search run directory")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--hard", action="store_true", help="argmax θ per layer (default)")
    mode.add_argument("--soft", action="store_true", help="draw from softmax θ per layer")
    p.add_argument("-n", type=int, default=5, help="draws for --soft (deduplicated by hash)")
    p.add_argument("--seed", type=int, default=0, help="random seed for --soft")
    p.add_argument("--out", help="output folder (default RUN_DIR/samples)")
    p.add_argument("--fit-measure", choices=("auto", "on", "off"),
                   help="--hard: time the fitted network here and re-fit (default: the run's "
                        "search.fit_measure)")
    mode.add_argument("--near-target", type=int, metavar="K",
                      help="write the K most probable architectures predicted near the run's "
                           "target as a runtime bundle (--bundle DIR) to time on the device")
    p.add_argument("--near", type=float, default=0.1, metavar="F",
                   help="--near-target: predictions spread over target x (1 ± F) (default 0.1)")
    p.add_argument("--bundle", metavar="DIR", help="--near-target: the bundle folder to write")
    mode.add_argument("--pick", metavar="RESULTS",
                      help="a --near-target bundle's results.json: pick the most probable "
                           "architecture measured within search.fit_tolerance of the target")
    p.set_defaults(func=run)


def run(args) -> int:
    run_dir = Path(args.run_dir)
    state, cfg, theta = load_search_run(run_dir)
    space = cfg.space
    table = run_table(run_dir)
    out = Path(args.out) if args.out else run_dir / "samples"
    if args.near_target is not None:
        return _near_target(args, run_dir, cfg, theta, table)
    if args.pick:
        return _pick(args, run_dir, cfg, theta, table, out)
    if args.bundle:
        raise FbnasError("sample: --bundle goes with --near-target K")
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
        archs = [fit_search_run(run_dir, args.fit_measure, print, (state, cfg, theta))]
        names = ["hard"]
    probs = [torch.softmax(t.float(), -1) for t in theta]
    for a, name in zip(archs, names, strict=True):
        stats = child_stats(a)
        lp = arch_log_prob(space, theta, a)
        meta = {
            **{k: v for k, v in (a.meta or {}).items() if k != "run"},  # the fit's record
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


def _needs_target(cfg, table, run_dir: Path, what: str) -> None:
    """A bundle times ExecuTorch programs: its figures compare with the run's target only
    where the run searched on an ExecuTorch table (measured here or imported from one)."""
    if table is None or table.cost != "latency" or cfg.loss.target is None:
        raise FbnasError(f"sample {what}: {run_dir} has no latency target (loss.target) and "
                         "latency table (cost_table.json) to measure against")
    if table.meta.get("backend") not in RUNTIMES:
        raise FbnasError(f"sample {what}: {run_dir}'s latency table was timed with "
                         f"{table.meta.get('backend')!r}, but a bundle times "
                         f"{'/'.join(RUNTIMES)} programs; search on such a table (latency.device: "
                         "executorch, or one imported from a bundle) to measure on the device")


def _near_target(args, run_dir: Path, cfg, theta, table) -> int:
    """`--near-target K --bundle DIR`: the K most probable architectures predicted across
    target x (1 ± near), as a runtime bundle; the run remembers which bundle it wrote."""
    _needs_target(cfg, table, run_dir, "--near-target")
    if not args.bundle:
        raise FbnasError("sample --near-target: give the bundle folder to write, --bundle DIR")
    if args.near_target < 1 or not 0 < args.near < 1:
        raise FbnasError(f"sample --near-target {args.near_target} --near {args.near}: K must "
                         "be >= 1 and F in (0, 1)")
    costs = run_costs(cfg, table)
    target = run_target(cfg, costs)
    rows = cost_lists(costs.rows, cfg.space.layer_candidates())
    picks = near_target(theta, rows, costs.fixed, target, args.near_target, args.near)
    archs = [arch_from_indices(cfg.space, idx, f"near_{i + 1}") for i, idx in enumerate(picks)]
    purpose = {"near_target": {"run": str(run_dir.resolve()), "target": target,
                               "unit": costs.unit, "tolerance": cfg.search.fit_tolerance,
                               "table": table.fingerprint()}}
    man = write_bundle(cfg.space, args.bundle, table=table, probes=0,
                       threads=int(table.meta.get("threads") or 1), networks=archs,
                       purpose=purpose, log=print)
    write_json_atomic(run_dir / NEAR_TARGET, {"bundle": man["bundle_id"],
                                              "folder": str(Path(args.bundle).resolve())})
    for a, idx in zip(archs, picks, strict=True):
        print(f"  {a.name}: predicted {predicted_cost(rows, costs.fixed, idx):.1f} "
              f"{costs.unit}, p={math.exp(arch_log_prob(cfg.space, theta, a)):.3g}  "
              f"{' '.join(a.ops)}")
    print(f"copy {args.bundle} to the device, run `python run_bundle.py` there, copy "
          f"results.json back, then: fbnas sample {run_dir} --pick {args.bundle}/results.json")
    return 0


def _pick(args, run_dir: Path, cfg, theta, table, out: Path) -> int:
    """`--pick results.json`: the most probable of the bundle's networks measured within
    ±search.fit_tolerance of the target, written as arch_picked.yaml."""
    _needs_target(cfg, table, run_dir, "--pick")
    res, man = read_results(args.pick)
    wrote = run_dir / NEAR_TARGET
    mine = json.loads(wrote.read_text())["bundle"] if wrote.is_file() else None
    if mine is None or man.get("bundle_id") != mine:
        raise FbnasError(f"{args.pick}: results of bundle {man.get('bundle_id')!r}, but "
                         f"{run_dir}'s --near-target bundle is {mine!r}")
    costs = run_costs(cfg, table)
    target, tol = run_target(cfg, costs), cfg.search.fit_tolerance
    rows = cost_lists(costs.rows, cfg.space.layer_candidates())
    cands = cfg.space.layer_candidates()
    rounds = []
    for a, med, iqr in network_latencies_us(res, man).values():
        idx = [c.index(op) for c, op in zip(cands, a.ops, strict=True)]
        r = Round(tuple(idx), predicted_cost(rows, costs.fixed, idx), med, iqr,
                  arch_log_prob(cfg.space, theta, a), abs(med / target - 1) <= tol)
        rounds.append(r)
        print(f"  {a.name}: predicted {r.predicted:.1f}, measured {med:.1f} {costs.unit} "
              f"({med / target - 1:+.1%} from {target:.1f}){'  inside' if r.inside else ''}")
    inside = [r for r in rounds if r.inside]
    if not inside:
        near = min(rounds, key=lambda r: abs(math.log(r.measured / target)))
        raise FbnasError(f"{args.pick}: none of {len(rounds)} networks measured within "
                         f"±{tol:.0%} of {target:.1f} {costs.unit} (nearest "
                         f"{near.measured / target - 1:+.1%}); write a bundle with a wider "
                         "--near or more networks")
    best = max(inside, key=lambda r: r.log_prob)
    meta = {"run": str(run_dir), "selection": "picked", "target": target,
            "predicted": round(best.predicted, 3), "measured": round(best.measured, 3),
            "measured_rel_iqr": round(best.rel_iqr, 4), "measured_on": res["device"],
            "bundle": man["bundle_id"], "fit_rounds": [r.to_dict(cands) for r in rounds]}
    arch = arch_from_indices(cfg.space, list(best.indices), f"{cfg.space.name}_picked", **meta)
    path = out / "arch_picked.yaml"
    arch.save(path)
    print(f"{path}: the most probable of {len(inside)} inside ±{tol:.0%}: predicted "
          f"{best.predicted:.1f}, measured {best.measured:.1f} {costs.unit} "
          f"({best.measured / target - 1:+.1%})  {' '.join(arch.ops)}")
    return 0
