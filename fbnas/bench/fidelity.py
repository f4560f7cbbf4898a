"""How far to trust the supernet's accuracy estimate: its ranking of architectures against
training each of them alone (`fbnas fidelity RUN_DIR`).

For N architectures of a search run's space (uniformly random, distinct; the run's own
arch_hard.yaml first when it is there), the supernet estimate is the accuracy of that single
path on the validation split with the supernet's weights, after re-estimating its BatchNorm
statistics on un-augmented weight-split images (exactly what the search logs as `argmax_path_acc`).
The stand-alone accuracy is the validation top-1 of the same architecture retrained from
scratch with the config's retrain recipe (`--retrain-epochs` to shorten it). Both use the
search's validation split, which neither the weights nor θ were trained on. The report gives
Kendall τ and Spearman ρ between the two (scipy.stats), with their p-values, and Kendall τ
between the two validation cross-entropies (`kendall_tau_ce`): on a small split where every
network gets nearly the same images right, CE still resolves how sure each one is.

With `--retrain-seeds K` (K >= 2) each architecture is retrained K times (retrain.seed, +1,
…) and the stand-alone figures are the means; the report then also gives the noise ceiling,
Kendall τ between the retrains of seed 0 and seed 1 (`retrain_vs_retrain_tau`, and `_ce`):
how well retraining ranks these networks against itself. No supernet estimate can be
expected to rank them better than that; on digits, where every network of the quickstart
space retrains to 95–99%, it is low (docs/search_modes.md).

Re-running the same command resumes: finished retrains are read back, not redone.

With `bench` (a ground-truth benchmark of the run's space, fbnas.bench) nothing is retrained:
the stand-alone figures are the benchmark's records at its full budget, one per seed (so the
noise ceiling comes with them), and `n=None` ranks every network of the space; of a sampled
benchmark (fbnas.bench.sample), the networks of its reference sample instead (the run's own
network first where the file holds it: `fbnas bench add`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fbnas.arch import Architecture, arch_indices, random_archs
from fbnas.bench.table import Bench, check_space
from fbnas.config import Config, apply_overrides, config_from_dict, with_retrain_epochs
from fbnas.data.loaders import take_images
from fbnas.errors import FbnasError
from fbnas.fit.search_run import SearchRun
from fbnas.io import ensure_dir, load_json, write_json_atomic
from fbnas.retrain import ChildTrainer
from fbnas.runs.files import RunFiles
from fbnas.supernet import Supernet
from fbnas.training.evaluate import path_sums
from fbnas.training.logs import close_logger


@dataclass
class Point:
    arch: Architecture
    supernet_acc: float = float("nan")
    supernet_ce: float = float("nan")
    standalone_acc: float = float("nan")
    standalone_ce: float = float("nan")
    # per retrain seed: (val top-1, val CE); the stand-alone figures above are their means
    seeds: list[tuple[float, float]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def supernet_accuracy(net: Supernet, arch: Architecture, cfg: Config, data,
                      device: torch.device) -> tuple[float, float]:
    """Validation (accuracy, mean CE) of `arch`'s path on the supernet weights, BN
    re-estimated. The CE resolves what a few hundred images' accuracy cannot (two paths that
    get the same images right differ in how sure they are)."""
    m, active = net.path(arch_indices(cfg.space, arch))
    limit = cfg.search.bn_calib_samples
    if limit:
        net.recalibrate_bn(take_images(data.calib_loader, limit, device), m, active)
    s = path_sums(net, data.val_loader, device, m, active)
    return s["correct"] / max(s["n"], 1), s["ce"] / max(s["n"], 1)


class Fidelity:
    def __init__(self, run_dir: str | Path, n: int | None = 10, seed: int = 0,
                 retrain_epochs: int | None = None, out: str | Path | None = None,
                 overrides: list[str] | None = None, log=print, retrain_seeds: int = 1,
                 bench: str | Path | None = None):
        self.run_dir = Path(run_dir)
        self.search = SearchRun.open(self.run_dir)
        self.base = apply_overrides(self.search.state["config"], list(overrides or []))
        if retrain_epochs is not None:
            self.base = with_retrain_epochs(self.base, retrain_epochs)
        self.cfg = config_from_dict(self.base, f"{self.search.checkpoint}: config",
                                    finished=True)
        if self.cfg.data.val_fraction == 0:
            raise FbnasError(f"{self.run_dir}: data.val_fraction is 0, so there is no "
                             "validation split to estimate accuracy on")
        self.bench = Bench.load(bench) if bench else None
        if self.bench is not None:
            check_space(self.bench, self.cfg, self.run_dir)
            retrain_seeds = len(self.bench.seeds)
            if n is None:
                mine = [self.search.arch.hash()] if self.search.arch is not None else []
                n = (len({*self._drawn(), *mine}) if self.bench.sampled else len(self.bench))
        if n is None or n < 3:
            raise FbnasError(f"fidelity: -n must be >= 3 for a rank correlation, got {n}")
        if retrain_seeds < 1:
            raise FbnasError(f"fidelity: --retrains must be >= 1, got {retrain_seeds}")
        self.n, self.seed, self.log, self.retrain_seeds = n, seed, log, retrain_seeds
        self.out = Path(out) if out else self.run_dir / "fidelity"

    def archs(self) -> list[Architecture]:
        first: list[Architecture] = []
        if self.search.arch is not None:
            first.append(self.search.arch)
        taken = {a.hash() for a in first}
        if self.bench is not None and self.bench.sampled:  # its reference sample's networks
            return (first + [self.bench.arch(k) for k in self._drawn() if k not in taken]
                    )[:self.n]
        return first + random_archs(self.cfg.space, self.n - len(first), self.seed, taken)

    def _drawn(self) -> list[str]:
        """A sampled benchmark's trained reference networks (empty for an exhaustive one)."""
        if self.bench is None or not self.bench.sampled:
            return []
        return [k for k in self.bench.reference() if self.bench.complete(k)]

    def run(self) -> dict[str, Any]:
        ensure_dir(self.out)
        device = torch.device("cpu")
        net = self.search.supernet(self.cfg)
        data = self.search.search_data(self.cfg)
        points = [Point(a) for a in self.archs()]
        for i, p in enumerate(points):
            p.supernet_acc, p.supernet_ce = supernet_accuracy(net, p.arch, self.cfg, data,
                                                              device)
            self.log(f"[{i + 1}/{len(points)}] {p.arch.short_hash} supernet val acc "
                     f"{p.supernet_acc:.4f}, CE {p.supernet_ce:.4f}")
        for i, p in enumerate(points):
            if self.bench is not None:
                full = [r for r in self.bench.records(p.arch)
                        if r["budget"] == self.bench.budgets[-1]]
                results = [{"val_top1": r["val_acc"], "val_ce": r["val_ce"],
                            "top1": r["test_acc"], "flops": r["flops"]} for r in full]
            else:
                results = [self._retrain(p.arch, k) for k in range(self.retrain_seeds)]
            p.seeds = [(float(r["val_top1"]), float(r.get("val_ce") or float("nan")))
                       for r in results]
            p.standalone_acc = statistics.fmean(a for a, _ in p.seeds)
            p.standalone_ce = statistics.fmean(c for _, c in p.seeds)
            p.extra = {"test_top1": results[0].get("top1"), "flops": results[0].get("flops")}
            self.log(f"[{i + 1}/{len(points)}] {p.arch.short_hash} retrained val top-1 "
                     f"{p.standalone_acc:.4f}")
        return self._report(points)

    def _retrain(self, arch: Architecture, k: int = 0) -> dict[str, Any]:
        """Retrain `arch` with the config's retrain seed + k (its own run folder per k)."""
        run = self.out / (f"retrain-{arch.short_hash}" + (f"-s{k}" if k else ""))
        if RunFiles(run).results.is_file():
            return load_json(RunFiles(run).results)
        seed = [f"retrain.seed={self.cfg.retrain.seed + k}"] if k else []
        cfg = config_from_dict(apply_overrides(self.base, [
            f"run.dir={run}", "retrain.measure_latency=false", "run.progress=false", *seed]),
            "fidelity")
        t = ChildTrainer(cfg, arch, run, resume=RunFiles(run).checkpoint.is_file())
        try:
            return t.train()
        finally:
            close_logger(t.log)

    def _report(self, points: list[Point]) -> dict[str, Any]:
        from scipy import stats  # scipy.stats: 0.6 s, here only

        a = [p.supernet_acc for p in points]
        b = [p.standalone_acc for p in points]
        # by cross-entropy on both sides: what a few hundred validation images resolve where
        # their accuracy cannot (every network of a small space may get the same images right)
        ca = [p.supernet_ce for p in points]
        cb = [p.standalone_ce for p in points]
        tau = rho = tau_ce = None
        if len(set(a)) > 1 and len(set(b)) > 1:  # else the correlations are undefined
            tau, rho = stats.kendalltau(a, b), stats.spearmanr(a, b)
        if len(set(ca)) > 1 and len(set(cb)) > 1 and not any(map(math.isnan, ca + cb)):
            tau_ce = stats.kendalltau(ca, cb)

        # the noise ceiling: the retrained networks ranked against themselves (two seeds)
        ceil = ceil_ce = None
        if self.retrain_seeds >= 2:
            r0, r1 = ([p.seeds[k][0] for p in points] for k in (0, 1))
            c0, c1 = ([p.seeds[k][1] for p in points] for k in (0, 1))
            if len(set(r0)) > 1 and len(set(r1)) > 1:
                ceil = stats.kendalltau(r0, r1)
            if not any(map(math.isnan, c0 + c1)):
                ceil_ce = stats.kendalltau(c0, c1)

        def num(r, key):
            return None if r is None else float(getattr(r, key))

        summary = {
            "run": str(self.run_dir), "n": len(points), "mode": self.cfg.search.mode,
            "retrain_epochs": self.cfg.retrain.epochs,
            "kendall_tau": num(tau, "statistic"), "kendall_p": num(tau, "pvalue"),
            "spearman": num(rho, "statistic"), "spearman_p": num(rho, "pvalue"),
            "kendall_tau_ce": num(tau_ce, "statistic"), "kendall_p_ce": num(tau_ce, "pvalue"),
            "retrain_seeds": self.retrain_seeds,
            "retrain_vs_retrain_tau": num(ceil, "statistic"),
            "retrain_vs_retrain_tau_ce": num(ceil_ce, "statistic"),
            "points": [{"hash": p.arch.hash(), "ops": list(p.arch.ops),
                        "supernet_val_acc": p.supernet_acc, "supernet_val_ce": p.supernet_ce,
                        "standalone_val_top1": p.standalone_acc,
                        "standalone_val_ce": p.standalone_ce,
                        "standalone_seeds": [list(t) for t in p.seeds], **p.extra}
                       for p in points],
        }
        write_json_atomic(self.out / "fidelity.json", summary)
        head = (f"ranking fidelity of {self.run_dir} ({len(points)} architectures, "
                f"{self.cfg.search.mode}): ")
        by_acc = ("by val accuracy: Kendall tau and Spearman undefined (every estimate, or "
                  "every retrained accuracy, is the same)" if tau is None else
                  f"by val accuracy: Kendall tau {summary['kendall_tau']:.3f} (p "
                  f"{summary['kendall_p']:.3g}), Spearman {summary['spearman']:.3f} (p "
                  f"{summary['spearman_p']:.3g})")
        by_ce = ("" if tau_ce is None else
                 f"; by val CE (supernet vs retrained): Kendall tau "
                 f"{summary['kendall_tau_ce']:.3f} (p {summary['kendall_p_ce']:.3g})")
        ceiling = ("" if self.retrain_seeds < 2 else
                   "; noise ceiling (retrain seed 0 vs 1): Kendall tau "
                   + " / ".join("undefined" if v is None else f"{v:.3f}" for v in (
                       summary["retrain_vs_retrain_tau"], summary["retrain_vs_retrain_tau_ce"]))
                   + " (accuracy / CE)")
        self.log(head + by_acc + by_ce + ceiling + f" -> {self.out / 'fidelity.json'}")
        return summary
