"""The memory allocator a CPU table is measured under, and the worker process that sets it.

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
(the table build, the validation, end-to-end measurements) in a worker process started with
that environment: `@under_allocator` on a function whose arguments include a timer ships the
call to such a worker (log lines come back as they are written) unless this process already is
one.
"""

from __future__ import annotations

import ctypes.util
import functools
import glob
import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def in_worker(name: str) -> bool:
    return os.environ.get(WORKER_ENV) == name


@contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_PIPE = None  # the worker's end of the pipe to its parent


def _send_log(msg: str) -> None:
    _PIPE.send(("log", msg))


def _worker(conn, fn: Callable, args: tuple, kwargs: dict) -> None:
    global _PIPE
    _PIPE = conn
    try:
        conn.send(("ok", fn(*args, **kwargs)))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        try:
            conn.send(("error", e))
        except Exception:  # noqa: BLE001 - an exception that cannot be sent
            conn.send(("error", FbnasError(f"timing worker: {type(e).__name__}: {e}")))
    finally:
        conn.close()


def call_in_worker(name: str, library: str | None, fn: Callable, args: tuple, kwargs: dict,
                   log: Callable[[str], None] | None = None) -> Any:
    """Run `fn(*args, **kwargs)` in a fresh process started under allocator `name`; return
    its result, or raise its exception. `log` receives the worker's log lines as they come."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    with _environ({**environment(name, library), WORKER_ENV: name}):
        proc = ctx.Process(target=_worker, args=(send, fn, args, kwargs), daemon=True)
        proc.start()
    send.close()
    try:
        while True:
            try:
                kind, payload = recv.recv()
            except EOFError:
                proc.join(10)
                raise FbnasError(f"timing worker ({name} allocator) ended without a result "
                                 f"(exit code {proc.exitcode})") from None
            if kind == "log":
                (log or (lambda s: print(s, file=sys.stderr)))(payload)
            elif kind == "ok":
                return payload
            else:
                raise payload
    except KeyboardInterrupt:
        proc.join(10)  # Ctrl-C reached the worker too: let it save what it finished
        raise
    finally:
        recv.close()
        proc.join(10)
        if proc.is_alive():
            proc.terminate()


def under_allocator(fn: Callable) -> Callable:
    """Run `fn` where its timer's allocator holds: here for `system` (or inside a worker for
    it), else in a worker process (see `call_in_worker`). The timer is the first argument with
    an `allocator` attribute. Arguments are sent to the worker, so must be serialisable;
    prepared runnables are passed as None (the worker prepares its own reference op), a `log`
    keyword is forwarded from the worker line by line, and a `progress` callback is not (a
    progress bar in the worker writes to stderr).
    What `fn` changes in its arguments stays in the worker: use its return value."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        timer = kwargs.get("timer") or next(
            (a for a in args if hasattr(a, "allocator") and hasattr(a, "sample")), None)
        name = getattr(timer, "allocator", SYSTEM)
        if name == SYSTEM or in_worker(name):
            return fn(*args, **kwargs)
        from fbnas.latency.timers import Runnable  # (timers imports this module)

        # A prepared runnable (the reference op) belongs to this process: the worker makes its
        # own. Callbacks do not cross either, except `log`, forwarded line by line.
        args = tuple(None if isinstance(a, Runnable) else a for a in args)
        kwargs = {k: None if isinstance(v, Runnable) else v for k, v in kwargs.items()}
        log = kwargs.get("log")
        if callable(log):
            kwargs["log"] = _send_log
        if callable(kwargs.get("progress")):
            kwargs["progress"] = None
        return call_in_worker(name, timer.allocator_library, wrapper, args, kwargs, log)

    return wrapper
