"""`fbnas bench query ARCH.yaml --bench FILE`: a network's entry (every seed and budget, its
latency) and its rank among all networks and among those of similar latency."""

from __future__ import annotations

from fbnas.bench import METRICS
from fbnas.settings import LATENCY_TOLERANCE


def add_parser(actions) -> None:
    p = actions.add_parser("query", help="a network's entry and rank in a benchmark")
    p.add_argument("arch", help="an architecture YAML of the benchmark's space")
    p.add_argument("--bench", required=True, help="the benchmark file")
    p.add_argument("--metric", default="val_acc", choices=METRICS, help="what ranks")
    p.add_argument("--near", type=float, default=LATENCY_TOLERANCE,
                   help="'similar latency': within ± this share")
    p.set_defaults(func=run)


def run(args) -> int:
    from fbnas.arch import Architecture
    from fbnas.bench.table import Bench

    bench = Bench.load(args.bench)
    k = bench.key(Architecture.load(args.arch), args.arch)
    for r in bench.records(k):
        print(f"seed {r['seed']} budget {r['budget']:3d}: train {r['train_acc']:.3f}  val "
              f"{r['val_acc']:.3f} (CE {r['val_ce']:.3f})  test {r['test_acc']:.3f} (CE "
              f"{r['test_ce']:.3f})  {r['seconds']:.1f} s")
    n = bench.networks[k]
    lat = n.get("predicted")
    unit = bench.meta["latency"]["unit"]
    measured = f", measured {n['measured']:.1f}" if n.get("measured") is not None else ""
    print(f"{' '.join(n['ops'])}: params {n['params']}, FLOPs {n['flops']}, latency predicted "
          f"{lat:.1f}{measured} {unit}")
    mine = bench.mean(k, args.metric)
    # a sampled benchmark ranks among its reference sample (the network itself counted once)
    done = [j for j in dict.fromkeys([*bench.reference(), k]) if bench.complete(j)]
    better = sum(bench.mean(j, args.metric) > mine for j in done)
    near = [j for j in done if abs(bench.latency(j) / lat - 1) <= args.near]
    better_near = sum(bench.mean(j, args.metric) > mine for j in near)
    if bench.sampled:
        drawn = [b for b, ks in bench.band_keys().items() if k in ks]
        how = (f"drawn in band{'s' * (len(drawn) > 1)} {', '.join(drawn)}" if drawn else
               "added (not in the reference sample)")
        print(f"a SAMPLED benchmark: this network was {how}; its ranks are among the "
              "reference sample's networks (and itself), not every network of the space")
    print(f"mean {args.metric} {mine:.4f}: rank {better + 1} of {len(done)}; rank "
          f"{better_near + 1} of {len(near)} within ±{args.near:.0%} of its latency")
    return 0
