"""Drift-compensated measurement: interleaved rounds, a fixed reference op, robust statistics.

The machine's speed changes while we measure (on a shared VM by 2x within seconds), so no
entry is timed in one long stretch. Instead:

1. every entry is warmed up, and its calls per sample are chosen so a sample lasts ~`sample_s`;
2. `rounds` rounds each visit every entry once, in a fresh shuffled order, so a slow spell of
   the machine hits every entry alike;
3. a fixed *reference op* is sampled before and after every `ref_every` entries; each entry
   sample is divided by the mean of the two reference samples around it. The ratio does not
   move when the whole machine slows down; the median of ratios x the reference's time with
   the machine undisturbed (the 5th percentile of its samples) gives microseconds;
4. entries whose ratios spread (IQR / median) more than `max_rel_iqr` get extra rounds;
5. with `stop_ci`, the rounds stop early once every entry's median is known within ±stop_ci
   (its distribution-free 95% interval), after `min_rounds`.

The same routine times blocks for a table and whole networks end to end, so the two are
compensated alike.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fbnas.backends import Runnable, Timer
from fbnas.latency.signature import Signature
from fbnas.settings import TIMING_ROUNDS

# The fixed reference op: a mid-sized IRF block, the kind of work the entries do.
REFERENCE = Signature("block", "ir_k3_e3", 32, 32, 1, 16, 16)


@dataclass
class Protocol:
    """How entries are timed; recorded in the table so a rebuild can repeat it."""

    rounds: int = TIMING_ROUNDS
    sample_s: float = 0.008  # target duration of one entry sample
    ref_sample_s: float = 0.004
    ref_every: int = 2  # reference samples bracket every `ref_every` entry samples
    warmup_s: float = 0.03
    max_rel_iqr: float = 0.08  # entries noisier than this get extra rounds ...
    extra_rounds: int = 15  # ... this many, at most
    reference: bool = True
    seed: int = 0
    # stop before `rounds` once every entry's median ratio is known within ±stop_ci (its 95%
    # interval, `EntryStats.median_ci`), after at least `min_rounds` (0: every round)
    stop_ci: float = 0.0
    min_rounds: int = 10

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["reference_signature"] = REFERENCE.key() if self.reference else None
        return d


@dataclass
class EntryStats:
    """Samples of one entry: seconds per call, and the same divided by the reference."""

    times: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    number: int = 1  # calls per sample

    @property
    def n(self) -> int:
        return len(self.ratios)

    def quantiles(self) -> tuple[float, float, float]:
        q1, med, q3 = np.percentile(self.ratios, [25, 50, 75])
        return float(q1), float(med), float(q3)

    @property
    def rel_iqr(self) -> float:
        q1, med, q3 = self.quantiles()
        return (q3 - q1) / med if med > 0 else 0.0

    def median_ci(self) -> float:
        """The half-width of the distribution-free 95% interval of the median ratio (the
        order statistics n/2 ∓ 0.98·√n), relative to the median: how far the figure may be
        off from what more rounds would read."""
        xs = sorted(self.ratios)
        n = len(xs)
        if n < 4:
            return float("inf")
        # the 1-based ranks floor(n/2 − 0.98√n) and ceil(n/2 + 0.98√n), as 0-based indices
        lo = max(0, math.floor(n / 2 - 0.98 * math.sqrt(n)) - 1)
        hi = min(n - 1, math.ceil(n / 2 + 0.98 * math.sqrt(n)) - 1)
        med = float(np.median(xs))
        return (xs[hi] - xs[lo]) / (2 * med) if med > 0 else float("inf")

    def summary(self, scale_s: float) -> dict[str, float | int]:
        """Statistics in microseconds: ratios x `scale_s` (the reference's median seconds)."""
        q1, med, q3 = self.quantiles()
        us = scale_s * 1e6
        return {
            "median_us": med * us, "min_us": min(self.ratios) * us, "iqr_us": (q3 - q1) * us,
            "rel_iqr": (q3 - q1) / med if med > 0 else 0.0, "n": self.n,
            "raw_median_us": float(np.median(self.times)) * 1e6,
            "raw_min_us": min(self.times) * 1e6, "calls_per_sample": self.number,
        }


@dataclass
class Measurement:
    entries: dict[str, EntryStats]
    ref_times: list[float]
    remeasured: list[str]
    seconds: float

    @property
    def ref_scale_s(self) -> float:
        """The reference op's time with the machine undisturbed: the 5th percentile of its
        samples (its median moves with how busy the machine was; its low tail does not)."""
        return reference_scale(self.ref_times)

    def ratio(self, key: str) -> float:
        return self.entries[key].quantiles()[1]


Progress = Callable[[int, int, str], None]
REFERENCE_QUANTILE = 5.0


def reference_scale(ref_times: list[float]) -> float:
    """Seconds per reference call that ratios are converted with (see Measurement)."""
    return float(np.percentile(ref_times, REFERENCE_QUANTILE)) if ref_times else 1e-6


def _calls_for(timer: Timer, run: Runnable, target_s: float, warmup_s: float) -> int:
    """Warm `run` up; return how many calls make a sample last about `target_s`."""
    spent, best, calls = 0.0, float("inf"), 0
    while calls < 3 or (spent < warmup_s and calls < 200):
        t = timer.sample(run, 1)
        spent += t
        best = min(best, t)
        calls += 1
    return max(1, min(100_000, round(target_s / max(best, 1e-9))))


def measure(timer: Timer, runs: dict[str, Runnable], protocol: Protocol | None = None,
            reference: Runnable | None = None, progress: Progress | None = None,
            watch: list[str] | None = None) -> Measurement:
    """Time every runnable in interleaved, reference-normalised rounds (see module docstring).

    `reference` is the prepared reference op (built from REFERENCE when None and the protocol
    asks for one). Without a reference, ratios are raw seconds. `watch`: the entries whose
    intervals `protocol.stop_ci` waits for (default: every one; the networks a measurement is
    for, not the panel timed beside them, whose figures are pooled).
    """
    p = protocol or Protocol()
    t_start = time.perf_counter()
    rng = random.Random(p.seed)
    keys = list(runs)
    stats = {k: EntryStats() for k in keys}
    ref_times: list[float] = []
    with timer:
        if p.reference and reference is None:
            reference = timer.prepare(REFERENCE.build(), REFERENCE.input_shape, "reference")
        ref_n = _calls_for(timer, reference, p.ref_sample_s, p.warmup_s) if p.reference else 0
        for k in keys:
            stats[k].number = _calls_for(timer, runs[k], p.sample_s, p.warmup_s)

        def ref_sample() -> float:
            if not p.reference:
                return 1.0
            t = timer.sample(reference, ref_n)
            ref_times.append(t)
            return t

        total = len(keys) * p.rounds
        done = 0

        def one_round(subset: list[str]) -> None:
            nonlocal done
            order = subset[:]
            rng.shuffle(order)
            before = ref_sample()
            for i in range(0, len(order), max(1, p.ref_every)):
                chunk = order[i:i + max(1, p.ref_every)]
                got = [(k, timer.sample(runs[k], stats[k].number)) for k in chunk]
                after = ref_sample()
                ref = 0.5 * (before + after)
                for k, t in got:
                    stats[k].times.append(t)
                    stats[k].ratios.append(t / ref)
                    done += 1
                    if progress is not None:
                        progress(done, total, k)
                before = after

        stopped = False
        for r in range(p.rounds):
            one_round(keys)
            if p.stop_ci > 0 and r + 1 >= p.min_rounds and all(
                    stats[k].median_ci() <= p.stop_ci for k in (watch or keys)):
                stopped = True  # every figure known within ±stop_ci: no round would move it
                break
        remeasured: list[str] = []
        if p.extra_rounds > 0 and p.rounds >= 4 and not stopped:
            noisy = [k for k in keys if stats[k].rel_iqr > p.max_rel_iqr]
            remeasured = noisy[:]
            for _ in range(p.extra_rounds):
                if not noisy:
                    break
                total += len(noisy)
                one_round(noisy)
                noisy = [k for k in noisy if stats[k].rel_iqr > p.max_rel_iqr]
        timer.check()
    return Measurement(stats, ref_times, remeasured, time.perf_counter() - t_start)
