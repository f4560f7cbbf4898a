"""Whole networks timed end to end in the table's units, as the measured fit, `fbnas retrain`,
`fbnas sweep`, `fbnas latency measure --config` and the benchmarks time them: interleaved with
the table's probe networks (`panel`) and anchored to their times at the table's build, read at
each network's size (`anchored_scale`), else through the reference op."""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fbnas.arch import Architecture, build_child
from fbnas.backends import Timer
from fbnas.errors import FbnasError
from fbnas.latency.build import probe_archs, sample_spanning
from fbnas.latency.config import LatencyConfig
from fbnas.latency.kinds import is_measured
from fbnas.latency.measure import Measurement, Protocol
from fbnas.latency.table import LatencyTable, space_hash
from fbnas.latency.timed_models import measure_modules
from fbnas.search_space import SearchSpace


def timer_label(d: dict[str, Any]) -> str:
    """'CPU MODEL (cpu, 1 thread, batch 1, float32)' from a timer's `describe()`."""
    return (f"{d.get('device_name')} ({d['backend']}, {d['threads']} thread"
            f"{'s' if d['threads'] != 1 else ''}, batch {d['batch']}, {d['dtype']})")


# A network timed alone, its samples back to back, repeated within 2-12% on this VM (30 or
# 150 rounds), and read 1-2% above the same network timed among others; interleaved with a
# few others its samples spread over more machine states: 0.3-4.6% (median 1.2%), 0.7% apart.
COMPANIONS = 6
# Rounds of an end-to-end measurement (the measured fit, a retrained child). Over the table's
# probes (`Panel`) five networks repeated within 0.9-2.6% (sd over 6 runs) at 30 rounds and
# 0.4-1.4% at 90; over the reference op 2.1-3.2% at 30 rounds and 1.6-2.8% at 90 (2-core VM).
FIT_ROUNDS = 60


@dataclass(frozen=True)
class Panel:
    """The networks timed beside a measured one, and what its figure is expressed through."""

    archs: list[Architecture]
    # each one's whole-network time at the table's build in reference-op units
    # (`context.probe_nets`): the figure is then anchored to them; None: to the reference op
    anchors: list[float] | None = None

    @property
    def label(self) -> str:
        return (f"anchored to the table's {len(self.archs)} probe networks" if self.anchors
                else "through the reference op")

    def nearest(self, n: int, anchor: float) -> Panel:
        """The `n` anchored networks whose anchors are nearest `anchor` (in log: a network of
        that many reference-op units), in their order; the panel itself when it holds no more
        than `n` or has no anchors (0: all)."""
        if n <= 0 or not self.anchors or len(self.archs) <= n:
            return self
        order = sorted(range(len(self.archs)),
                       key=lambda i: abs(math.log(self.anchors[i] / anchor)))
        keep = sorted(order[:n])
        return Panel([self.archs[i] for i in keep], [self.anchors[i] for i in keep])


def panel(space: SearchSpace, table: LatencyTable | None) -> Panel:
    """The table's probe networks with their build-time times, where its context model was
    fitted on `space` (the reference op's time relative to whole networks moves by 2-3%
    between runs on a busy machine; whole networks move together); else `companions`."""
    ctx = (table.context or {}) if table is not None else {}
    nets = ctx.get("probe_nets")
    if nets and len(nets) == ctx.get("probes") and ctx.get("probe_space") == space_hash(space) \
            and (table.reference or {}).get("scale_us"):
        return Panel(probe_archs(space, len(nets)), [float(x) for x in nets])
    return Panel(companions(space, table))


def fit_panel(space: SearchSpace, table: LatencyTable | None, size: int, near_us: float
              ) -> Panel:
    """The panel the measured fit times a network of about `near_us` among: `panel`, or its
    `size` probe networks nearest that time (`search.fit_panel`; 0: all)."""
    pan = panel(space, table)
    ref_us = (table.reference or {}).get("scale_us") if table is not None else None
    return pan.nearest(size, near_us / ref_us) if ref_us else pan


def companions(space: SearchSpace, table: LatencyTable | None, n: int = COMPANIONS
               ) -> list[Architecture]:
    """`n` child networks spanning `space` by `table`'s costs (always the same ones), timed
    beside a network so that its samples spread over more machine states; none where the
    table does not cover the space."""
    if table is None or n <= 0:
        return []
    try:
        rows, _ = table.costs_for(space, "raw")
    except FbnasError:
        return []
    return sample_spanning(space, n, rows, seed=4321, name="companion")


def measure_child(model: torch.nn.Module, arch: Architecture, lat: LatencyConfig,
                     table: LatencyTable | None = None, protocol: Protocol | None = None,
                     space: SearchSpace | None = None) -> dict[str, Any]:
    """End-to-end latency of the (trained) child with the latency section's timer settings,
    in the table's units, as the measured fit times its networks: interleaved with `space`'s
    `panel` where given (anchored to the table's probes where it can be), else drift-
    compensated through the reference op (the table's reference scale where there is one)."""
    timer = timer_for_table(lat, table)
    pan = panel(space, table) if space is not None else Panel([])
    net = {"child": (copy.deepcopy(model).cpu(), (arch.macro.in_channels, *arch.macro.input_size))}
    s = time_networks(timer, net, table, pan, protocol or Protocol(rounds=FIT_ROUNDS))["child"]
    d = timer.describe()
    return {"median_us": s["median_us"], "min_us": s["min_us"],
            "rel_iqr": s["rel_iqr"], "n": s["n"], "device": timer_label(d), "timer": d,
            "units": pan.label}


def timer_for_table(lat: LatencyConfig, table: LatencyTable | None) -> Timer:
    """The latency section's timer, under the allocator `table` was measured with unless the
    section names one: end-to-end figures then follow the table's protocol, so that they
    compare with its predictions (a child's measured latency, a sweep's, the target benchmark's:
    scripts.search.target)."""
    timer = lat.make_timer()
    if lat.allocator is None and table is not None and is_measured(table.cost) and \
            table.meta.get("backend") == timer.backend:
        timer = dataclasses.replace(lat, allocator=table.meta.get("allocator", "system")
                                    ).make_timer()
    return timer


def time_networks(timer: Timer, nets: dict[str, tuple[torch.nn.Module, tuple[int, int, int]]],
                  table: LatencyTable | None, pan: Panel, proto: Protocol
                  ) -> dict[str, dict[str, Any]]:
    """Networks (label -> (module, C,H,W)) timed end to end in one interleaved measurement
    with `pan`'s networks; each one's statistics in the table's µs. With anchors, a ratio is
    converted through the panel (`anchored_scale`: anchor × reference µs / ratio of its
    networks, what the machine's drift since the build did to whole networks, read at the
    network's size); else
    through the reference op (the table's reference scale where there is one). Each summary
    also holds `ref_median_us`, the median through the reference op, for comparison."""
    m = measure_modules(timer, {**nets, **panel_modules(pan)}, proto, watch=list(nets))
    scale_us, ref_scale_us = unit_scales(m, table, pan, proto.reference)
    out = {}
    for k in nets:
        s = m.entries[k].summary(scale_us(k) / 1e6)
        s["ref_median_us"] = m.ratio(k) * ref_scale_us
        out[k] = s
    return out


def panel_modules(pan: Panel) -> dict[str, tuple[torch.nn.Module, tuple[int, int, int]]]:
    """`pan`'s networks built, labelled 'panel NAME', to be timed beside measured ones."""
    return _built({f"panel {a.name}": a for a in pan.archs})


def unit_scales(m: Measurement, table: LatencyTable | None, pan: Panel, reference: bool
                ) -> tuple[Callable[[str], float], float]:
    """How a measurement that timed `pan`'s networks (`panel_modules`) converts an entry's
    ratio to µs in the table's units: (label -> µs per reference-op unit, anchored to the
    probes at that entry's size where `pan` has anchors and the table a reference scale;
    the reference op's µs, the table's reference scale where there is one)."""
    ref_us = (table.reference or {}).get("scale_us") if table is not None else None
    ref_scale_us = (ref_us or m.ref_scale_s * 1e6) if reference else 1e6
    if not (pan.anchors and ref_us):
        return (lambda _: ref_scale_us), ref_scale_us
    scale = anchored_scale([m.ratio(f"panel {a.name}") for a in pan.archs],
                           [anchor * ref_us for anchor in pan.anchors])
    return (lambda label: scale(m.ratio(label))), ref_scale_us


def anchored_scale(ratios: list[float], anchors_us: list[float]) -> Callable[[float], float]:
    """µs per reference-op unit for a network of `ratio` (its time over the reference op's,
    now), from probe networks timed now (`ratios`) and at the table's build (`anchors_us`):
    each probe's anchor / ratio is what the machine's drift since the build did to a network
    of its size, and the drift is not the same for small and large networks (per-call
    overhead and compute move apart when the CPU's speed shifts), so it is fitted as a line in
    log-log over the probes and read at the network's size, within their range (39 quickstart
    networks, 6 runs each: their figures repeated within 0.54% between runs (sd, median)
    against 0.90% through one factor for all sizes, the all-skip network 0.22% against 2.78%;
    `docs/latency.md`). With fewer than 4 probes, one factor (their geometric mean)."""
    x = [math.log(r) for r in ratios]
    y = [math.log(a / r) for a, r in zip(anchors_us, ratios, strict=True)]
    mx, my = statistics.mean(x), statistics.mean(y)
    sxx = sum((v - mx) ** 2 for v in x)
    slope = (sum((u - mx) * (v - my) for u, v in zip(x, y, strict=True)) / sxx
             if len(x) >= 4 and sxx > 0 else 0.0)
    lo, hi = min(x), max(x)
    return lambda ratio: math.exp(my + slope * (min(max(math.log(ratio), lo), hi) - mx))


def time_archs(timer: Timer, archs: dict[str, Architecture], table: LatencyTable | None,
               pan: Panel, rounds: int = FIT_ROUNDS, stop_ci: float = 0.0
               ) -> dict[str, dict[str, Any]]:
    """`time_networks` for architectures (label -> Architecture) among `pan`: how the measured
    fit, the sweep and the benchmarks time networks (`stop_ci`: at most `rounds`, stopping
    once every figure is known within ±stop_ci; `Protocol.stop_ci`)."""
    return time_networks(timer, _built(archs), table, pan,
                         Protocol(rounds=rounds, stop_ci=stop_ci))


def timing_seconds(space: SearchSpace, table: LatencyTable | None, latency_us: float,
                   rounds: int = FIT_ROUNDS, stop_ci: float = 0.0, panel_size: int = 0
                   ) -> float:
    """The wall seconds `time_archs` is expected to take for one network of about
    `latency_us` among `panel(space, table)` (what `search.budget` plans for each network the
    measured fit times): per round, every entry sampled for the protocol's sample time (or one
    call where a call is longer) and the reference op bracketing every `ref_every` of them;
    each entry warmed up and built once. Calibrated against measured fits on the 2-core VM
    (`docs/search.md`, "A search at a budget")."""
    p = Protocol(rounds=rounds, stop_ci=stop_ci)
    if stop_ci > 0:  # planned at the rounds such a timing took on the 2-core VM
        rounds = min(rounds, max(p.min_rounds, STOP_CI_ROUNDS))
    pan = fit_panel(space, table, panel_size, latency_us)
    entries = 1 + len(pan.archs)
    sample = max(p.sample_s, latency_us / 1e6)
    per_round = entries * sample + (entries / p.ref_every + 1) * p.ref_sample_s
    return TIMING_OVERHEAD * (rounds * per_round + entries * (p.warmup_s + BUILD_S))


# the measured wall time of a timing over the protocol's sample times (Python, the worker's
# round trips) and the seconds to build one network: `timing_seconds`
TIMING_OVERHEAD = 1.3
BUILD_S = 0.05
# the rounds a timing that stops at ±1% (Protocol.stop_ci) took, as planned
STOP_CI_ROUNDS = 30


def _built(archs: dict[str, Architecture]
           ) -> dict[str, tuple[torch.nn.Module, tuple[int, int, int]]]:
    """Each architecture built with the same seed, with its input shape."""
    out = {}
    for k, a in archs.items():
        torch.manual_seed(0)
        out[k] = (build_child(a), (a.macro.in_channels, *a.macro.input_size))
    return out
