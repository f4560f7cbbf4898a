"""`fbnas configs`: the configs that ship with fbnas, and a copy of one to edit."""

from __future__ import annotations

import os
from pathlib import Path

from fbnas.errors import FbnasError
from fbnas.io import (
    config_summary,
    read_text,
    shipped_config,
    shipped_configs,
    write_text_atomic,
)


def add_parser(sub) -> None:
    p = sub.add_parser("configs", help="list the shipped configs; copy one out to edit",
                       description="The configs installed with fbnas. Any command's --config "
                       "takes one by name (--config quickstart) from any folder.")
    sp = p.add_subparsers(dest="configs_command", metavar="ACTION")
    sp.add_parser("list", help="one line per shipped config (the default)")
    c = sp.add_parser("copy", help="write a shipped config to a file, to edit and run")
    c.add_argument("name", help="a shipped config's name (fbnas configs lists them)")
    c.add_argument("file", help="the file to write (refused if it exists, unless --force)")
    c.add_argument("--force", action="store_true", help="overwrite FILE")
    p.set_defaults(func=run)


def run(args) -> int:
    shipped = shipped_configs()
    if args.configs_command == "copy":
        source = shipped_config(args.name)
        if source is None:
            raise FbnasError(f"no shipped config {args.name!r} (shipped: "
                             f"{', '.join(shipped)})")
        dest = Path(args.file)
        if dest.is_dir():
            dest = dest / source.name
        if dest.exists() and not args.force:
            raise FbnasError(f"{dest} exists (--force overwrites it)")
        write_text_atomic(dest, read_text(source))
        print(f"written: {dest}  (fbnas train --config {os.fspath(dest)})")
        return 0
    width = max(map(len, shipped), default=0)
    for name, path in shipped.items():
        print(f"{name:<{width}}  {config_summary(path)}")
    return 0
