"""`fbnas latency import`: a bundle's results.json (measured on the device by the bundle's
runner) as a latency table."""

from __future__ import annotations


def run(args) -> int:
    from fbnas.latency.build import context_text
    from fbnas.latency.bundle import import_results
    from fbnas.search_space import load_space

    space = load_space(args.config) if args.config else None
    table = import_results(args.results, space)
    table.save(args.table)
    print(f"{args.table}: {len(table)} entries from {args.results} on "
          f"{table.meta.get('device_name')} ({table.meta.get('threads')} thread(s)); "
          f"{context_text(table)}")
    return 0


def add_parser(actions) -> None:
    im = actions.add_parser("import", help="turn a bundle's results.json into a latency table")
    im.add_argument("results", help="results.json written by the bundle's run_bundle.py")
    im.add_argument("--table", required=True, metavar="FILE", help="the table file to write")
    im.add_argument("--config", help="check the table covers this config's space")
    im.set_defaults(func=run)
