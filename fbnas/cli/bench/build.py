"""`fbnas bench build --config BENCH.yaml --out FILE`: train and time every network of the
config's space (resumable: run it again after a kill)."""

from __future__ import annotations

from fbnas.bench.build import build_bench
from fbnas.config import load_config
from fbnas.errors import FbnasError


def add_parser(actions) -> None:
    p = actions.add_parser("build", help="train every network of the space under several "
                                         "seeds and time it end to end (resumable)")
    p.add_argument("--config", required=True, help="the benchmark's config (space, data, "
                                                    "retrain, latency)")
    p.add_argument("--out", required=True, help="the benchmark file to write (gzip'd JSON)")
    p.add_argument("--seeds", default="0,1", help="retrain.seed values (default 0,1)")
    p.add_argument("--budgets", help="epochs to record, the last = retrain.epochs (default: "
                                     "a third of them and all)")
    p.add_argument("--rounds", type=int, default=30, help="timing rounds per chunk of networks")
    p.add_argument("--limit", type=int, help="train at most this many networks now")
    p.add_argument("--workers", type=int, help="train this many networks at once, as Ray "
                                               "tasks of one thread each (pip install "
                                               "'fbnas[ray]')")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key")
    p.set_defaults(func=run)


def _ints(raw: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise FbnasError(f"{flag} {raw!r}: expected comma-separated integers") from None


def run(args) -> int:
    cfg = load_config(args.config, args.set)
    bench = build_bench(cfg, args.out, _ints(args.seeds, "--seeds"),
                        _ints(args.budgets, "--budgets") if args.budgets else None,
                        args.rounds, args.limit, args.workers)
    done = sum(bench.complete(k) for k in bench)
    print(f"{args.out}: {done} networks complete, {bench.meta['build_seconds']:.0f} s of "
          "building in all")
    return 0
