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


# The flags that name one kind of thing in every command, and how their value is written:
# an object is passed by the same flag wherever a command reads (or writes) it, `--out` is
# always a folder, `--targets` / `--seeds` / `--retrain-seeds` always lists, `--seed` the seed
# of a random draw (docs/concepts.md, "The command line").
VOCABULARY = {
    "--config": "CONFIG",        # a config file, or a shipped config's name
    "--arch": "ARCH.yaml",       # architecture file(s)
    "--table": "FILE",           # a latency (cost) table file
    "--bench": "FILE",           # a benchmark file (`fbnas bench build`)
    "--model": "FILE",           # an exported program or a retrain checkpoint
    "--json": "FILE",            # the figures written as JSON
    "--out": "DIR",              # the folder written into
    "--targets": "T1,T2,...",    # latency targets, as loss.target reads them
    "--seeds": "S1,S2,...",      # search seeds (search.seed)
    "--retrain-seeds": "S1,S2,...",  # the seeds networks are trained under (retrain.seed)
    "--seed": "N",               # the seed of a random draw
    "--set": "KEY=VALUE",        # a config override (repeatable)
}


def _normalize(parser: argparse.ArgumentParser, where: str) -> None:
    """Give every flag of VOCABULARY its one metavar in `parser` and its subparsers; a command
    that writes another one is a programming error, said at once."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                _normalize(sp, f"{where} {name}")
        for flag in a.option_strings:
            want = VOCABULARY.get(flag)
            if want is None:
                continue
            if a.metavar not in (None, want):
                raise AssertionError(f"{where} {flag}: metavar {a.metavar!r}, the CLI's is "
                                     f"{want!r}")
            a.metavar = want


class HelpFormatter(argparse.HelpFormatter):
    """Help that shows every flag's default where the flag has one its help does not state."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or "default" in text
                or action.default in (None, False, [], argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """fbnas's parsers (every command's and action's: subparsers take their parent's class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


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
    parser = Parser(
        prog="fbnas", description="Hardware-aware differentiable architecture search (FBNet).")
    parser.add_argument("--version", action="version", version=f"fbnas {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"fbnas._cli.{name}").add_parser(sub)
    _normalize(parser, "fbnas")
    return parser


def error_prefix(args: argparse.Namespace) -> str:
    """`fbnas COMMAND` or `fbnas COMMAND ACTION`: what an error line starts with."""
    action = getattr(args, f"{args.command}_command", None)
    return f"fbnas {args.command}{f' {action}' if action else ''}"


def unprefixed(message: str, args: argparse.Namespace) -> str:
    """An error message without the command name it may start with (the library names the
    command it was called for; the error line names it once)."""
    action = getattr(args, f"{args.command}_command", None)
    full = f"{error_prefix(args)} "
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
