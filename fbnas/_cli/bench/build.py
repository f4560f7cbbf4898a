"""`fbnas bench build --config BENCH.yaml --out FILE`: train and time every network of the
config's space (resumable: run it again after a kill); with `--sample N`, a reference sample of
N networks per target band instead (a space too large to train whole), plus `--add`ed ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fbnas.bench import DEFAULT_BANDS
from fbnas.errors import FbnasError
from fbnas.settings import LATENCY_TOLERANCE, TIMING_ROUNDS

if TYPE_CHECKING:  # pragma: no cover
    from fbnas.bench.sample import SampleSpec


def add_parser(actions) -> None:
    p = actions.add_parser("build", help="train every network of the space (or a reference "
                                         "sample of it: --sample) under several seeds and time "
                                         "it end to end (resumable)")
    p.add_argument("--config", required=True, help="the benchmark's config (space, data, "
                                                    "retrain, latency)")
    p.add_argument("--bench", required=True, metavar="FILE",
                   help="the benchmark file to write (gzip'd JSON; resumed where it exists)")
    p.add_argument("--retrain-seeds", default="0,1", metavar="S1,S2,...",
                   help="the retrain.seed values every network is trained under")
    p.add_argument("--budgets", help="epochs to record, the last = retrain.epochs (default: "
                                     "a third of them and all)")
    p.add_argument("--rounds", type=int, default=TIMING_ROUNDS,
                   help="timing rounds per chunk of networks")
    p.add_argument("--limit", type=int, help="train at most this many networks now")
    p.add_argument("--workers", type=int, help="train this many networks at once, as Ray "
                                               "tasks of one thread each (pip install "
                                               "'fbnas[ray]')")
    g = p.add_argument_group("a sampled benchmark (a space too large to train every network)")
    g.add_argument("--sample", type=int, metavar="N",
                   help="train a reference sample of N networks per target band, drawn "
                        "uniformly from the networks the config's cost table predicts in it")
    g.add_argument("--targets", help="the bands' targets, as loss.target reads them (default "
                                   f"{','.join(DEFAULT_BANDS)})")
    g.add_argument("--band-width", type=float,
                   help="a band holds the networks predicted within ± this share of its "
                        f"target (default {LATENCY_TOLERANCE:g})")
    g.add_argument("--seed", type=int, help="the seed of the draw (default 0)")
    g.add_argument("--add", nargs="+", default=[], metavar="ARCH.yaml",
                   help="also train these networks (a search's or a baseline's picks); later: "
                        "fbnas bench add")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key")
    p.set_defaults(func=run)


def _ints(raw: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise FbnasError(f"{flag} {raw!r}: expected comma-separated integers") from None


def sample_spec(args) -> SampleSpec | None:
    """The `--sample` flags as a spec; a band flag without `--sample` is a one-line error."""
    from fbnas.bench.sample import SampleSpec

    if args.sample is None:
        given = [f for f, v in (("--targets", args.targets), ("--band-width", args.band_width),
                                ("--seed", args.seed), ("--add", args.add))
                 if v not in (None, [])]
        if given:
            raise FbnasError(f"{given[0]}: only for a sampled benchmark; give --sample N (the "
                             "networks per band) too")
        return None
    return SampleSpec.parse(args.sample, args.targets, args.band_width, args.seed)


def run(args) -> int:
    from fbnas.arch import Architecture
    from fbnas.bench.build import build_bench
    from fbnas.config import load_config

    spec = sample_spec(args)
    cfg = load_config(args.config, args.set)
    add = [(Architecture.load(a), a) for a in args.add]
    bench = build_bench(cfg, args.bench, _ints(args.retrain_seeds, "--retrain-seeds"),
                        _ints(args.budgets, "--budgets") if args.budgets else None,
                        args.rounds, args.limit, args.workers, sample=spec, add=add)
    print(summary(args.bench, bench))
    return 0


def summary(out: str, bench) -> str:
    done = sum(bench.complete(k) for k in bench)
    what = ""
    if bench.sampled:
        ref = bench.reference()
        what = (f" (reference sample: {sum(bench.complete(k) for k in ref)} of {len(ref)}; "
                f"added: {sum(bench.complete(k) for k in bench.added())} of "
                f"{len(bench.added())})")
    return (f"{out}: {done} networks complete{what}, {bench.meta['build_seconds']:.0f} s of "
            "building in all")
