"""`fbnas sweep`: search at several loss settings, retrain each result, draw the front.

For each point of a grid of settings (one loss parameter, e.g. `loss.beta`, or any config key:
`search.mode`, `search.weights`, `search.seed`, `loss.target`, …, each with its values; the
points are their product) the sweep runs a normal search in `OUT/search-<label>`, takes its
argmax architecture, and retrains it in `OUT/retrain-<label>`
with the config's `retrain` recipe. It also retrains the reference architectures of the space
(uniform `ir_k3_e6` / `ir_k5_e6` networks when those ops are candidates everywhere, plus
architecture files given with --reference or found as `archs/*.yaml` next to the config whose
`space:` names this space, e.g. FBNet-A/B/C for the ImageNet space) and a few uniformly random
architectures for contrast. All children are then timed end to end in one interleaved,
drift-compensated measurement (so their latencies are comparable with each other), and the sweep
writes `OUT/sweep.csv`, `OUT/sweep.json` and `OUT/sweep.png` (latency vs. test top-1).

Every step is a normal run directory: running the same command again skips what finished and
resumes what was interrupted. With `seeds`, every value is searched once per search seed
(`search.seed`; labels `<param><value>-seed<S>`). A point's label joins its axes'
`<last part of the key><value>` with `-` (`target0.5x-modereinforce-seed1`).

A point's work is a function of its config alone (`fbnas.sweep._point`: seeded
from the config, its own run directory), so the points can run in any order and in other
processes: `fbnas.sweep.ray_tasks` runs them as Ray tasks (`fbnas sweep --workers N`) and then
hands back to `Sweep.finish` for the end-to-end timing in this process. Results are
bit-identical to the serial sweep's at the same torch thread count (`threads`).

With `bench` (a ground-truth benchmark of the sweep's space and retrain recipe, fbnas.bench)
nothing is retrained or timed: a point's results are the benchmark's (mean test and
validation top-1 over its seeds at the full budget; its end-to-end measured latency), written
to the point's results.json as a retrain would be.

A value of 0 for a cost weight (`alpha`, `beta`, `lambda`) is the cost-blind search
(`loss.kind: ce`). Note that the FBNet loss CE·α·(log LAT)^β uses α only as a scale — Adam,
the θ optimizer, is nearly invariant to it — so its trade-off is swept with β.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fbnas.arch import Architecture, arch_from_indices, random_archs
from fbnas.bench.table import bench_for
from fbnas.config import Config, apply_overrides, config_from_dict, with_retrain_epochs
from fbnas.data import build_eval_data
from fbnas.errors import FbnasError
from fbnas.io import (
    atomic_write,
    ensure_dir,
    load_config_data,
    load_yaml,
    write_json_atomic,
    write_text_atomic,
)
from fbnas.latency.end_to_end import panel, time_archs, timer_for_table, timer_label
from fbnas.latency.kinds import is_measured
from fbnas.latency.measure import Protocol
from fbnas.latency.resolve import find_latency_table
from fbnas.plots import _plt
from fbnas.retrain import target_us_of
from fbnas.runs.files import RunFiles
from fbnas.search.modes import get_mode, refuse_as_theta_mode
from fbnas.settings import LATENCY_TOLERANCE
from fbnas.sweep._point import retrain_config, retrain_point, search_done, search_point
from fbnas.sweep.grid import PARAMS, Axis, axis_label, fmt_value, point_config

REFERENCE_OPS = ("ir_k3_e6", "ir_k5_e6")
CSV_COLUMNS = ("label", "kind", "param", "value", "arch_hash", "name", "target_us",
               "predicted_us", "measured_us", "measured_iqr", "top1", "top5", "val_top1",
               "params", "flops", "dominated", "run_dir", "ops")


@dataclass
class SweepPoint:
    label: str
    kind: str  # search | reference | random
    arch: Architecture | None = None
    value: float | None = None
    run_dir: Path | None = None
    results: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None  # the search seed of a searched point (with `seeds`)
    settings: dict[str, float | str] = field(default_factory=dict)  # its other grid axes


@dataclass(frozen=True)
class SearchPlan:
    """One search of the sweep: its label, swept value (the first axis's), search seed, config
    and the other axes' values."""
    label: str
    value: float | str
    seed: int | None
    cfg: Config
    settings: tuple[tuple[str, float | str], ...] = ()


def reference_archs(cfg: Config, config_path: str | Path | None,
                    extra: list[str]) -> list[Architecture]:
    """Uniform k3_e6 / k5_e6 networks of the space (where those ops are candidates of every
    layer), then `archs/*.yaml` beside the config that name this space, then `extra` files."""
    space = cfg.space
    out: dict[str, Architecture] = {}
    cands = space.layer_candidates()
    for op in REFERENCE_OPS:
        if all(op in c for c in cands):
            widest = [len(space.width_choices(s)) - 1 for s in space.width_stages()]
            a = arch_from_indices(space, [*(c.index(op) for c in cands), *widest],
                                  f"all_{op[3:]}")
            out.setdefault(a.hash(), a)
    files: list[Path] = []
    if config_path is not None:
        d = Path(config_path).parent / "archs"
        if d.is_dir():
            for p in sorted(d.glob("*.yaml")):
                try:
                    if (load_yaml(p) or {}).get("space") == space.name:
                        files.append(p)
                except FbnasError:
                    continue
    files += [Path(p) for p in extra]
    m = space.macro
    for p in files:
        a = Architecture.load(p)
        if (a.macro.input_size, a.macro.in_channels, a.macro.num_classes) != (
                m.input_size, m.in_channels, m.num_classes):
            raise FbnasError(f"{p}: takes {a.macro.in_channels}x{a.macro.input_size} input and "
                             f"{a.macro.num_classes} classes, the data gives {m.in_channels}x"
                             f"{m.input_size} and {m.num_classes}")
        out.setdefault(a.hash(), a)
    return list(out.values())


def dominated(points: list[SweepPoint], by: list[SweepPoint], lat_tol: float,
              acc_tol: float) -> list[bool]:
    """For each point: is some point of `by` at least as fast and at least as accurate, within
    tolerance (latency within a factor 1 + lat_tol, top-1 within acc_tol)?"""
    out = []
    for p in points:
        lp, ap = p.results.get("measured_us"), p.results.get("top1")
        hit = False
        for q in by:
            lq, aq = q.results.get("measured_us"), q.results.get("top1")
            if None in (lp, ap, lq, aq):
                continue
            if lq <= lp * (1 + lat_tol) and aq >= ap - acc_tol:
                hit = True
                break
        out.append(hit)
    return out


class Sweep:
    def __init__(self, config_path: str | Path, param: str, values: list[float],
                 out: str | Path | None = None, overrides: list[str] | None = None,
                 references: list[str] | None = None, n_random: int = 5, seed: int = 0,
                 retrain_epochs: int | None = None, log=print, seeds: list[int] | None = None,
                 threads: int | None = None, bench: str | Path | None = None,
                 grid: list[Axis] | None = None, retrain: bool = True):
        """`param`/`values`: the first axis (a loss parameter, `beta`, or any `section.key`);
        `grid`: further axes, every combination searched; `retrain`: False searches only (no
        retrains, reference or random networks, nor timing: `fbnas bench score` judges the
        searches)."""
        if param not in PARAMS and "." not in param:
            raise FbnasError(f"sweep: parameter must be one of {', '.join(PARAMS)} or a "
                             f"section.key; got {param!r}")
        grid = list(grid or [])
        keys = [param if "." in param else f"loss.{param}", *(a.key for a in grid)]
        # the retrains, reference and random networks share one data, retrain and space
        # section: an axis there would change the searches but not what judges them
        if retrain and (other := [k for k in keys if k.split(".")[0] not in ("search", "loss")]):
            raise FbnasError(f"sweep: {other[0]} is not a search or loss setting, and the "
                             "sweep's retrains share one config; sweep it with --no-retrain, "
                             "or run one sweep per value")
        if len(set(keys)) != len(keys) or (seeds is not None and "search.seed" in keys):
            raise FbnasError(f"sweep: a setting swept twice in {', '.join(keys)}"
                             + (" and --seeds" if seeds is not None else ""))
        if seeds is not None and (not seeds or len(set(seeds)) != len(seeds)
                                  or min(seeds) < 0):
            raise FbnasError(f"--seeds: give distinct seeds >= 0, got {seeds}")
        if threads is not None and threads < 1:
            raise FbnasError(f"--threads: must be >= 1, got {threads}")
        self.config_path = Path(config_path)
        self.base = apply_overrides(load_config_data(config_path)[1], overrides or [])
        if retrain_epochs is not None:
            self.base = with_retrain_epochs(self.base, retrain_epochs)
        self.cfg = config_from_dict(self.base, str(config_path))
        self.param, self.values, self.seeds, self.threads = param, values, seeds, threads
        self.grid, self.retrain = grid, retrain
        kind = (self.base.get("loss") or {}).get("kind", "fbnet")
        self.out = Path(out) if out else Path(f"{self.cfg.run.dir}-sweep")
        self.references = references or []
        self.n_random, self.seed = n_random, seed
        self.log = log
        # check every point's config now, not after hours of searching
        self.plan: list[SearchPlan] = []
        for s in seeds if seeds is not None else [None]:
            for v in values:
                for settings in itertools.product(*[[(a.key, x) for x in a.values]
                                                    for a in grid]):
                    label = "-".join([axis_label(param.rsplit(".", 1)[-1], v), *(
                        axis_label(k.rsplit(".", 1)[-1], x) for k, x in settings)]) + (
                        f"-seed{s}" if s is not None else "")
                    self.plan.append(SearchPlan(label, v, s, point_config(
                        self.base, param, v, self.out / f"search-{label}", s, settings),
                        settings))
                    # as the trainer would refuse it (a checkpoint read only for a refused
                    # mode), every point
                    mode = self.plan[-1].cfg.search.mode
                    if get_mode(mode).refused and not search_done(self.plan[-1].cfg):
                        refuse_as_theta_mode(mode)
        self.point_cfgs = [sp.cfg for sp in self.plan]
        # and every reference architecture file (loading also checks it fits the data)
        self.reference_list = reference_archs(self.cfg, self.config_path, self.references)
        self.bench = None if bench is None else bench_for(bench, self.cfg)
        if param == "alpha" and kind == "fbnet" and any(v > 0 for v in values):
            log("note: loss.alpha only scales the FBNet loss (Adam is nearly invariant to it); "
                "the trade-off is set by loss.beta (--beta)")

    # ---- the points -------------------------------------------------------------------------
    def searched(self, sp: SearchPlan, arch: Architecture) -> SweepPoint:
        return SweepPoint(sp.label, "search", arch, sp.value, seed=sp.seed,
                          settings=dict(sp.settings))

    def reference_points(self) -> list[SweepPoint]:
        if not self.retrain:
            return []
        return [SweepPoint(f"ref-{a.name}", "reference", a) for a in self.reference_list]

    def random_points(self, searched: list[SweepPoint]) -> list[SweepPoint]:
        """The random architectures: drawn once every search is done (none of them is a
        searched or a reference architecture)."""
        if not self.retrain:
            return []
        taken = {p.arch.hash() for p in searched} | {a.hash() for a in self.reference_list}
        return [SweepPoint(a.name, "random", a)
                for a in random_archs(self.cfg.space, self.n_random, self.seed, taken)]

    def retrain_job(self, p: SweepPoint) -> tuple[Config, dict[str, Any]]:
        """(config, results.json's `sweep` record) of point `p`'s retrain; sets its run_dir."""
        p.run_dir = self.out / f"retrain-{p.label}"
        extra = {"label": p.label, "kind": p.kind, "param": self.param, "value": p.value,
                 "sweep_dir": str(self.out)}
        if p.kind == "search":
            extra[self.param] = p.value
            extra.update(p.settings)
            if p.seed is not None:
                extra["seed"] = p.seed
        return retrain_config(self.base, self.config_path, p.run_dir), extra

    # ---- the whole sweep, one point after another in this process ---------------------------
    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        ensure_dir(self.out)
        saved = torch.get_num_threads()
        if self.threads is not None:  # as each Ray task does (fbnas.sweep.ray_tasks)
            torch.set_num_threads(self.threads)
        try:
            points: list[SweepPoint] = []
            for sp in self.plan:
                self.log(f"== sweep {sp.label}: search")
                if search_done(sp.cfg):
                    self.log(f"{sp.cfg.run.dir}: search finished earlier")
                points.append(self.searched(sp, search_point(sp.cfg)))
            points += self.reference_points()
            points += self.random_points(points)
            for p in points if self.retrain else []:
                if self.from_bench(p):
                    continue
                self.log(f"== sweep {p.label}: retrain {p.arch.short_hash}")
                cfg, extra = self.retrain_job(p)
                if RunFiles(p.run_dir).results.is_file():
                    self.log(f"{p.run_dir}: retrained earlier")
                p.results = dict(retrain_point(cfg, p.arch, extra))
        finally:
            if self.threads is not None:
                torch.set_num_threads(saved)
        return self.finish(points, t0)

    def from_bench(self, p: SweepPoint) -> bool:
        """With a benchmark: point `p`'s results are its records (written as a retrain's
        results.json); False without one."""
        if self.bench is None:
            return False
        _, extra = self.retrain_job(p)
        b, k = self.bench, self.bench.key(p.arch, f"sweep point {p.label}")
        n = b.networks[k]
        res = {"top1": b.mean(k, "test_acc"), "val_top1": b.mean(k, "val_acc"),
               "params": n["params"], "flops": n["flops"], "bench": str(b.path), "sweep": extra}
        if b.meta["latency"]["unit"] == "us":
            res["predicted_us"] = n["predicted"]
            if n.get("measured") is not None:
                res["measured_us"] = n["measured"]
                res["measured_iqr"] = n.get("measured_iqr")
        p.results = res
        ensure_dir(p.run_dir)
        write_json_atomic(RunFiles(p.run_dir).results, res)
        self.log(f"== sweep {p.label}: {p.arch.short_hash} from the benchmark: top-1 "
                 f"{100 * res['top1']:.2f}%")
        return True

    def finish(self, points: list[SweepPoint], t0: float) -> dict[str, Any]:
        """Every point retrained: time them all end to end here, write the report."""
        if self.bench is None and self.retrain:
            self._measure(points)
        return self._report(points, time.perf_counter() - t0)

    def _measure(self, points: list[SweepPoint]) -> None:
        """All children in one interleaved measurement (comparable with each other); each
        run's results.json gets the figure."""
        lat = self.cfg.latency
        if not is_measured(lat.cost) or not self.cfg.retrain.measure_latency:
            return
        uniq: dict[str, Architecture] = {}
        for p in points:
            uniq.setdefault(p.arch.hash(), p.arch)
        table, _ = find_latency_table(self.cfg.space, lat, next(iter(uniq.values())), None)
        timer = timer_for_table(lat, table)  # the table's allocator: comparable with its values
        pan = panel(self.cfg.space, table)
        self.log(f"== sweep: timing {len(uniq)} children end to end ({timer.backend}, "
                 f"{pan.label})")
        # the table's units, as the measured fit and retrain report them
        stats = time_archs(timer, {h[:16]: a for h, a in uniq.items()}, table, pan,
                           Protocol().rounds)
        device = timer_label(timer.describe())
        for p in points:
            s = stats[p.arch.hash()[:16]]
            p.results["measured_us"] = s["median_us"]
            p.results["measured_iqr"] = s["rel_iqr"]
            p.results["latency_device"] = device
            write_json_atomic(RunFiles(p.run_dir).results, p.results)

    def _report(self, points: list[SweepPoint], wall: float) -> dict[str, Any]:
        for p in points:
            r = p.results
            r.setdefault("measured_us", None)
            r.setdefault("predicted_us", None)
            meta = p.arch.meta if isinstance(p.arch.meta, dict) else {}
            if r["predicted_us"] is None and meta.get("cost_unit") == "us" and isinstance(
                    meta.get("predicted"), int | float):  # searched, not retrained: its fit's
                r["predicted_us"] = meta["predicted"]
        searched = [p for p in points if p.kind == "search"]
        rand = [p for p in points if p.kind == "random"]
        iqrs = [p.results.get("measured_iqr") or 0.0 for p in points]
        lat_tol = (max(LATENCY_TOLERANCE, sorted(iqrs)[len(iqrs) // 2]) if iqrs
                   else LATENCY_TOLERANCE)
        n_test = self._n_test()
        accs = [p.results["top1"] for p in points if p.results.get("top1") is not None]
        mean_acc = sum(accs) / max(len(accs), 1)
        acc_tol = math.sqrt(max(mean_acc * (1 - mean_acc), 1e-4) / max(n_test, 1))
        dom = dominated(rand, searched, lat_tol, acc_tol)
        flags = {id(p): d for p, d in zip(rand, dom, strict=True)}
        per_seed = {s: sum(dominated(rand, [p for p in searched if p.seed == s], lat_tol,
                                     acc_tol)) for s in self.seeds or []}
        rows = []
        for p in points:
            r = p.results
            rows.append({
                "label": p.label, "kind": p.kind, "param": self.param if p.kind == "search"
                else "", "value": "" if p.value is None else p.value,
                "arch_hash": p.arch.hash(), "name": p.arch.name,
                "target_us": target_us_of(p.arch.meta) if p.kind == "search" else None,
                "predicted_us": r.get("predicted_us"), "measured_us": r.get("measured_us"),
                "measured_iqr": r.get("measured_iqr"), "top1": r.get("top1"),
                "top5": r.get("top5"), "val_top1": r.get("val_top1"), "params": r.get("params"),
                "flops": r.get("flops"),
                "dominated": flags.get(id(p), "") if p.kind == "random" else "",
                "run_dir": "" if p.run_dir is None else str(p.run_dir),
                "ops": " ".join(p.arch.ops)})
            if self.seeds is not None:
                rows[-1]["seed"] = "" if p.seed is None else p.seed
            for a in self.grid:
                rows[-1][a.key] = p.settings.get(a.key, "")
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS + (("seed",) if self.seeds else ())
                           + tuple(a.key for a in self.grid), lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if v is None else v) for k, v in row.items()})
        write_text_atomic(self.out / "sweep.csv", buf.getvalue())
        summary = {"config": str(self.config_path), "param": self.param, "values": self.values,
                   **({"grid": {a.key: list(a.values) for a in self.grid}} if self.grid else {}),
                   "wall_seconds": wall, "random": len(rand),
                   "random_dominated": sum(dom), "latency_tolerance": lat_tol,
                   "accuracy_tolerance": acc_tol, "test_images": n_test, "points": rows}
        if self.seeds is not None:
            summary["seeds"] = self.seeds
            summary["random_dominated_per_seed"] = {str(s): n for s, n in per_seed.items()}
        write_json_atomic(self.out / "sweep.json", summary)
        try:
            if not self.retrain:  # searches only: nothing measured or retrained to draw
                return summary
            summary["plot"] = str(plot_sweep(rows, self.out / "sweep.png", self.cfg.space.name,
                                             self.param))
        except FbnasError as e:  # matplotlib missing: the CSV is still there
            self.log(f"no plot: {e}")
        return summary

    def _n_test(self) -> int:
        m = self.cfg.space.macro
        loader = build_eval_data(self.cfg.data, m.input_size, m.in_channels, m.num_classes,
                                 seed=self.cfg.search.seed, split="test")
        return len(loader.dataset)


def plot_sweep(rows: list[dict[str, Any]], path: Path, space: str, param: str) -> Path:
    """Latency (measured, else predicted) vs. test top-1: searched points joined in order of
    the swept value, references as squares, random architectures as grey crosses."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5))

    def xy(rs):
        pts = [((r["measured_us"] if r["measured_us"] is not None else r["predicted_us"]),
                100 * r["top1"]) for r in rs if r["top1"] is not None]
        return [p for p in pts if p[0] is not None and p[1] is not None]

    rnd = xy([r for r in rows if r["kind"] == "random"])
    if rnd:
        ax.scatter(*zip(*rnd, strict=True), marker="x", color="0.55", label="random")
    refs = [r for r in rows if r["kind"] == "reference"]
    for r, (x, y) in zip(refs, xy(refs), strict=False):
        ax.scatter([x], [y], marker="s", s=50, label=r["name"])
    se = [r for r in rows if r["kind"] == "search"]
    pts = xy(se)
    if pts:
        ax.plot(*zip(*pts, strict=True), "o-", color="C3", label=f"searched ({param})")
        for r, (x, y) in zip(se, pts, strict=False):
            ax.annotate(f"{param}={fmt_value(r['value'])}", (x, y), textcoords="offset points",
                        xytext=(5, 5), fontsize=8)
    measured = any(r["measured_us"] is not None for r in rows)
    ax.set_xlabel("latency, us (" + ("measured end to end" if measured else "table") + ")")
    ax.set_ylabel("test top-1, %")
    ax.set_title(f"fbnas sweep: {space}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=120), mode="wb")
    finally:
        plt.close(fig)
    return path
