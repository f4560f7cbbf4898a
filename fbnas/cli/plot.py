"""`fbnas plot RUN_DIR`: PNGs of θ (final heatmap, evolution) and loss/cost curves."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="write PNG plots of a search run")
    p.add_argument("run_dir")
    p.add_argument("--out", help="output folder (default RUN_DIR/plots)")
    p.set_defaults(func=run)


def run(args) -> int:
    from fbnas.plots import plot_run

    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0
