"""The networks of a cost band: every one of them (`band_members`), or some drawn uniformly
(`drawn_in_band`; `draw_rejecting` where the space is too large to enumerate). The final
pick's band-wide shortlist (`search.final_band_draws`) and a sampled benchmark's reference
draws (`fbnas.bench.sample`) both draw here."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fbnas.fit.onto_target import every_cost
from fbnas.latency.cost_model import predicted_cost


def band_members(rows: Sequence[Sequence[float]], fixed: float, lo: float, hi: float
                 ) -> list[tuple[int, ...]]:
    """Every architecture's op indices whose predicted cost lies in [lo, hi], in
    `itertools.product` order (the whole space enumerated: callers bound its size)."""
    shape = tuple(len(r) for r in rows)
    cost = every_cost(rows, fixed)
    return [tuple(int(j) for j in np.unravel_index(int(i), shape))
            for i in np.flatnonzero((cost >= lo) & (cost <= hi))]


def draw_rejecting(sizes: Sequence[int], inside, n: int, rng, max_draws: int
                   ) -> tuple[list[tuple[int, ...]], int, int]:
    """Up to `n` distinct architectures drawn uniformly from a space too large to enumerate
    (`sizes`: each decision's number of choices), keeping those `inside(indices)` accepts, in
    drawing order, for at most `max_draws` draws from `rng` (a `random.Random`); with the
    draws made and how many of them landed inside (the band's share of the space)."""
    seen: dict[tuple[int, ...], None] = {}
    draws = hits = 0
    while len(seen) < n and draws < max_draws:
        idx = tuple(rng.randrange(k) for k in sizes)
        draws += 1
        if inside(list(idx)):
            hits += 1
            seen.setdefault(idx, None)
    return list(seen), draws, hits


def drawn_in_band(rows: Sequence[Sequence[float]], fixed: float, lo: float, hi: float, n: int,
                  rng, limit: int = 200_000) -> list[list[int]]:
    """`n` architectures drawn uniformly, without replacement, among those predicted in
    [lo, hi] (all of them where the band holds fewer): exact for spaces of at most `limit`
    architectures, by rejection beyond (`draw_rejecting`, at most 100·limit draws)."""
    if math.prod(len(r) for r in rows) <= limit:
        members = band_members(rows, fixed, lo, hi)
        return [list(i) for i in rng.sample(members, min(n, len(members)))]
    got, _, _ = draw_rejecting([len(r) for r in rows],
                               lambda i: lo <= predicted_cost(rows, fixed, i) <= hi,
                               n, rng, 100 * limit)
    return [list(i) for i in got]
