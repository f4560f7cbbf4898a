"""Which fbnas code made a file: the commit of the git checkout fbnas is imported from (where
there is one), the version, and a hash of the package's sources, which names the same code
wherever it sits (a Ray worker checks it against its driver's: `driver_code`, `worker_env`)."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import fbnas
from fbnas.errors import FbnasError

PACKAGE = Path(fbnas.__file__).resolve().parent  # the fbnas this process imports


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """sha256 over the package's .py files (relative path and bytes, in path order), as they
    are on disk when first asked."""
    h = hashlib.sha256()
    for f in sorted(PACKAGE.rglob("*.py")):
        h.update(f.relative_to(PACKAGE).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE.parent), *args], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> dict[str, Any] | None:
    """{"commit": sha, "describe": `git describe --always --dirty`, "dirty": whether the
    package's tracked files differ from it} of the checkout whose top is the folder holding
    the imported package; None outside one (an installed wheel) or without git."""
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != PACKAGE.parent:
        return None
    sha = _git("rev-parse", "HEAD")
    if sha is None:
        return None
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", PACKAGE.name)
    return {"commit": sha, "describe": _git("describe", "--always", "--dirty", "--abbrev=12"),
            "dirty": bool(changed)}


def code_record() -> dict[str, Any]:
    """What a file records of the code that made it: version, commit (None outside a git
    checkout), whether the package had uncommitted changes, and the sources' hash."""
    git = git_commit() or {}
    return {"fbnas": fbnas.__version__, "commit": git.get("commit"),
            "describe": git.get("describe"), "dirty": git.get("dirty"),
            "source_hash": source_hash()}


def describe_code(rec: dict[str, Any] | None) -> str:
    """One phrase for a code record: 'commit 2c21910abcde (fbnas 0.1.0)', '... with local
    changes', or the version alone."""
    if not rec:
        return "unrecorded code"
    ver = f"fbnas {rec.get('fbnas', '?')}"
    if not rec.get("commit"):
        return f"{ver} (no git commit recorded; sources {str(rec.get('source_hash'))[:12]})"
    dirty = " with local changes" if rec.get("dirty") else ""
    return f"commit {rec['commit'][:12]}{dirty} ({ver})"


def check_same_code(expected: dict[str, Any], what: str) -> None:
    """Raise a one-line error when this process imports other fbnas sources than `expected`
    (a `code_record` of the process that sent the work, plus its "package" path)."""
    if source_hash() == expected.get("source_hash"):
        return
    raise FbnasError(
        f"{what}: this worker imports fbnas from {PACKAGE} (sources {source_hash()[:12]}), "
        f"not the code of the process that started it ({expected.get('package')}, sources "
        f"{str(expected.get('source_hash'))[:12]}); start it where both import the same "
        "fbnas (`python -m fbnas` from the checkout's root, or PYTHONPATH=<checkout>)")


# ---- Ray workers running this same code (fbnas sweep, fbnas bench build) ----------------------
def import_ray(what: str) -> Any:
    """The `ray` module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise FbnasError(f"{what} needs Ray: pip install 'fbnas[ray]'") from None
    return ray


def worker_env() -> dict[str, Any]:
    """The runtime_env of a local Ray this process starts: the workers' PYTHONPATH led by the
    folder this process imports fbnas from. Ray also puts the driver's working folder first on
    a worker's path, so a worker started from another checkout's root imports that one's
    fbnas: `check_same_code` (each task's first step) refuses that in one line."""
    path = [str(PACKAGE.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(path)}}


def driver_code() -> dict[str, Any]:
    """What a task checks its worker's fbnas against (`check_same_code`)."""
    return {"source_hash": source_hash(), "package": str(PACKAGE)}
