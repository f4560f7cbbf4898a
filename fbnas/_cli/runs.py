"""`fbnas runs [DIR ...]`: every retrain run's results.json as one table, sortable by any column."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import textwrap
from pathlib import Path

from fbnas.errors import FbnasError
from fbnas.runs.index import (
    COLUMNS,
    DEFAULT_COLUMNS,
    DESCENDING,
    check_column,
    columns_for,
    find_results,
    format_table,
    parse_columns,
    records,
    select_rows,
)
from fbnas.runs.results import load_results

DEFAULT_DIR = "runs"

EPILOG = f"""\
{textwrap.fill('columns: ' + ', '.join(COLUMNS), 92, subsequent_indent='  ')}
{textwrap.fill('default columns: ' + ', '.join(DEFAULT_COLUMNS), 92, subsequent_indent='  ')}
  and each FMT_QUANT_top1 / FMT_QUANT_us column (an exported program's test top-1 and
  latency, e.g. pte_int8_top1) that some run has: `fbnas export` records a program written
  into the run folder, `fbnas eval --model` its accuracy, `fbnas latency measure --model` its
  latency.

Sorting is numeric for numbers; runs missing the sort value come last either way. Without
--asc/--desc, {', '.join(sorted(DESCENDING))} sort high-to-low and every other column
low-to-high. Column 'front' marks with * the runs on the Pareto front of latency (measured,
else predicted) against top-1 accuracy, among the runs listed (after --space, before --top).
--format csv/json give raw values (top1 as a fraction, params and flops as counts, missing =
empty / null); table gives the formatted ones.

A results.json found in a DIR that cannot be read is skipped with a warning naming it; a
results.json file named on the command line that cannot be read is an error (status 2).
Finding no results at all is not an error: a one-line message on stderr and exit status 0
(csv and json still print their empty header / []). A DIR given that does not exist is an
error (status 2), except the default '{DEFAULT_DIR}'."""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "runs", help="table of retrain results (results.json), sortable by any column",
        description="List the results.json of every run under the DIRs (searched recursively) "
                    "as one table.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="*", metavar="DIR",
                   help=f"run folders (searched recursively) or results.json files "
                        f"(default: {DEFAULT_DIR})")
    p.add_argument("--sort", default="top1", metavar="COL", help="column to sort by (default top1)")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--asc", dest="descending", action="store_const", const=False,
                       help="sort low-to-high")
    order.add_argument("--desc", dest="descending", action="store_const", const=True,
                       help="sort high-to-low")
    p.add_argument("--columns", metavar="A,B,C", help="columns to show, comma-separated")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table",
                   help="output format (default table)")
    p.add_argument("--space", metavar="NAME", help="only runs of this search space")
    p.add_argument("--top", type=int, metavar="N", help="only the first N runs after sorting")
    p.set_defaults(func=run, descending=None)


def run(args) -> int:
    check_column(args.sort, "sort column")
    cols = parse_columns(args.columns) if args.columns is not None else None
    if args.top is not None and args.top < 1:
        raise FbnasError(f"--top must be >= 1, got {args.top}")
    dirs = list(args.dirs) or [DEFAULT_DIR]
    files = find_results(dirs, missing_ok=not args.dirs)
    named = {Path(d).resolve() for d in args.dirs if Path(d).is_file()}
    rows = []
    for f in files:
        try:
            rows.append(load_results(f))
        except FbnasError as e:
            if f.resolve() in named:
                raise  # a file asked for by name: its error is the answer
            print(f"fbnas runs: warning: skipped {e}", file=sys.stderr)
    where = " ".join(dirs)
    if not rows:
        print(f"fbnas runs: no {'readable ' if files else ''}results.json under {where}",
              file=sys.stderr)
    elif args.space is not None:
        total = len(rows)
        rows = [r for r in rows if r.get("space") == args.space]
        if not rows:
            print(f"fbnas runs: none of the {total} results under {where} is of space "
                  f"{args.space!r}", file=sys.stderr)
    if cols is None:
        cols = columns_for(rows)
    if args.format == "table":
        if rows:
            print(format_table(rows, args.sort, args.descending, cols, args.top))
            shown = len(rows) if args.top is None else min(args.top, len(rows))
            legend = "; * = Pareto front of latency vs top1" if "front" in cols else ""
            print(f"{shown} of {len(rows)} runs, sorted by {args.sort}{legend}")
        return 0
    recs = records(select_rows(rows, args.sort, args.descending, args.top), cols)
    if args.format == "json":
        print(json.dumps(recs, indent=1))
    else:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(cols)
        for r in recs:
            w.writerow([_csv(r[c]) for c in cols])
    return 0


def _csv(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
