"""`fbnas latency build`: measure a table's missing entries for a search space (or count them:
--cost flops / params)."""

from __future__ import annotations

import sys
from pathlib import Path

from fbnas._cli.latency.common import log, protocol, timer, timer_args
from fbnas.errors import FbnasError
from fbnas.latency.kinds import COST_KINDS
from fbnas.settings import CONTEXT_PROBES


def run(args) -> int:
    from fbnas.latency.build import build_table, check_extend, context_text
    from fbnas.latency.counted import build_cost_table
    from fbnas.latency.table import LatencyTable
    from fbnas.search_space import load_space

    space = load_space(args.config)
    out = Path(args.table)
    table = None
    if out.exists() and not args.fresh:
        table = LatencyTable.load(out)
        if table.cost != args.cost:
            raise FbnasError(f"{out}: holds a {table.cost} table, but --cost is {args.cost} "
                             "(pick another --out, or --fresh to overwrite)")
    if COST_KINDS.get(args.cost).counted:
        n0 = len(table) if table is not None else 0
        table = build_cost_table(space, args.cost, table)
        table.save(out)
        print(f"{out}: {args.cost} table, {len(table) - n0} new entries, {len(table)} in all")
        return 0
    t = timer(args, table, args.config)
    proto = protocol(args)
    if table is not None:
        missing = len(table.missing(space))
        check_extend(table, t, str(out))  # before saying anything about extending it
        log(f"{out}: extending/resuming a table with {len(table)} entries; "
            f"{missing} missing for '{space.name}'")
    try:
        table = build_table(space, t, proto, table=table, out=out,
                            context_probes=args.probes, progress=not args.quiet, log=log)
    except KeyboardInterrupt:
        print(f"fbnas latency build: interrupted; finished chunks are in {out} — run the same "
              "command again to resume", file=sys.stderr)
        return 130
    n = table.noise or {}
    print(f"{out}: {len(table)} entries on {table.meta.get('device_name')} "
          f"({table.meta.get('threads')} thread(s), batch {table.meta.get('batch')}, "
          f"{table.meta.get('dtype')}); spread IQR/median: median "
          f"{100 * (n.get('median_rel_iqr') or 0):.1f}%, "
          f"p90 {100 * (n.get('p90_rel_iqr') or 0):.1f}%; "
          f"{context_text(table)}")
    return 0


def add_parser(actions) -> None:
    b = actions.add_parser("build", help="measure a table's missing entries for a search space")
    b.add_argument("--config", required=True, help="config file with a 'space:' section")
    b.add_argument("--table", required=True, metavar="FILE",
                   help="the table file to write (extended, or resumed, where it exists)")
    b.add_argument("--cost", default="latency", choices=COST_KINDS.choices(),
                   help="what to tabulate (flops and params need no device)")
    b.add_argument("--probes", type=int, default=CONTEXT_PROBES,
                   help="child networks timed to fit the in-network context model (0: none)")
    b.add_argument("--fresh", action="store_true", help="ignore an existing --table file")
    b.add_argument("--quiet", action="store_true", help="no progress output")
    timer_args(b)
    b.set_defaults(func=run)
