"""Building latency tables: timed, drift-compensated, resumable (FLOPs / params: `counted`).

`build_table(space, timer, table=None)` measures only the signatures `table` lacks, in chunks;
after each chunk the table can be written (`out=`), so an interrupted build resumes where it
stopped. Latency values are

    value = reference µs x scale x ratio^exponent    (ratio: entry / reference op, median)

where the *context model* (scale, exponent) comes from whole child networks ("probes") timed
end to end among themselves once a fresh build's entries are done, as validation, the measured
fit and a user time networks: a block timed alone runs at another speed than the same block
inside a network (its weights stay in cache), and not by one factor (big blocks gain less), so
(scale, exponent) are fitted to the probes' network times in least squares of the log and
folded into the table, whose absolute predictions then hold without a calibration step while
it stays a sum of entries. (Probes timed interleaved with the entries, as before 2026-11-25,
read 1-7% slower on the ImageNet space than the same networks timed among networks.)
Extending a table keeps its reference and context, so old and new entries share one scale.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from fbnas.arch import Architecture, arch_from_indices, build_child
from fbnas.backends import Runnable, Timer
from fbnas.backends.worker import under_allocator
from fbnas.errors import FbnasError
from fbnas.io import clock
from fbnas.latency.counted import counted_rows
from fbnas.latency.kinds import is_measured
from fbnas.latency.measure import (
    REFERENCE,
    EntryStats,
    Measurement,
    Protocol,
    measure,
    reference_scale,
)
from fbnas.latency.signature import Signature, arch_signatures, space_signatures
from fbnas.latency.table import META_ABSENT, LatencyTable, space_hash
from fbnas.search_space import SearchSpace
from fbnas.settings import CONTEXT_PROBES

OVERHEAD = "call overhead"  # the empty program an exported runtime's entries are corrected by
# the context model's exponent stays within these (12 probes identify it; the bounds keep a
# degenerate probe set, all networks of one size, from bending the table)
EXPONENT_BOUNDS = (0.7, 1.3)


# ---- progress --------------------------------------------------------------------------------
PLAIN_EVERY_S = 30.0  # a plain progress line at most this often, where stderr is no terminal


class MeasureProgress:
    """Progress over timed samples (ETA for the whole job), showing the entry being timed and
    the time per entry so far: a tqdm bar where `stream` (stderr) is a terminal; elsewhere (a
    file, a pipe, a scheduler's log) a plain line at most every `every` seconds and one at the
    end, with no carriage-return redraws."""

    def __init__(self, total_items: int, rounds: int, what: str, stream=None,
                 every: float | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.rounds, self.what = rounds, what
        self.every = PLAIN_EVERY_S if every is None else every
        self.total, self.n, self.key = total_items * rounds, 0, ""
        self.t0 = self.shown_at = time.perf_counter()
        try:
            tty = bool(self.stream.isatty())
        except (AttributeError, ValueError, OSError):
            tty = False
        self.bar = (tqdm(total=self.total, desc=what, unit="sample", file=self.stream,
                         dynamic_ncols=True, smoothing=0.1) if tty else None)

    def chunk(self, n_items: int):
        """The `progress` callback of one measurement of `n_items` entries."""
        last, seen = [0], [n_items * self.rounds]

        def cb(done: int, total: int, key: str) -> None:
            if total > seen[0]:  # extra rounds for noisy entries
                self._grow(total - seen[0])
                seen[0] = total
            self._advance(done - last[0], key)
            last[0] = done

        return cb

    def passes(self, n_items: int):
        """One callback for successive measurements of `n_items` entries each (validate's
        repeats): a new one starts where the count of samples done goes back."""
        state: dict[str, Any] = {"cb": None, "last": 0}

        def cb(done: int, total: int, key: str) -> None:
            if state["cb"] is None or done < state["last"]:
                state["cb"] = self.chunk(n_items)
            state["last"] = done
            state["cb"](done, total, key)

        return cb

    def _grow(self, n: int) -> None:
        self.total += n
        if self.bar is not None:
            self.bar.total += n

    def _advance(self, n: int, key: str) -> None:
        self.n += n
        self.key = key
        now = time.perf_counter()
        per = (now - self.t0) / max(self.n / self.rounds, 1e-9)
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix_str(f"{per:.2f} s/item, {key[:36]}", refresh=False)
        elif now - self.shown_at >= self.every:
            self.shown_at = now
            left = (self.total - self.n) / self.rounds * per
            self._line(f", ETA {clock(left)}, {per:.2f} s/item, {key[:36]}")

    def _line(self, tail: str) -> None:
        pct = 100 * self.n / self.total if self.total else 100.0
        self.stream.write(f"{self.what}: {self.n}/{self.total} samples ({pct:.0f}%) in "
                          f"{clock(time.perf_counter() - self.t0)}{tail}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.n:
            self._line("")


# ---- the reference op, shared by everything measured in one process --------------------------
def prepare_reference(timer: Timer) -> Runnable:
    torch.manual_seed(0)
    return timer.prepare(REFERENCE.build(), REFERENCE.input_shape, "reference")


def entry_stats(sig: Signature, st: EntryStats, scale_s: float,
                call: float | None = None) -> dict[str, Any]:
    """An entry's statistics (µs at `scale_s` seconds per reference ratio) and its `ratio`,
    the value before scale and context. `call`, an exported runtime's per-call overhead in
    reference ratios, comes off every entry but the stem, which keeps the network's one call
    (a network pays it once, separately timed entries once each)."""
    stats = st.summary(scale_s)
    stats["ratio"] = st.quantiles()[1]
    if call is not None and sig.kind != "stem":
        stats["ratio"] = max(stats["ratio"] - call, 0.0)
        stats["call_overhead_ratio"] = call
    return stats


def context_model(table: LatencyTable) -> tuple[float, float]:
    """(scale, exponent) of the table's context model: an entry's value is reference µs ×
    scale × ratio^exponent (no context: (1, 1); tables before the exponent: exponent 1)."""
    ctx = table.context or {}
    return float(ctx.get("scale", 1.0)), float(ctx.get("exponent", 1.0))


def context_text(table: LatencyTable) -> str:
    """The context model in a few words, for the CLI's summary lines."""
    if not table.context:
        return "no context model"
    scale, exponent = context_model(table)
    return (f"context x{scale:.3f}" + (f" * ratio^{exponent:.3f}" if exponent != 1.0 else "")
            + f" (from {table.context.get('probes')} probe networks)")


def refresh_values(table: LatencyTable) -> None:
    """Recompute every latency entry's value from its ratio, the reference and the context."""
    ref = float((table.reference or {}).get("scale_us", 1.0))
    scale, exponent = context_model(table)
    for e in table.entries.values():
        if e.stats and "ratio" in e.stats:
            e.value = ref * scale * e.stats["ratio"] ** exponent


def check_extend(table: LatencyTable, timer: Timer, where: str) -> None:
    if not is_measured(table.cost):
        raise FbnasError(f"{where}: is a {table.cost} table, not a latency table")
    want = timer.describe()
    for key in ("backend", "threads", "batch", "dtype", "memory_format", "quantization",
                "device_name", "clock", "allocator"):
        have = table.setting(key)
        if have != want.get(key, META_ABSENT.get(key)):
            raise FbnasError(f"{where}: meta.{key} is {have!r} but this build "
                             f"measures with {want.get(key)!r}; extend a table only with the "
                             "setting it was made with (or write a new --table)")


# ---- sampling architectures that span the cost range -----------------------------------------
def sample_spanning(space: SearchSpace, n: int, rows: Sequence[dict[str, float]],
                    seed: int = 0, name: str = "val") -> list[Architecture]:
    """`n` distinct architectures whose predicted cost spans the space's range.

    Uniform random architectures all cost about the same (±12%), so each draw is biased:
    the first two are the cheapest and the dearest architecture (the ends of the range);
    then even draws pick, per layer, the op at a target cost quantile q (stratified over
    [0, 1]) plus noise; odd draws restrict themselves to a random subset of ops (1 op up to
    all). In a width-searched space each stage's width is drawn alike (narrowest and widest
    for the two ends, at the quantile q on even draws, uniformly on odd ones; `rows` are the
    widest networks' costs).
    """
    rng = np.random.default_rng(seed)
    cands = space.layer_candidates()
    order = [sorted(range(len(c)), key=lambda i, c=c, r=r: r[c[i]]) for c, r in zip(
        cands, rows, strict=True)]
    n_widths = [len(space.width_choices(s)) for s in space.width_stages()]
    out: dict[str, Architecture] = {}
    for end, pick in enumerate(((lambda o: o[0]), (lambda o: o[-1]))[:n]):
        widths = [end * (k - 1) for k in n_widths]
        arch = arch_from_indices(space, [*(pick(o) for o in order), *widths],
                                 f"{name}{len(out):03d}")
        out.setdefault(arch.hash(), arch)
    qs = (np.arange(n * 4) + rng.random(n * 4)) / (n * 4)
    rng.shuffle(qs)
    tries = 0
    while len(out) < n and tries < n * 50:
        q = float(qs[tries % len(qs)])
        idx = []
        if tries % 2 == 0:
            for o in order:
                k = len(o)
                j = int(np.clip(round(q * (k - 1) + rng.normal(0, 0.25 * k)), 0, k - 1))
                idx.append(o[j])
            idx += [int(np.clip(round(q * (k - 1) + rng.normal(0, 0.25 * k)), 0, k - 1))
                    for k in n_widths]
        else:
            all_ops = sorted({op for c in cands for op in c})
            size = int(rng.integers(1, len(all_ops) + 1))
            subset = set(rng.choice(all_ops, size=size, replace=False).tolist())
            for c in cands:
                allowed = [i for i, op in enumerate(c) if op in subset] or list(range(len(c)))
                idx.append(int(rng.choice(allowed)))
            idx += [int(rng.integers(k)) for k in n_widths]
        tries += 1
        arch = arch_from_indices(space, idx, f"{name}{len(out):03d}")
        out.setdefault(arch.hash(), arch)
    return list(out.values())


def prepare_archs(timer: Timer, archs: Sequence[Architecture]) -> dict[str, Runnable]:
    """Child networks ready to time end to end, keyed by architecture name."""
    runs: dict[str, Runnable] = {}
    for a in archs:
        torch.manual_seed(0)
        net = build_child(a)
        runs[a.name] = timer.prepare(net, (a.macro.in_channels, *a.macro.input_size), a.name)
    return runs


@under_allocator
def measure_archs(timer: Timer, archs: Sequence[Architecture], protocol: Protocol | None = None,
                  reference: Runnable | None = None, progress=None) -> Measurement:
    """End-to-end drift-compensated timing of child networks (keys: architecture names)."""
    if len({a.name for a in archs}) != len(archs):
        raise FbnasError("measure: architecture names must be distinct")
    return measure(timer, prepare_archs(timer, archs), protocol, reference, progress)


# ---- latency tables --------------------------------------------------------------------------
@under_allocator
def build_table(space: SearchSpace, timer: Timer, protocol: Protocol | None = None,
                table: LatencyTable | None = None, out: str | Path | None = None,
                chunk: int = 32, context_probes: int = CONTEXT_PROBES, progress: bool = False,
                log: Callable[[str], None] | None = None) -> LatencyTable:
    """Measure every signature of `space` that `table` lacks (all of them without a table).

    Writes `out` after every chunk of entries (atomically), so an interrupted build resumes
    from `out`. A fresh build then times `context_probes` whole child networks end to end
    among themselves and folds the context model fitted to them into the values (0 probes:
    no context model).
    Returns the table.
    """
    p = protocol or Protocol()
    log = log or (lambda s: None)
    where = str(out) if out else "table"
    if table is None:
        table = LatencyTable("latency", timer.describe())
        table.protocol = p.to_dict()
    else:
        check_extend(table, timer, table.path or where)
    todo = [s for s in space_signatures(space) if s not in table]
    t0 = time.perf_counter()
    reference = prepare_reference(timer) if p.reference else None
    noise = table.noise or {}
    ref_times: list[float] = list(noise.get("_ref_times_s", []))
    remeasured = int(noise.get("remeasured", 0))
    probes: list[Architecture] = []
    if context_probes > 0 and table.context is None and todo:
        probes = probe_archs(space, context_probes)
    # Exported runtimes and XLA pay a fixed cost per call (entering the runtime, binding input
    # and output; XLA: tracing, graph lookup, launch): an empty program is timed beside the
    # entries (see entry_stats).
    overhead_runs = ({OVERHEAD: timer.prepare(timer.empty_program(), REFERENCE.input_shape,
                                              OVERHEAD)}
                     if getattr(timer, "per_call_overhead", False) and todo else {})
    bar = (MeasureProgress(len(todo) + len(probes), p.rounds,
                           f"latency {space.name}")
           if progress and todo else None)
    remeasured0 = remeasured
    try:
        for i in range(0, len(todo), chunk):
            part = todo[i:i + chunk]
            runs = {}
            for sig in part:
                torch.manual_seed(0)
                runs[sig.key()] = timer.prepare(sig.build(), sig.input_shape, sig.key())
            runs.update(overhead_runs)
            cb = bar.chunk(len(runs)) if bar else None
            m = measure(timer, runs, p, reference, cb)
            call = m.ratio(OVERHEAD) if overhead_runs else 0.0
            remeasured += len(m.remeasured)
            ref_times += m.ref_times
            if table.reference is None or table.reference.get("_provisional"):
                # A fresh build: the unit is the reference's undisturbed time (5th percentile)
                # over every reference sample so far.
                scale = reference_scale(ref_times) * 1e6 if p.reference else 1e6
                table.reference = {"signature": REFERENCE.key() if p.reference else None,
                                   "scale_us": scale, "statistic": "p5 of reference samples",
                                   "_provisional": True}
            for sig in part:
                stats = entry_stats(sig, m.entries[sig.key()],
                                    m.ref_scale_s if p.reference else 1.0,
                                    call if overhead_runs else None)
                stats.update(runs[sig.key()].extra.get("stats", {}))  # runtime: delegated share
                table.add(sig, 0.0, stats)
            refresh_values(table)
            _record_noise(table, ref_times, remeasured, time.perf_counter() - t0, timer)
            if out is not None:
                table.save(out)
        if todo:
            log(f"measured {len(todo)} entries in {time.perf_counter() - t0:.0f} s "
                f"({remeasured - remeasured0} re-measured for spread)"
                + (f"; runtime call overhead {call * table.reference['scale_us']:.1f} us taken "
                   "off every entry but the stem" if overhead_runs else ""))
        if probes:
            # The probes end to end among themselves, as validate, the measured fit and a
            # user time networks: timed among the entries they read 1-7% slower (ImageNet).
            _time_probes(table, space, probes, timer, p, reference,
                         bar.chunk(len(probes)) if bar else None, log)
    finally:
        if bar:
            bar.close()
    if table.reference is not None:
        table.reference.pop("_provisional", None)
    refresh_values(table)
    if table.noise is not None:
        table.noise.pop("_ref_times_s", None)
        table.noise.pop("_probe_ratios", None)  # written by builds before 2026-11-25
        table.noise["build_seconds"] = round(time.perf_counter() - t0, 1)
    if out is not None:
        table.save(out)
    return table


def probe_archs(space: SearchSpace, n: int) -> list[Architecture]:
    """The `n` child networks that fit a table's context model (always the same ones)."""
    return sample_spanning(space, n, counted_rows(space), seed=12345, name="probe")


def fit_context_model(parts: Sequence[Sequence[float]], nets: Sequence[float],
                      exponent_bounds: tuple[float, float] = EXPONENT_BOUNDS
                      ) -> tuple[float, float]:
    """(scale, exponent) that make scale · Σ_e r_e^exponent over each probe's isolated entry
    ratios `parts[p]` match its whole-network ratio `nets[p]`, in least squares of the log
    (relative errors). With fewer than 4 probes the exponent stays 1 and the scale is the
    median of nets / Σ parts (a single factor)."""
    parts = [np.asarray([r for r in p if r > 0], dtype=float) for p in parts]
    nets_a = np.asarray(nets, dtype=float)
    scale1 = float(np.median(nets_a / np.array([p.sum() for p in parts])))
    if len(parts) < 4:
        return scale1, 1.0
    from scipy.optimize import least_squares

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log([np.exp(x[0]) * float(np.sum(p ** x[1])) for p in parts]) - np.log(nets_a)

    lo, hi = exponent_bounds
    fit = least_squares(residuals, [math.log(scale1), 1.0],
                        bounds=([-np.inf, lo], [np.inf, hi]))
    if not fit.success:
        return scale1, 1.0
    return float(math.exp(fit.x[0])), float(fit.x[1])


def _context_from(table: LatencyTable, probes: Sequence[Architecture],
                  samples: dict[str, list[float]],
                  log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The context model (scale, exponent) fitted to the probe networks (fit_context_model)."""
    parts = [[table.entries[s.key()].stats["ratio"] for s in arch_signatures(a)]
             for a in probes]
    nets = [float(np.median(samples[a.name])) for a in probes]
    scale, exponent = fit_context_model(parts, nets)
    fitted = [scale * sum(r ** exponent for r in p if r > 0) for p in parts]
    errors = [f / n - 1 for f, n in zip(fitted, nets, strict=True)]
    table.context = {"scale": round(scale, 5), "exponent": round(exponent, 4),
                     "probes": len(probes),
                     # each probe's whole-network time in reference-op units (×reference us)
                     "probe_nets": [float(f"{n:.6g}") for n in nets],
                     "probe_ratios": [round(n / sum(p), 4) for p, n in zip(parts, nets,
                                                                            strict=True)],
                     "probe_errors": [round(e, 4) for e in errors],
                     "why": "entry value = reference us x scale x ratio^exponent, fitted to "
                            "whole child networks timed end to end (least squares of the "
                            "log); folded into every value"}
    if log:
        log(f"context model x{scale:.3f} · ratio^{exponent:.3f} from {len(probes)} probe "
            f"networks (probe errors {100 * min(errors):+.1f}% to {100 * max(errors):+.1f}%)")
    return table.context


def _record_noise(table: LatencyTable, ref_times: list[float], remeasured: int,
                  seconds: float, timer: Timer | None) -> None:
    rel = [e.stats["rel_iqr"] for e in table.entries.values() if e.stats and "rel_iqr" in e.stats]
    noise: dict[str, Any] = {
        "entries": len(rel),
        "median_rel_iqr": round(float(np.median(rel)), 4) if rel else None,
        "p90_rel_iqr": round(float(np.percentile(rel, 90)), 4) if rel else None,
        "remeasured": remeasured,
    }
    if ref_times:
        q1, med, q3 = np.percentile(ref_times, [25, 50, 75])
        noise.update({"reference_median_us": round(float(med) * 1e6, 3),
                      "reference_min_us": round(float(min(ref_times)) * 1e6, 3),
                      "reference_rel_iqr": round(float((q3 - q1) / med), 4),
                      "reference_samples": len(ref_times),
                      # the machine's drift while building: slowest/fastest reference decile
                      "drift_p90_over_p10": round(float(np.percentile(ref_times, 90)
                                                        / np.percentile(ref_times, 10)), 3)})
    if hasattr(timer, "descheduled_share"):
        noise["descheduled_share"] = round(timer.descheduled_share(), 4)
    noise["_ref_times_s"] = ref_times  # kept while resuming; dropped when the build completes
    noise["seconds"] = round(seconds, 1)
    table.noise = noise


def _time_probes(table: LatencyTable, space: SearchSpace, probes: Sequence[Architecture],
                 timer: Timer, protocol: Protocol | None, reference: Runnable | None, progress,
                 log: Callable[[str], None] | None) -> dict[str, Any]:
    """Time `probes` end to end among themselves and fit the table's context model to them;
    the context records which space they came from (`probe_space`), so that end-to-end
    measurements can later use them as anchors (fbnas.latency.end_to_end.time_networks)."""
    m = measure_archs(timer, probes, protocol, reference, progress)
    ctx = _context_from(table, probes, {a.name: m.entries[a.name].ratios for a in probes}, log)
    ctx["probe_space"] = space_hash(space)
    return ctx
