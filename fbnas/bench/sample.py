"""The reference sample of a sampled benchmark: a space too large to train every network of
is benchmarked on networks drawn uniformly at random from it, `n` per target band.

A band is a latency target as `loss.target` reads it (`0.5x`: a position in the space's cost
range, `900us`, or a number in the table's unit), resolved against the cost model a search of
the config fits with (`CostSource.model(space)`: the run's table, or counted FLOPs), and a
relative width: the networks whose predicted cost lies within target × (1 ± width). Each band
draws its own `n` networks uniformly among those, without replacement, from a generator seeded
by the sample seed and the band as written (so adding a band leaves the others' draws as they
were). A space of at most `ENUMERATE` networks is enumerated: the band's size is exact and a
band holding fewer than `n` networks gives all of them. A larger space is sampled by rejection
(uniform draws from the space, those in the band kept) for at most `MAX_DRAWS` draws; the
band's size is then an estimate.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fbnas.arch import arch_from_indices
from fbnas.bench import DEFAULT_BANDS
from fbnas.errors import FbnasError
from fbnas.fit._band import band_members, draw_rejecting
from fbnas.loss import parse_target, resolve_target
from fbnas.settings import LATENCY_TOLERANCE

ENUMERATE = 1 << 21  # spaces up to this many networks are enumerated: a band's size is exact
MAX_DRAWS = 1_000_000  # rejection sampling of a larger space gives up after this many draws


@dataclass(frozen=True)
class SampleSpec:
    """What a sampled benchmark's reference sample is drawn by: `n` networks per band,
    `bands` (targets as `loss.target` reads them), each ± `band_width` (relative), `seed`."""

    n: int
    bands: tuple[str, ...] = DEFAULT_BANDS
    band_width: float = LATENCY_TOLERANCE
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise FbnasError(f"--sample {self.n!r}: the networks per band must be an integer "
                             ">= 1")
        if not self.bands:
            raise FbnasError("--targets: give at least one target, such as 0.5x,0.8x")
        for b in self.bands:
            parse_target(b, f"--targets {b!r}")
        if len(set(self.bands)) != len(self.bands):
            raise FbnasError(f"--targets {','.join(self.bands)}: a band is named twice")
        w = self.band_width
        if not isinstance(w, (int, float)) or not math.isfinite(w) or not 0 < w < 1:
            raise FbnasError(f"--band-width {w!r}: a relative half-width, > 0 and < 1 (0.03: "
                             "within ±3% of the band's target)")

    @classmethod
    def parse(cls, n: int, bands: str | None, band_width: float | None,
              seed: int | None) -> SampleSpec:
        """From the command line's `--sample N [--targets 0.5x,0.8x] [--band-width W]
        [--seed S]`."""
        raw = DEFAULT_BANDS if bands is None else tuple(
            b.strip() for b in bands.split(",") if b.strip())
        return cls(n, raw, LATENCY_TOLERANCE if band_width is None else float(band_width),
                   0 if seed is None else int(seed))

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "bands": list(self.bands), "band_width": self.band_width,
                "seed": self.seed}

    @classmethod
    def from_meta(cls, sample: dict[str, Any]) -> SampleSpec:
        return cls(int(sample["n"]), tuple(sample["bands"]), float(sample["band_width"]),
                   int(sample["seed"]))

    def flags(self) -> str:
        """The command-line flags that draw this sample."""
        return (f"--sample {self.n} --targets {','.join(self.bands)} --band-width "
                f"{self.band_width:g} --seed {self.seed}")


def _band_rng(seed: int, band: str) -> random.Random:
    # a str seed is hashed by sha512 (random.seed version 2): the same in every process
    return random.Random(f"fbnas-bench-sample:{seed}:{band}")


def _members(space, model, lo: float, hi: float) -> list[tuple[int, ...]]:
    """Every architecture's decision indices whose predicted cost is in [lo, hi] (a space of
    at most ENUMERATE networks), in `itertools.product` order (widths outermost)."""
    combos = (model.width_combos() if space.searches_widths else [()])
    out: list[tuple[int, ...]] = []
    for widths in combos:
        rows, fixed = model.rows_at(widths)
        out.extend((*i, *widths) for i in band_members(rows, fixed, lo, hi))
    return out


def draw_band(space, model, spec: SampleSpec, band: str) -> dict[str, Any]:
    """One band's draw: its target and bounds in the cost model's unit, how many networks of
    the space it holds (exact, or estimated from the rejection draws), and the drawn networks
    (hash and decision indices, in drawing order)."""
    target = resolve_target(band, model.bounds(), f"--targets {band!r}")
    lo, hi = target * (1 - spec.band_width), target * (1 + spec.band_width)
    cands = space.decision_candidates()
    total = math.prod(len(c) for c in cands)
    rng = _band_rng(spec.seed, band)
    if total <= ENUMERATE:
        members = _members(space, model, lo, hi)
        drawn = rng.sample(members, min(spec.n, len(members)))
        size, exact, draws = len(members), True, None
    else:
        drawn, draws, hits = draw_rejecting([len(c) for c in cands],
                                            lambda i: lo <= model.of(i) <= hi, spec.n, rng,
                                            MAX_DRAWS)
        size, exact = round(total * hits / draws), False
    nets = [{"hash": arch_from_indices(space, list(i)).hash(), "indices": list(i)}
            for i in drawn]
    return {"target": band, "cost": round(target, 6), "lo": round(lo, 6), "hi": round(hi, 6),
            "in_space": size, "exact": exact, "draws": draws, "networks": nets}


def draw_reference(space, model, spec: SampleSpec, unit: str,
                   log: Callable[[str], None] = print) -> dict[str, Any]:
    """The sample's metadata (`spec`, the space's size, each band's draw). A band holding no
    network of the space is a one-line error; one holding fewer than `spec.n` gives those it
    has, and says so."""
    total = math.prod(len(c) for c in space.decision_candidates())
    bands = []
    for band in spec.bands:
        d = draw_band(space, model, spec, band)
        where = (f"band {band} ({d['cost']:.6g} {unit} ± {spec.band_width:.0%}, predicted "
                 f"{d['lo']:.6g}-{d['hi']:.6g})")
        if not d["networks"]:
            how = ("of its" if d["exact"] else f"in {d['draws']:,} uniform draws from its")
            raise FbnasError(f"{where}: no network {how} {total:,} lies in it; choose another "
                             "target or a wider --band-width")
        if len(d["networks"]) < spec.n:
            log(f"bench: {where} holds {'only ' if d['exact'] else 'about '}{d['in_space']:,} "
                f"network(s) of the space{'' if d['exact'] else ' (estimated)'}: "
                f"{len(d['networks'])} in the sample, not {spec.n}")
        bands.append(d)
    return {**spec.to_dict(), "unit": unit, "space_networks": total, "band_list": bands,
            "added": []}


def reference_indices(sample: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """(hash, decision indices) of every reference network, each once, the bands' draws
    interleaved (the first of every band, then the second, ...), so that a build stopped
    part-way has every band in part."""
    out: dict[str, list[int]] = {}
    bands = [b["networks"] for b in sample["band_list"]]
    for i in range(max((len(b) for b in bands), default=0)):
        for b in bands:
            if i < len(b):
                out.setdefault(b[i]["hash"], b[i]["indices"])
    return list(out.items())


def same_draw(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two samples drew the same networks per band (the spec and the draws)."""
    def key(s: dict[str, Any]) -> tuple:
        return (s["n"], tuple(s["bands"]), s["band_width"], s["seed"],
                tuple(tuple(n["hash"] for n in b["networks"]) for b in s["band_list"]))
    return key(a) == key(b)

