"""`fbnas latency validate`: a table against end-to-end measurements of sampled child
networks (rank agreement, calibration, optionally per-(layer, op) corrections)."""

from __future__ import annotations

from pathlib import Path

from fbnas._cli.latency.common import log, protocol, timer, timer_args
from fbnas.io import write_json_atomic

# the protocol settings a validation takes over from the table it checks
TABLE_PROTOCOL = ("rounds", "sample_s", "ref_sample_s", "ref_every", "warmup_s", "max_rel_iqr",
                  "extra_rounds", "reference")


def run(args) -> int:
    from fbnas.latency.table import LatencyTable
    from fbnas.latency.validate import (
        apply_report,
        plot_report,
        public_report,
        summary_lines,
        validate,
    )
    from fbnas.search_space import load_space

    space = load_space(args.config)
    table = LatencyTable.load(args.table)
    table.require(space, args.config)
    others = [LatencyTable.load(f) for f in args.also or []]
    for o in others:
        o.require(space, args.config)
    t = timer(args, table, args.config)
    proto = protocol(args, {k: v for k, v in (table.protocol or {}).items()
                            if k in TABLE_PROTOCOL})
    if args.rounds is None:
        proto.rounds = max(10, proto.rounds // 2)
    # progress: a bar on a terminal, else a plain line every 30 s (MeasureProgress)
    rep = validate(space, table, t, n=args.n, seed=args.seed, protocol=proto,
                   repeats=args.repeats, corrections=args.corrections, log=log,
                   progress=not args.quiet, others=others)
    for line in summary_lines(rep):
        print(line)
    out = args.json or str(Path(args.table).with_suffix("")) + ".validate.json"
    write_json_atomic(out, public_report(rep))
    print(f"report: {out}")
    if args.plot:
        plot_report(rep, args.plot)
        print(f"plot: {args.plot}")
    if args.save:
        apply_report(table, space, rep)
        table.save(args.table)
        print(f"{args.table}: calibration{' and corrections' if args.corrections else ''} "
              "stored")
    return 0


def add_parser(actions) -> None:
    v = actions.add_parser("validate", help="compare a table with end-to-end measurements")
    v.add_argument("--config", required=True, help="config file with a 'space:' section")
    v.add_argument("--table", required=True, help="latency table file")
    v.add_argument("-n", type=int, default=50, help="architectures to sample (default 50)")
    v.add_argument("--seed", type=int, default=0, help="the seed of the architectures drawn")
    v.add_argument("--repeats", type=int, default=2,
                   help="independent end-to-end passes (>= 2 reports repeat agreement)")
    v.add_argument("--corrections", action="store_true",
                   help="also fit per-(layer, op) corrections on the calibrated table "
                        "(TuNAS-style; cost model `corrected`)")
    v.add_argument("--save", action="store_true",
                   help="store the calibration (and corrections) in the table file")
    v.add_argument("--json", metavar="FILE", help="the report (default: TABLE.validate.json)")
    v.add_argument("--also", nargs="+", metavar="TABLE",
                   help="other tables of the space (e.g. the fp32 table of an int8 --table): "
                        "how each ranks the same measured networks, and its entries / the "
                        "table's per op (the int8 speed-up per op)")
    v.add_argument("--plot", help="write a predicted-vs-measured scatter PNG here")
    v.add_argument("--quiet", action="store_true", help="no progress output")
    timer_args(v)
    v.set_defaults(func=run)
