"""`fbnas bench show FILE`: what a benchmark holds: its space, training, budgets and seeds, the
spread of the networks' accuracy against the seed-to-seed noise, and the accuracy-latency
front."""

from __future__ import annotations

import statistics

from fbnas.bench.table import Bench
from fbnas.provenance import describe_code


def add_parser(actions) -> None:
    p = actions.add_parser("show", help="a benchmark's contents, spread and front")
    p.add_argument("bench", help="the benchmark file")
    p.add_argument("--metric", default="val_acc", help="default val_acc")
    p.set_defaults(func=run)


def run(args) -> int:
    b = Bench.load(args.bench)
    m = b.meta
    done = [k for k in b if b.complete(k)]
    total = 1
    for c in b.space.layer_candidates():
        total *= len(c)
    print(f"{args.bench}: space '{b.space.name}' ({total} networks, {len(done)} complete), "
          f"seeds {m['seeds']}, budgets {m['budgets']} epochs; built in "
          f"{m['build_seconds']:.0f} s with fbnas {m['versions']['fbnas']}, torch "
          f"{m['versions']['torch']} on {m['machine']['platform']}")
    code = b.code
    print("built at " + (describe_code(code[0]) if code else "an unrecorded commit (a file "
                         "from before fbnas recorded it)")
          + "".join(f", resumed at {describe_code(c)}" for c in code[1:])
          + (f"; retrain.threads {b.meta['training']['retrain']['threads']}"
             if "threads" in b.meta["training"].get("retrain", {}) else ""))
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
              f"{b.seed_tau(args.metric, budget):.3f} (two full trainings of every network "
              "agree this far: the yardstick for a supernet's τ)")
    front = b.front(args.metric)
    unit = m["latency"]["unit"]
    print(f"front ({len(front)} networks, predicted {unit}):")
    for k in front:
        print(f"  {b.latency(k):9.1f}  {b.mean(k, args.metric):.4f}  "
              f"{' '.join(b.networks[k]['ops'])}")
    return 0
