"""`fbnas bench add FILE ARCH.yaml… --config BENCH.yaml`: train and time networks (a search's or
a baseline's picks) into a sampled benchmark, under its seeds and budgets with the config's
recipe, so that `fbnas bench score` can judge them (resumable as the build is)."""

from __future__ import annotations

from fbnas.settings import TIMING_ROUNDS


def add_parser(actions) -> None:
    p = actions.add_parser("add", help="train networks into a sampled benchmark (a search's "
                                       "picks), as its build trains its reference sample")
    p.add_argument("--bench", required=True, metavar="FILE",
                   help="the sampled benchmark file (fbnas bench build --sample)")
    p.add_argument("archs", nargs="*", metavar="ARCH.yaml", help="architectures of its space")
    p.add_argument("--pairs", action="append", default=[], metavar="FILE",
                   help="a duel's pair file (`fbnas bench duel`): both picks of every "
                        "finished pair (repeatable)")
    p.add_argument("--config", required=True, help="the benchmark's config (its recipe)")
    p.add_argument("--rounds", type=int, default=TIMING_ROUNDS,
                   help="timing rounds per chunk of networks")
    p.add_argument("--workers", type=int, help="train this many networks at once (Ray)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key")
    p.set_defaults(func=run)


def run(args) -> int:
    from fbnas._cli.bench.build import summary
    from fbnas.arch import Architecture
    from fbnas.bench.build import add_to_bench
    from fbnas.bench.duel import pair_picks
    from fbnas.config import load_config

    cfg = load_config(args.config, args.set)
    add = [(Architecture.load(a), a) for a in args.archs]
    for f in args.pairs:
        add += pair_picks(f, cfg.space)
    bench = add_to_bench(cfg, args.bench, add, args.rounds, args.workers)
    print(summary(args.bench, bench))
    return 0
