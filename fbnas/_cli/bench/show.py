"""`fbnas bench show FILE`: what a benchmark holds: its space, training, budgets and seeds, the
spread of the networks' accuracy against the seed-to-seed noise, and the accuracy-latency
front; of a sampled benchmark, its bands and what each holds (the figures over its reference
sample)."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

from fbnas.bench import METRICS
from fbnas.runs.provenance import describe_code

if TYPE_CHECKING:  # pragma: no cover
    from fbnas.bench.table import Bench


def add_parser(actions) -> None:
    p = actions.add_parser("show", help="a benchmark's contents, spread and front")
    p.add_argument("--bench", required=True, metavar="FILE", help="the benchmark file")
    p.add_argument("--metric", default="val_acc", choices=METRICS,
                   help="the figure shown (default %(default)s)")
    p.set_defaults(func=run)


def sampled_lines(b: Bench) -> str:
    """What a sampled benchmark holds: its draw, each band's networks, the added ones."""
    sp, unit = b.meta["sample"], b.meta["latency"]["unit"]
    lines = [f"a SAMPLED benchmark, not every network: a reference sample of {sp['n']} networks "
             f"per band drawn uniformly from those the cost table predicts within "
             f"±{sp['band_width']:.0%} of its target (sample seed {sp['seed']}; rebuild with "
             f"{b.spec.flags()}); the figures below are over the reference sample"]
    for band in sp["band_list"]:
        keys = [n["hash"] for n in band["networks"]]
        size = (f"{band['in_space']:,} of the space's networks" if band["exact"] else
                f"about {band['in_space']:,} of the space's networks (estimated from "
                f"{band['draws']:,} draws)")
        lines.append(f"  band {band['target']}: {band['cost']:.6g} {unit} (predicted "
                     f"{band['lo']:.6g}-{band['hi']:.6g}) holds {size}; {len(keys)} drawn, "
                     f"{sum(b.complete(k) for k in keys)} complete")
    added = b.added()
    lines.append(f"  added (a search's or a baseline's picks): {len(added)}, "
                 f"{sum(b.complete(k) for k in added)} complete")
    return "\n".join(lines)


def run(args) -> int:
    from fbnas.bench.table import Bench

    b = Bench.load(args.bench)
    m = b.meta
    done = [k for k in b.reference() if b.complete(k)]  # a sampled one: its reference sample
    total = math.prod(len(c) for c in b.space.decision_candidates())
    print(f"{args.bench}: space '{b.space.name}' ({total} networks, "
          f"{sum(b.complete(k) for k in b)} complete), "
          f"seeds {m['seeds']}, budgets {m['budgets']} epochs; built in "
          f"{m['build_seconds']:.0f} s with fbnas {m['versions']['fbnas']}, torch "
          f"{m['versions']['torch']} on {m['machine']['platform']}")
    code = b.code
    print("built at " + (describe_code(code[0]) if code else "an unrecorded commit (a file "
                         "from before fbnas recorded it)")
          + "".join(f", resumed at {describe_code(c)}" for c in code[1:])
          + (f"; retrain.threads {b.meta['training']['retrain']['threads']}"
             if "threads" in b.meta["training"].get("retrain", {}) else ""))
    if b.sampled:
        print(sampled_lines(b))
    for budget in b.budgets:
        means = [b.mean(k, args.metric, budget) for k in done]
        sds = [statistics.stdev([float(b.networks[k]["runs"][str(s)][str(budget)][args.metric])
                                 for s in b.seeds]) for k in done] if len(b.seeds) > 1 else []
        if len(means) < 2:
            continue
        sd = statistics.fmean(sds) if sds else float("nan")
        spread = max(means) - min(means)
        print(f"budget {budget}: mean {args.metric} {min(means):.4f}-{max(means):.4f} "
              f"(spread {spread:.4f}, sd across networks {statistics.stdev(means):.4f}); "
              f"seed-to-seed sd {sd:.4f} (mean over networks): spread / seed sd "
              f"{spread / sd if sd > 0 else float('inf'):.1f}; Kendall τ seed "
              f"{b.seeds[0]} vs seed {b.seeds[1] if len(b.seeds) > 1 else '-'} "
              f"{b.seed_tau(args.metric, budget, done):.3f} (two full trainings of every "
              f"{'reference ' * b.sampled}network agree this far: the yardstick for a "
              "supernet's τ)")
    front = b.front(args.metric, keys=done)
    unit = m["latency"]["unit"]
    print(f"front ({len(front)} networks{' of the reference sample' * b.sampled}, predicted "
          f"{unit}):")
    for k in front:
        print(f"  {b.latency(k):9.1f}  {b.mean(k, args.metric):.4f}  "
              f"{' '.join(b.networks[k]['ops'])}")
    return 0
