"""How well does a table predict real end-to-end latency? And a corrected cost model on top.

`validate` samples architectures that span the space's latency range, times each child
network end to end with the same drift-compensated protocol as the table (twice, in two
independent passes, to measure how repeatable the ground truth itself is), and reports:

- rank agreement (Spearman, Kendall) of the table's predictions with the measurements, and of
  a FLOPs proxy on the same architectures;
- absolute agreement: median predicted/measured ratio, mean absolute percentage error (MAPE),
  share within ±10%;
- an affine calibration measured ≈ a·predicted + b (weighted toward relative error), with its
  error on held-out architectures (k-fold cross-validation);
- optionally (`corrections=True`) the TuNAS-style corrected cost model: per-(layer, op) corrections
  δ on top of the calibrated table, ridge-regularised toward 0 (i.e. toward the table's
  values), its ridge strength chosen by leave-one-out within each training fold, and its
  held-out error compared with the calibrated table's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fbnas.arch import Architecture
from fbnas.backends import Timer
from fbnas.backends.worker import under_allocator
from fbnas.errors import FbnasError
from fbnas.io import atomic_write
from fbnas.latency.build import MeasureProgress, measure_archs, prepare_reference, sample_spanning
from fbnas.latency.counted import build_cost_table
from fbnas.latency.kinds import is_measured
from fbnas.latency.measure import Protocol
from fbnas.latency.table import LatencyTable, space_hash
from fbnas.search_space import SearchSpace

LAMBDAS = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)


# ---- metrics ---------------------------------------------------------------------------------
def rank_metrics(pred: Sequence[float], meas: Sequence[float]) -> dict[str, float]:
    p, m = np.asarray(pred, float), np.asarray(meas, float)
    if len(p) < 3:
        return {"spearman": float("nan"), "kendall": float("nan"), "pearson": float("nan")}
    # scipy here, not at the top: every `import fbnas.config` reads this module
    from scipy import stats as sps

    return {"spearman": float(sps.spearmanr(p, m).statistic),
            "kendall": float(sps.kendalltau(p, m).statistic),
            "pearson": float(np.corrcoef(p, m)[0, 1])}


def error_metrics(pred: Sequence[float], meas: Sequence[float]) -> dict[str, float]:
    p, m = np.asarray(pred, float), np.asarray(meas, float)
    rel = p / m - 1.0
    return {"median_ratio": float(np.median(p / m)), "mape": float(np.mean(np.abs(rel))),
            "within_10pct": float(np.mean(np.abs(rel) <= 0.10))}


def metrics(pred, meas) -> dict[str, float]:
    return {**rank_metrics(pred, meas), **error_metrics(pred, meas)}


# ---- calibration and the corrected model -----------------------------------------------------
def fit_affine(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float]:
    """(a, b) minimising Σ ((a·pred + b - meas) / meas)²: least squares in relative error."""
    w = 1.0 / np.asarray(meas, float)
    A = np.stack([pred * w, w], 1)
    (a, b), *_ = np.linalg.lstsq(A, meas * w, rcond=None)
    return float(a), float(b)


def one_hot(space: SearchSpace, archs: Sequence[Architecture]) -> np.ndarray:
    """Design matrix: one column per (layer, candidate op), 1 where the architecture picks it."""
    cands = space.layer_candidates()
    offs = np.cumsum([0] + [len(c) for c in cands])
    X = np.zeros((len(archs), int(offs[-1])))
    for i, a in enumerate(archs):
        for li, op in enumerate(a.ops):
            X[i, offs[li] + cands[li].index(op)] = 1.0
    return X


def _ridge(X: np.ndarray, r: np.ndarray, w: np.ndarray, lam: float) -> np.ndarray:
    """δ = argmin Σ w_i (r_i - X_i δ)² + λ |δ|²."""
    Xw = X * w[:, None]
    return np.linalg.solve(X.T @ Xw + lam * np.eye(X.shape[1]), Xw.T @ r)


def _loo_error(X: np.ndarray, r: np.ndarray, w: np.ndarray, lam: float) -> float:
    """Weighted leave-one-out squared error of the ridge fit (closed form via the hat matrix)."""
    Xw = X * w[:, None]
    inv = np.linalg.inv(X.T @ Xw + lam * np.eye(X.shape[1]))
    H = X @ inv @ Xw.T
    e = (r - H @ r) / np.clip(1.0 - np.diag(H), 1e-6, None)
    return float(np.sum(w * e * e))


def fit_corrections(X: np.ndarray, pred: np.ndarray, meas: np.ndarray,
                    lambdas: Sequence[float] = LAMBDAS) -> dict[str, Any]:
    """Affine calibration, then per-(layer, op) ridge corrections on the relative residuals.

    Returns {"a", "b", "delta" (per column), "lambda"}; predictions are a·pred + b + X·δ.
    """
    a, b = fit_affine(pred, meas)
    r = meas - (a * pred + b)
    w = 1.0 / meas ** 2  # relative error
    w = w / w.mean()
    lam = min(lambdas, key=lambda lam: _loo_error(X, r, w, lam))
    return {"a": a, "b": b, "delta": _ridge(X, r, w, lam), "lambda": float(lam)}


def _folds(n: int, k: int, seed: int) -> list[np.ndarray]:
    idx = np.random.default_rng(seed).permutation(n)
    return [idx[i::k] for i in range(k)]


def cross_validate(X: np.ndarray, pred: np.ndarray, meas: np.ndarray, k: int = 5,
                   seed: int = 0, corrected: bool = True) -> dict[str, Any]:
    """Held-out predictions (k-fold) of the affine calibration and of the corrected model."""
    cal = np.zeros_like(meas)
    fit = np.zeros_like(meas)
    lams = []
    for test in _folds(len(meas), k, seed):
        train = np.setdiff1d(np.arange(len(meas)), test)
        a, b = fit_affine(pred[train], meas[train])
        cal[test] = a * pred[test] + b
        if corrected:
            c = fit_corrections(X[train], pred[train], meas[train])
            fit[test] = c["a"] * pred[test] + c["b"] + X[test] @ c["delta"]
            lams.append(c["lambda"])
    out: dict[str, Any] = {"folds": k, "calibrated": metrics(cal, meas),
                           "calibrated_predictions": cal.tolist()}
    if corrected:
        out["corrected"] = metrics(fit, meas)
        out["corrected_predictions"] = fit.tolist()
        out["corrected_lambdas"] = lams
    return out


# ---- validation ------------------------------------------------------------------------------
def validate(space: SearchSpace, table: LatencyTable, timer: Timer, n: int = 50,
             seed: int = 0, protocol: Protocol | None = None, repeats: int = 2,
             corrections: bool = False, folds: int = 5, archs: Sequence[Architecture] | None = None,
             progress=None, log=None, others: Sequence[LatencyTable] = ()) -> dict[str, Any]:
    """Measure `n` spanning architectures end to end and compare them with `table`.

    Returns the report (a JSON-ready dict). Does not modify `table`; `apply_report` stores
    the calibration (and the corrections) in it. `progress`: a callback (done, total,
    key) per pass, or True for `MeasureProgress` on stderr (a bar on a terminal, else a plain
    line every 30 s; made where the measuring runs, an allocator's worker included).

    `others`: tables of the same space measured another way (the fp32 table beside an int8
    one, another device's): each ranks the same measured networks too (`report["others"]`:
    its rank agreement with the measurements and with `table`, and per candidate op the
    median over layers of its entry / `table`'s: the int8 speed-up per op when `table` is
    int8 and the other fp32).
    """
    # what can be refused is refused here, before an allocator's worker process starts
    if not is_measured(table.cost):
        raise FbnasError(f"{table.path or 'table'}: validate needs a latency table, this one "
                         f"holds {table.cost}")
    table.check_run(batch=timer.batch, dtype=timer.dtype, backend=timer.backend,
                    memory_format="channels_last" if timer.channels_last else "contiguous",
                    allocator=timer.allocator, quantization=timer.quantization)
    for o in others:
        o.require(space)
    if archs is None:
        if n < 5:
            raise FbnasError(f"validate: -n must be at least 5 (got {n})")
        archs = sample_spanning(space, n, table.costs_for(space, "raw")[0], seed=seed)
    return _timed_report(space, table, timer, list(archs), seed, protocol, repeats,
                         corrections, folds, progress, log, others)


@under_allocator
def _timed_report(space: SearchSpace, table: LatencyTable, timer: Timer,
                  archs: list[Architecture], seed: int, protocol: Protocol | None, repeats: int,
                  corrections: bool, folds: int, progress, log,
                  others: Sequence[LatencyTable]) -> dict[str, Any]:
    """`validate`'s timing and report, where the timer's allocator holds."""
    log = log or (lambda s: None)
    rows, _ = table.costs_for(space, "raw")
    pred = np.array([table.predict(a, "raw") for a in archs])
    flops_table = build_cost_table(space, "flops")
    flops = np.array([flops_table.predict(a, "raw") for a in archs])
    p = protocol or Protocol()
    reference = prepare_reference(timer) if p.reference else None
    # Drift compensation for the ground truth too: a network's time is measured as a ratio to
    # the reference op and converted with the reference's time recorded in the table, so a
    # machine that is faster or slower now than when the table was built moves neither side.
    table_ref = (table.reference or {}).get("scale_us") if p.reference else None
    passes, now, ref_now = [], [], []
    bar = None
    if progress is True:
        bar = MeasureProgress(len(archs) * max(1, repeats), p.rounds, f"validate {space.name}")
        progress = bar.passes(len(archs))
    elif progress is False:  # `fbnas latency validate --quiet`
        progress = None
    desched0 = getattr(timer, "wall_s", 0.0), getattr(timer, "cpu_s", 0.0)
    for r in range(max(1, repeats)):
        pr = Protocol(**{**p.__dict__, "seed": p.seed + 1000 * (r + 1)})
        m = measure_archs(timer, archs, pr, reference, progress)
        own = m.ref_scale_s * 1e6 if pr.reference else 1e6
        ref_now.append(own)
        passes.append(np.array([m.ratio(a.name) * (table_ref or own) for a in archs]))
        now.append(np.array([m.ratio(a.name) * own for a in archs]))
        log(f"pass {r + 1}: {len(archs)} networks timed in {m.seconds:.0f} s")
    if bar is not None:
        bar.close()
    meas = np.exp(np.mean(np.log(np.stack(passes)), 0))  # geometric mean over passes
    meas_now = np.exp(np.mean(np.log(np.stack(now)), 0))
    report: dict[str, Any] = {
        "space": space.name, "table": table.path, "table_fingerprint": table.fingerprint(),
        "device": {k: table.meta.get(k) for k in ("backend", "device_name", "threads", "batch",
                                                  "dtype", "memory_format")},
        "n": len(archs), "repeats": len(passes),
        "measured_range_us": [float(meas.min()), float(meas.max())],
        "ground_truth": ("network/reference time ratio x the table's reference time "
                         f"({table_ref:.2f} us)" if table_ref else "seconds per forward"),
        "reference_now_us": ref_now,
        # the same measurements at this run's own reference speed (machine drift included)
        "table_vs_now": error_metrics(pred, meas_now),
    }
    if hasattr(timer, "descheduled_share"):
        wall = timer.wall_s - desched0[0]
        cpu = timer.cpu_s - desched0[1]
        report["descheduled_share"] = max(0.0, 1 - cpu / wall) if wall > 0 else 0.0
    if len(passes) >= 2:
        rep = rank_metrics(passes[0], passes[1])
        r = max(rep["spearman"], 0.0)
        rel = np.abs(passes[1] / passes[0] - 1.0)
        report["repeat"] = {**rep, "median_abs_change": float(np.median(rel)),
                            "p90_abs_change": float(np.percentile(rel, 90)),
                            "cap_sqrt_r": math.sqrt(r),
                            "target_spearman": min(0.9, 0.95 * math.sqrt(r))}
    report["table"] = metrics(pred, meas)
    report["flops_proxy"] = rank_metrics(flops, meas)
    if others:
        report["others"] = [other_table(o, space, archs, rows, pred, meas) for o in others]
    X = one_hot(space, archs)
    cv = cross_validate(X, pred, meas, k=min(folds, len(archs)), seed=seed, corrected=corrections)
    a, b = fit_affine(pred, meas)
    report["calibration"] = {"a": a, "b": b, "n": len(archs), "in_sample": metrics(
        a * pred + b, meas), "held_out": cv["calibrated"]}
    if corrections:
        c = fit_corrections(X, pred, meas)
        f_mape, c_mape = cv["corrected"]["mape"], cv["calibrated"]["mape"]
        verdict = ("beats" if f_mape < 0.98 * c_mape else
                   "does not beat" if f_mape > 1.02 * c_mape else "ties with")
        report["corrected_model"] = {
            "lambda": c["lambda"], "held_out": cv["corrected"], "verdict": verdict,
            "beats_calibrated_table": verdict == "beats", "_fit": c}
    report["archs"] = [
        {"name": a.name, "hash": a.short_hash, "predicted_us": float(pred[i]),
         "measured_us": float(meas[i]), "passes_us": [float(q[i]) for q in passes],
         "flops": float(flops[i]), "calibrated_cv_us": cv["calibrated_predictions"][i],
         **({"corrected_cv_us": cv["corrected_predictions"][i]} if corrections else {})}
        for i, a in enumerate(archs)]
    return report


def other_table(other: LatencyTable, space: SearchSpace, archs: Sequence[Architecture],
                rows: Sequence[dict[str, float]], pred: np.ndarray, meas: np.ndarray
                ) -> dict[str, Any]:
    """How `other` ranks the networks a validation measured (against the measurements and
    against the validated table's predictions `pred`), and its entries per op against the
    validated table's (`rows`, raw): the median over layers of other / this."""
    pred_o = np.array([other.predict(a, "raw") for a in archs])
    rows_o, _ = other.costs_for(space, "raw")
    ratios: dict[str, list[float]] = {}
    for mine, theirs in zip(rows, rows_o, strict=True):
        for op, v in mine.items():
            if v > 0 and theirs.get(op, 0) > 0:
                ratios.setdefault(op, []).append(theirs[op] / v)
    return {"table": other.path, "fingerprint": other.fingerprint(),
            "quantization": other.setting("quantization"), "backend": other.meta.get("backend"),
            "vs_measured": rank_metrics(pred_o, meas), "vs_table": rank_metrics(pred_o, pred),
            "per_op_ratio": {op: {"median": float(np.median(r)), "min": float(min(r)),
                                  "max": float(max(r)), "layers": len(r)}
                             for op, r in ratios.items()}}


def apply_report(table: LatencyTable, space: SearchSpace, report: dict[str, Any]) -> None:
    """Store the report's calibration (and corrections, if any) in `table`."""
    cal = report["calibration"]
    table.calibration = {"a": cal["a"], "b": cal["b"], "n": cal["n"], "space": space.name,
                         "held_out_mape": cal["held_out"]["mape"],
                         "held_out_within_10pct": cal["held_out"]["within_10pct"]}
    fm = report.get("corrected_model")
    if fm is not None:
        c = fm["_fit"]
        cands = space.layer_candidates()
        offs = np.cumsum([0] + [len(x) for x in cands])
        rows = [{op: round(float(c["delta"][offs[li] + j]), 4) for j, op in enumerate(ops)}
                for li, ops in enumerate(cands)]
        table.corrections = {"space": space.name, "space_hash": space_hash(space),
                             "a": c["a"], "b": c["b"], "lambda": c["lambda"], "rows": rows,
                             "n": cal["n"], "held_out_mape": fm["held_out"]["mape"],
                             "beats_calibrated_table": fm["beats_calibrated_table"]}


def public_report(report: dict[str, Any]) -> dict[str, Any]:
    """The report without private fitting arrays (what is written as JSON)."""
    out = dict(report)
    if "corrected_model" in out:
        out["corrected_model"] = {k: v for k, v in out["corrected_model"].items() if k != "_fit"}
    return out


def summary_lines(report: dict[str, Any]) -> list[str]:
    t, f = report["table"], report["flops_proxy"]
    lo, hi = report["measured_range_us"]
    lines = [f"{report['n']} architectures of '{report['space']}', measured "
             f"{lo:.1f}-{hi:.1f} us end to end ({report['repeats']} passes)"]
    if report.get("descheduled_share", 0) > 0.1:
        lines.append(f"warning: the timing thread was descheduled "
                     f"{100 * report['descheduled_share']:.0f}% of the time — the machine was "
                     "busy; figures are disturbed, re-run on a quiet machine")
    if "repeat" in report:
        r = report["repeat"]
        lines.append(f"repeat agreement: Spearman r={r['spearman']:.3f} (cap sqrt(r)="
                     f"{r['cap_sqrt_r']:.3f}), median change {100 * r['median_abs_change']:.1f}%")
    lines.append(f"table:  Spearman {t['spearman']:.3f}  Kendall {t['kendall']:.3f}  "
                 f"median pred/meas {t['median_ratio']:.3f}  MAPE {100 * t['mape']:.1f}%  "
                 f"within 10% {100 * t['within_10pct']:.0f}%")
    lines.append(f"FLOPs proxy: Spearman {f['spearman']:.3f}  Kendall {f['kendall']:.3f}")
    for o in report.get("others", []):
        m, v = o["vs_measured"], o["vs_table"]
        lines.append(f"other table {o['table']} ({o['backend']}, {o['quantization']}): Spearman "
                     f"{m['spearman']:.3f}  Kendall {m['kendall']:.3f} against the "
                     f"measurements; Kendall {v['kendall']:.3f} against this table")
        lines.append("  its entries / this table's, median over layers: " + ", ".join(
            f"{op} {r['median']:.2f}x" for op, r in o["per_op_ratio"].items()))
    c = report["calibration"]
    h = c["held_out"]
    lines.append(f"calibration measured = {c['a']:.3f} x predicted + {c['b']:.0f} us; held out: "
                 f"MAPE {100 * h['mape']:.1f}%  within 10% {100 * h['within_10pct']:.0f}%")
    if "corrected_model" in report:
        fm = report["corrected_model"]
        h2 = fm["held_out"]
        verdict = fm["verdict"]
        lines.append(f"corrected model (lambda {fm['lambda']:g}): held out MAPE "
                     f"{100 * h2['mape']:.2f}%  within 10% {100 * h2['within_10pct']:.0f}%  "
                     f"Spearman {h2['spearman']:.3f} — {verdict} the calibrated table "
                     f"(held out MAPE {100 * h['mape']:.2f}%)")
    return lines


def plot_report(report: dict[str, Any], path: str) -> None:
    """Predicted-vs-measured scatter (raw and held-out calibrated), as PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FbnasError("--plot needs matplotlib: pip install 'fbnas[plot]'") from None

    meas = np.array([a["measured_us"] for a in report["archs"]])
    pred = np.array([a["predicted_us"] for a in report["archs"]])
    cal = np.array([a["calibrated_cv_us"] for a in report["archs"]])
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(meas, pred, s=14, label=f"table (Spearman {report['table']['spearman']:.3f})")
    ax.scatter(meas, cal, s=14, marker="x", label="calibrated, held out")
    lim = [0, max(meas.max(), pred.max()) * 1.05]
    ax.plot(lim, lim, "k--", lw=0.8)
    ax.set(xlim=lim, ylim=lim, xlabel="measured end to end (us)", ylabel="predicted (us)",
           title=f"{report['space']} on {report['device']['device_name']}")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=120), mode="wb")
    plt.close(fig)
