"""`fbnas latency predict`: an architecture's cost from a table (raw, and calibrated or
corrected where the table stores those)."""

from __future__ import annotations

from fbnas._cli.latency.common import fmt
from fbnas.settings import COST_MODELS


def run(args) -> int:
    from fbnas.arch import Architecture
    from fbnas.latency.signature import arch_signatures
    from fbnas.latency.table import LatencyTable
    from fbnas.search_space import load_space

    table = LatencyTable.load(args.table)
    space = load_space(args.config) if args.config else None
    for path in args.arch:
        arch = Architecture.load(path)
        if space is not None:
            arch.check_fits(space, path)
        total = table.predict(arch, "raw")
        print(f"{arch.name} [{arch.short_hash}] {path}: {fmt(total, table).strip()} "
              f"{table.unit} (table)")
        if args.cost_model != "raw":
            adj = table.predict(arch, args.cost_model, space)
            if adj != total:
                print(f"  {args.cost_model}: {fmt(adj, table).strip()} {table.unit}")
        if args.verbose:
            for s in arch_signatures(arch):
                print(f"    {s.key():40s} {fmt(table.value(s), table)}")
    return 0


def add_parser(actions) -> None:
    r = actions.add_parser("predict", help="predict an architecture's cost from a table")
    r.add_argument("--arch", required=True, nargs="+", help="architecture YAML file(s)")
    r.add_argument("--table", required=True, help="table file")
    r.add_argument("--config", help="the search space (needed for its corrections)")
    r.add_argument("--cost-model", default="auto", choices=COST_MODELS,
                   help="also print the calibrated or corrected estimate (default: best stored)")
    r.add_argument("-v", "--verbose", action="store_true", help="per-entry breakdown")
    r.set_defaults(func=run)
