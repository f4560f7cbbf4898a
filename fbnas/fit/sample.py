"""Architectures out of a finished (or running) search: what `fbnas sample` writes.

- `hard_arch`: the run's recorded architecture (`arch_hard.yaml`, what `fbnas train`
  returned); `refit=True` runs the final fit again (re-measuring where the run's fit measured)
  and says what changed.
- `soft_archs`: draws from softmax θ, ranked by probability.
- `near_target_bundle` / `pick_measured`: for a device fbnas cannot run on, the K most probable
  architectures predicted near the target as a runtime bundle, then the most probable one the
  device measured inside the band (`onto_target.choose`, the measured fit's rule).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from fbnas.arch import (
    Architecture,
    arch_from_indices,
    arch_indices,
    arch_log_prob,
    checked_meta,
    child_stats,
    sample_soft,
)
from fbnas.config import Config
from fbnas.errors import FbnasError
from fbnas.fit.onto_target import Round, choose, near_target
from fbnas.fit.search_run import SearchRun
from fbnas.fit.select import Selector
from fbnas.fit.select import refit as refit_run
from fbnas.io import write_json_atomic
from fbnas.latency.bundle import RUNTIMES, network_latencies_us, read_results, write_bundle
from fbnas.latency.cost_model import predicted_cost
from fbnas.latency.kinds import is_measured
from fbnas.runs.files import ARCH

NEAR_TARGET = "near_target_bundle.json"  # which bundle `--near-target` wrote for the run


def hard_arch(run: SearchRun, refit: bool = False, fit_measure: str | None = None,
              log: Callable[[str], None] = print) -> Architecture:
    """The run's architecture: `arch_hard.yaml` as `fbnas train` wrote it at its last epoch.
    `refit`: θ's argmax fitted again (`fit_measure` overriding the run's setting), and a line
    saying whether it differs from the recorded one. A run that has not finished has nothing
    recorded: its argmax is fitted by the table only, unless `refit`."""
    cfg, table = run.config, run.table
    recorded = _recorded(run)
    if refit or recorded is None:
        if recorded is None and not refit:
            log(f"{run.dir} has not finished its search (epoch {run.epoch} of "
                f"{cfg.search.epochs}): θ's argmax fitted by the table (--refit to measure)")
            fit_measure = "off"
        a = refit_run(run, fit_measure, log)
        if refit and recorded is not None:
            log(_compare(a, recorded, table.unit if table is not None else ""))
        return a
    log(f"the run's architecture ({run.files.arch}, as fbnas train returned it)")
    return recorded


def _recorded(run: SearchRun) -> Architecture | None:
    if run.epoch < run.config.search.epochs or run.arch is None:
        return None
    run.arch.check_fits(run.config.space, str(run.files.arch))
    return run.arch


def _compare(new: Architecture, old: Architecture, u: str) -> str:
    """One line: the re-fitted architecture against the recorded one, op by op and measured."""
    what = f"re-fitted ({'re-measured' if 'measured' in new.meta else 'by the table'})"
    figs = "".join(f"; measured {a.meta['measured']:.1f} {u} {w}"
                   for a, w in ((new, "now"), (old, "by the run")) if "measured" in a.meta)
    if new.ops == old.ops:
        return f"{what}: the same architecture as the run's {ARCH}{figs}"
    diff = ", ".join(f"layer {i}: {a} -> {b}"
                     for i, (a, b) in enumerate(zip(old.ops, new.ops, strict=True)) if a != b)
    return f"{what}: differs from the run's {ARCH} ({diff}){figs}"


def soft_archs(cfg: Config, theta: list[torch.Tensor], n: int, seed: int) -> list[Architecture]:
    """Up to `n` distinct draws from softmax θ, most probable first."""
    if n < 1:
        raise FbnasError(f"sample: -n must be >= 1, got {n}")
    g = torch.Generator().manual_seed(seed)
    seen: dict[str, Architecture] = {}
    for _ in range(n):
        a = sample_soft(cfg.space, theta, g)
        seen.setdefault(a.hash(), a)
    return sorted(seen.values(), key=lambda a: -arch_log_prob(cfg.space, theta, a))


def described(a: Architecture, name: str, run: SearchRun) -> Architecture:
    """`a` named for the run, its meta the fit's record plus its probability under θ, size and
    the table's prediction."""
    space, theta, table = run.config.space, run.theta, run.table
    stats = child_stats(a)
    lp = arch_log_prob(space, theta, a)
    probs = [torch.softmax(t.float(), -1) for t in theta]
    meta = {
        **{k: v for k, v in (a.meta or {}).items() if k != "run"},  # the fit's record
        "run": str(run.dir), "epoch": int(run.epoch), "selection": name,
        "probability": math.exp(lp), "log_probability": lp,
        "layer_probabilities": [round(float(p[i]), 4)
                                for p, i in zip(probs, arch_indices(space, a), strict=True)],
        "params": stats["params"], "flops": stats["flops"],
    }
    if table is not None:
        # the fit's own figure where it recorded one, else the table's
        meta.setdefault("predicted", round(table.predict(a, "auto", space), 3))
        meta["cost_unit"] = table.unit
    return Architecture(a.macro, a.ops, f"{space.name}_{name}", space.name, checked_meta(meta))


def check_bundle_target(run: SearchRun, what: str) -> None:
    """A bundle times runtime programs: its figures compare with the run's target only where
    the run searched on a table of that runtime (measured here or imported from one)."""
    cfg, table, run_dir = run.config, run.table, run.dir
    if table is None or not is_measured(table.cost) or cfg.loss.target is None:
        raise FbnasError(f"sample {what}: {run_dir} has no latency target (loss.target) and "
                         "latency table (cost_table.json) to measure against")
    if table.meta.get("backend") not in RUNTIMES:
        raise FbnasError(f"sample {what}: {run_dir}'s latency table was timed with "
                         f"{table.meta.get('backend')!r}, but a bundle times "
                         f"{'/'.join(RUNTIMES)} programs; search on such a table (latency.device: "
                         "executorch, or one imported from a bundle) to measure on the device")


def near_target_bundle(run: SearchRun, k: int, near: float, bundle: str | None,
                       log: Callable[[str], None] = print) -> list[Architecture]:
    """The `k` most probable architectures predicted across target x (1 ± near), written as a
    runtime bundle `bundle`; the run remembers which bundle it wrote (NEAR_TARGET)."""
    check_bundle_target(run, "--near-target")
    cfg, theta, table, run_dir = run.config, run.theta, run.table, run.dir
    if not bundle:
        raise FbnasError("sample --near-target: give the bundle folder to write, --bundle DIR")
    if k < 1 or not 0 < near < 1:
        raise FbnasError(f"sample --near-target {k} --near {near}: K must be >= 1 and F in "
                         "(0, 1)")
    costs, target = run.costs, run.target
    # a width-searched run's networks at the widths the table's fit chooses for the target
    tf = Selector(cfg, theta, costs, target).table_fit()
    widths = tf.widths
    picks = near_target(theta[:len(tf.rows)], tf.rows, tf.fixed, target, k, near)
    archs = [arch_from_indices(cfg.space, [*idx, *widths], f"near_{i + 1}")
             for i, idx in enumerate(picks)]
    purpose = {"near_target": {"run": str(run_dir.resolve()), "target": target,
                               "unit": costs.unit, "tolerance": cfg.search.fit_tolerance,
                               "table": table.fingerprint()}}
    man = write_bundle(cfg.space, bundle, table=table, probes=0,
                       threads=int(table.meta.get("threads") or 1), networks=archs,
                       purpose=purpose, log=log)
    write_json_atomic(run_dir / NEAR_TARGET, {"bundle": man["bundle_id"],
                                              "folder": str(Path(bundle).resolve())})
    for a, idx in zip(archs, picks, strict=True):
        log(f"  {a.name}: predicted {predicted_cost(tf.rows, tf.fixed, idx):.1f} "
            f"{costs.unit}, p={math.exp(arch_log_prob(cfg.space, theta, a)):.3g}  "
            f"{' '.join(a.ops)}")
    return archs


def pick_measured(run: SearchRun, results: str, log: Callable[[str], None] = print
                  ) -> Architecture:
    """The most probable of a `near_target_bundle`'s networks measured (on the device, in
    `results`) within ±search.fit_tolerance of the target; none inside is a one-line error."""
    check_bundle_target(run, "--pick")
    cfg, theta, run_dir = run.config, run.theta, run.dir
    res, man = read_results(results)
    wrote = run_dir / NEAR_TARGET
    mine = json.loads(wrote.read_text())["bundle"] if wrote.is_file() else None
    if mine is None or man.get("bundle_id") != mine:
        raise FbnasError(f"{results}: results of bundle {man.get('bundle_id')!r}, but "
                         f"{run_dir}'s --near-target bundle is {mine!r}")
    costs = run.costs
    target, tol = run.target, cfg.search.fit_tolerance
    cands = cfg.space.layer_candidates()
    rounds, choices, model = [], {}, costs.model(cfg.space)
    for a, med, iqr in network_latencies_us(res, man).values():
        idx = arch_indices(cfg.space, a)  # ops, then widths where the run searched them
        pred = model.of(idx)
        r = Round(tuple(idx[:len(cands)]), pred, med, iqr, arch_log_prob(cfg.space, theta, a),
                  abs(med / target - 1) <= tol)
        rounds.append(r)
        choices[id(r)] = idx
        log(f"  {a.name}: predicted {r.predicted:.1f}, measured {med:.1f} {costs.unit} "
            f"({med / target - 1:+.1%} from {target:.1f}){'  inside' if r.inside else ''}")
    best = choose(rounds, target, (tol,))
    if not best.inside:
        raise FbnasError(f"{results}: none of {len(rounds)} networks measured within "
                         f"±{tol:.0%} of {target:.1f} {costs.unit} (nearest "
                         f"{best.measured / target - 1:+.1%}); write a bundle with a wider "
                         "--near or more networks")
    meta = {"run": str(run_dir), "selection": "picked", "target": target,
            "predicted": round(best.predicted, 3), "measured": round(best.measured, 3),
            "measured_rel_iqr": round(best.rel_iqr, 4), "measured_on": res["device"],
            "bundle": man["bundle_id"], "fit_rounds": [r.to_dict(cands) for r in rounds]}
    arch = arch_from_indices(cfg.space, choices[id(best)], f"{cfg.space.name}_picked", **meta)
    log(f"the most probable of {sum(r.inside for r in rounds)} inside ±{tol:.0%}: predicted "
        f"{best.predicted:.1f}, measured {best.measured:.1f} {costs.unit} "
        f"({best.measured / target - 1:+.1%})  {arch.choices_text(cfg.space)}")
    return arch
