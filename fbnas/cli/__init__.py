"""`fbnas` command line: argparse subcommands, one module per command.

Each module in COMMANDS exposes `add_parser(subparsers)`, which registers its parser and sets
`func(args) -> int`. Errors of the project's own type are printed as one line, exit status 2.
A command module imports its work (torch, the trainers) inside the function that runs it, so
parsing, `--help`, `--version` and argparse's errors import none of it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fbnas import __version__
from fbnas.errors import FbnasError

COMMANDS = ["space", "arch", "latency", "train", "sample", "plot", "retrain", "eval", "export",
            "sweep", "runs", "fidelity", "bench", "configs"]


def add_actions(sub, name: str, help: str, actions: Sequence) -> None:
    """`fbnas NAME ACTION`: a command that is a package of one module per action, each with
    `add_parser(actions)` (fbnas latency, fbnas bench)."""
    p = sub.add_parser(name, help=help)
    sp = p.add_subparsers(dest=f"{name}_command", metavar="ACTION", required=True)
    for action in actions:
        action.add_parser(sp)


def command_parser(parser: argparse.ArgumentParser,
                   args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command (and action) `args` was parsed for, whose usage an error
    about its flags is reported against."""
    names = [args.command, getattr(args, f"{args.command}_command", None)]
    for name in names:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
                   None)
        if name is None or sub is None:
            break
        parser = sub.choices[name]
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fbnas", description="Hardware-aware differentiable architecture search (FBNet).")
    parser.add_argument("--version", action="version", version=f"fbnas {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"fbnas.cli.{name}").add_parser(sub)
    return parser


def error_prefix(args: argparse.Namespace) -> str:
    """`fbnas COMMAND` or `fbnas COMMAND ACTION`: what an error line starts with."""
    action = getattr(args, f"{args.command}_command", None)
    return f"fbnas {args.command}{f' {action}' if action else ''}"


def unprefixed(message: str, args: argparse.Namespace) -> str:
    """An error message without the command name it may start with (the library names the
    command it was called for; the error line names it once)."""
    action = getattr(args, f"{args.command}_command", None)
    full = f"fbnas {args.command}{f' {action}' if action else ''} "
    if message.startswith(full):  # "fbnas sweep --workers 2 needs Ray": the flag is the subject
        return message[len(full):]
    for head in ([f"{args.command} {action}", action] if action else []) + [args.command]:
        for sep in (": ", ", "):
            if message.startswith(f"{head}{sep}"):
                return message[len(head) + len(sep):]
    return message


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # against the usage of the command that was given them, not fbnas's
        command_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.func(args) or 0)
    except FbnasError as e:
        print(f"{error_prefix(args)}: error: {unprefixed(str(e), args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fbnas {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
