"""`fbnas` command line: argparse subcommands, one module per command.

Each module in COMMANDS exposes `add_parser(subparsers)`, which registers its parser and sets
`func(args) -> int`. Errors of the project's own type are printed as one line, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fbnas import __version__
from fbnas.errors import FbnasError

COMMANDS = ["space", "arch", "latency", "train", "sample", "plot", "retrain", "eval", "export",
            "sweep", "runs", "fidelity", "bench"]


def add_actions(sub, name: str, help: str, actions: Sequence) -> None:
    """`fbnas NAME ACTION`: a command that is a package of one module per action, each with
    `add_parser(actions)` (fbnas latency, fbnas bench)."""
    p = sub.add_parser(name, help=help)
    sp = p.add_subparsers(dest=f"{name}_command", metavar="ACTION", required=True)
    for action in actions:
        action.add_parser(sp)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fbnas", description="Hardware-aware differentiable architecture search (FBNet).")
    parser.add_argument("--version", action="version", version=f"fbnas {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"fbnas.cli.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except FbnasError as e:
        print(f"fbnas {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fbnas {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
