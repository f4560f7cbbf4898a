"""The memory allocator a CPU table is measured under: its names, library and environment.

At batch 1 a block with big activations spends more time in the allocator than in its
arithmetic: an `ir_k5_e6` block at 112x112 makes 4.8 MB intermediates, and glibc's defaults
serve each of them with fresh pages (mmap, or heap memory trimmed back to the kernel after the
last call), so every call page-faults its tensors in again. How much of that a block pays
depends on what ran before it, so a block timed alone and the same block inside a network
disagree, by up to 2x (docs/latency.md has the figures). The allocator is therefore part of
what a latency table measures, recorded in its meta like the thread count:

- `system`: the process as started (glibc's defaults, or whatever the user preloaded);
  timed in this process.
- `retain`: glibc with `MALLOC_MMAP_THRESHOLD_` = 32 MiB (its maximum) and
  `MALLOC_TRIM_THRESHOLD_` = 1 GiB, so freed memory stays in the process and is reused, as an
  inference server tuned per PyTorch's CPU performance guide does.
- `jemalloc`, `tcmalloc`: the library preloaded (`LD_PRELOAD`); found in the usual library
  folders, or named by path (`latency.allocator: /opt/lib/libjemalloc.so.2`).

An allocator is chosen when a process starts, so every setting but `system` runs the timing
in a worker process started with that environment (`fbnas.backends.worker`).
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import sys
from pathlib import Path
from typing import Any

from fbnas.errors import FbnasError

SYSTEM = "system"
ALLOCATORS = ("system", "retain", "jemalloc", "tcmalloc")
DEFAULT = "retain"
RETAIN_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
WORKER_ENV = "FBNAS_ALLOCATOR_WORKER"
LIBRARIES = {"jemalloc": ("jemalloc",), "tcmalloc": ("tcmalloc", "tcmalloc_minimal")}
INSTALL = {"jemalloc": "apt install libjemalloc2, or conda install jemalloc",
           "tcmalloc": "apt install libgoogle-perftools4, or conda install gperftools"}


def _search_dirs() -> list[str]:
    dirs = [os.path.join(p, "lib") for p in (sys.prefix, os.environ.get("CONDA_PREFIX"))
            if p]
    return dirs + ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                   "/usr/lib", "/usr/local/lib", "/opt/homebrew/lib"]


def find_library(kind: str) -> str | None:
    """Path of the jemalloc / tcmalloc shared library, or None when it is not installed."""
    for stem in LIBRARIES[kind]:
        for d in _search_dirs():
            hits = sorted(glob.glob(os.path.join(d, f"lib{stem}.so*")))
            if hits:
                return hits[0]
        found = ctypes.util.find_library(stem)
        if found:
            return found
    return None


def resolve(name: str | None, where: str = "latency.allocator") -> tuple[str, str | None]:
    """(allocator name, library path or None) for a config or flag value: one of ALLOCATORS
    or a path to a jemalloc / tcmalloc library. One-line error naming `where` otherwise."""
    name = DEFAULT if name is None else str(name)
    if name in ("system", "retain"):
        return name, None
    if name in LIBRARIES:
        lib = find_library(name)
        if lib is None:
            raise FbnasError(f"{where}: {name} is not installed (no lib{name}.so in "
                             f"{', '.join(_search_dirs()[:3])}, ...); install it "
                             f"({INSTALL[name]}), give its path, or choose one of "
                             f"{', '.join(ALLOCATORS)}")
        return name, lib
    if "/" in name or name.endswith(".so") or ".so." in name:
        kind = next((k for k in LIBRARIES if k in Path(name).name), None)
        if kind is None or not Path(name).is_file():
            raise FbnasError(f"{where}: {name!r} is not a jemalloc or tcmalloc library file; "
                             f"choose one of {', '.join(ALLOCATORS)} or give such a path")
        return kind, str(Path(name).resolve())
    raise FbnasError(f"{where}: unknown allocator {name!r}; choose one of "
                     f"{', '.join(ALLOCATORS)} (or the path of a jemalloc / tcmalloc library)")


def environment(name: str, library: str | None) -> dict[str, str]:
    """The environment variables a worker for this allocator starts with."""
    if name == "retain":
        return dict(RETAIN_ENV)
    if name in LIBRARIES:
        pre = os.environ.get("LD_PRELOAD", "")
        return {"LD_PRELOAD": f"{library}{' ' + pre if pre else ''}"}
    return {}


def describe(name: str, library: str | None) -> dict[str, Any]:
    """What a table records: the allocator, and the process settings that shape it."""
    d: dict[str, Any] = {"allocator": name}
    env = {**{k: v for k, v in os.environ.items()
              if k.startswith("MALLOC_") or k in ("LD_PRELOAD", "GLIBC_TUNABLES")},
           **environment(name, library)}
    if env:
        d["allocator_env"] = dict(sorted(env.items()))
    return d
