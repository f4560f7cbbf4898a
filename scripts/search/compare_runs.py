"""Does a change keep search results bit-identical? The same `fbnas train` under two or more
checkouts (each imported from its own folder), then θ and every epoch's figures compared
exactly (wall-clock seconds aside).

    git worktree add /tmp/base af3d295    # the commit before fbnas/ was regrouped by concern
    python -m scripts.search.compare_runs --code /tmp/base --code . \\
        --config configs/quickstart.yaml --modes full,two_path,reinforce --set latency.cost=flops

Every checkout runs the same config file (--config, read from here), so a checkout older than a
key that file sets refuses it and the comparison stops with that checkout's error (the shipped
quickstart sets `search.weights`, `search.mode: reinforce` and `search.uniform_paths`, which
checkouts before a167aba and a1b5f2d do not know). Compare such a checkout on a config it
reads, e.g. its own: `--config /tmp/base/configs/quickstart.yaml` (a newer checkout reads an
older config unless a key it sets was removed since: this one reads 114c361's quickstart).

Prints, per mode, `identical` or the first field that differs, and exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from scripts.common import QUIET, with_code


def run_search(code: Path, config: str, sets: list[str], run_dir: Path) -> dict:
    """θ and history of one search run by the fbnas found in `code` (a child process whose
    PYTHONPATH names it)."""
    cmd = [sys.executable, "-m", "fbnas", "train", "--config", config,
           *[a for s in [f"run.dir={run_dir}", *QUIET, *sets] for a in ("--set", s)]]
    done = subprocess.run(cmd, env=with_code(code), cwd=code, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{code}: fbnas train failed ({done.returncode}):\n{done.stderr[-2000:]}")
    theta = json.loads((run_dir / "theta.json").read_text())["theta"]
    history = json.loads((run_dir / "history.json").read_text())
    for rec in history:
        rec.pop("seconds", None)
    arch = yaml.safe_load((run_dir / "arch_hard.yaml").read_text())
    arch.get("meta", {}).pop("run", None)  # the run directory differs by construction
    arch.get("meta", {}).pop("search_cost", None)  # wall-clock seconds and trainings
    return {"theta": theta, "history": history, "arch": arch}


def first_difference(a, b, path: str = "") -> str | None:
    """Where two JSON values first differ (exactly), or None."""
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return f"{path}.{k}: present on one side only"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", action="append", required=True, type=Path,
                    help="a checkout to run (give two or more; the first is the reference)")
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--modes", default="full,two_path,reinforce")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    if len(args.code) < 2:
        ap.error("give --code at least twice")
    config = str(Path(args.config).resolve())
    print(f"{config} for every checkout; --set {' '.join(args.set) or '(none)'}", flush=True)
    differ = 0
    with tempfile.TemporaryDirectory(prefix="fbnas-compare-") as tmp:
        for mode in args.modes.split(","):
            sets = [*args.set, f"search.mode={mode}"]
            ref = None
            for i, code in enumerate(args.code):
                got = run_search(code, config, sets, Path(tmp) / f"{mode}-{i}")
                if ref is None:
                    ref = got
                    continue
                d = first_difference(ref, got)
                differ += d is not None
                print(f"{mode}: {args.code[0]} vs {code}: {'identical' if d is None else d}",
                      flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
