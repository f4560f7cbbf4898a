"""The worker process a timing runs in when its allocator is not this process's.

An allocator is chosen when a process starts, so every allocator setting but `system` runs the
timing (the table build, the validation, end-to-end measurements) in a worker process started
with that environment (`fbnas.backends.allocator.environment`): `@under_allocator` on a
function whose arguments include a timer ships the call to such a worker (log lines come back
as they are written) unless this process already is one.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fbnas.backends.allocator import SYSTEM, WORKER_ENV, environment
from fbnas.backends.base import Runnable
from fbnas.errors import FbnasError


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


def _exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """Watch the parent from a daemon thread and end this process once it is gone (a parent
    killed outright runs no cleanup, and an orphaned timing would hold a core for minutes)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="fbnas-parent-watch", daemon=True).start()


def _serve(conn, parent: int) -> None:
    """The worker's loop: run each (fn, args, kwargs) the parent sends and send back its
    result or exception, until the parent sends None or goes away."""
    global _PIPE
    _PIPE = conn
    _exit_with_parent(parent)
    try:
        while True:
            try:
                job = conn.recv()
            except EOFError:
                return
            if job is None:
                return
            fn, args, kwargs = job
            try:
                conn.send(("ok", fn(*args, **kwargs)))
            except Exception as e:  # noqa: BLE001 - every failure goes back to the parent
                _send_error(conn, e)
            except BaseException as e:  # Ctrl-C: report it, and end
                _send_error(conn, e)
                return
    finally:
        conn.close()


def _send_error(conn, e: BaseException) -> None:
    try:
        conn.send(("error", e))
    except Exception:  # noqa: BLE001 - an exception that cannot be sent
        conn.send(("error", FbnasError(f"timing worker: {type(e).__name__}: {e}")))


class _Worker:
    """A spawned process started under allocator `name`'s environment, serving calls."""

    def __init__(self, name: str, library: str | None):
        self.name = name
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe(duplex=True)
        with _environ({**environment(name, library), WORKER_ENV: name}):
            self.proc = ctx.Process(target=_serve, args=(theirs, os.getpid()), daemon=True)
            self.proc.start()
        theirs.close()

    def call(self, fn: Callable, args: tuple, kwargs: dict,
             log: Callable[[str], None] | None) -> Any:
        self.conn.send((fn, args, kwargs))
        while True:
            try:
                kind, payload = self.conn.recv()
            except EOFError:
                self.proc.join(10)
                raise FbnasError(f"timing worker ({self.name} allocator) ended without a "
                                 f"result (exit code {self.proc.exitcode})") from None
            if kind == "log":
                (log or (lambda s: print(s, file=sys.stderr)))(payload)
            elif kind == "ok":
                return payload
            else:
                raise payload

    def close(self, wait_s: float = 10) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):  # the worker is gone already
            pass
        self.conn.close()
        self.proc.join(wait_s)
        if self.proc.is_alive():
            self.proc.terminate()


# the workers kept between calls while `reused_workers()` is open: (allocator, library) -> one
_KEPT: dict[tuple[str, str | None], _Worker] | None = None


@contextmanager
def reused_workers() -> Iterator[None]:
    """Within the block, calls for the same allocator go to one worker process, started at
    the first (four measurements of a quickstart network: 37.7 s in one worker against 40.7 s
    in four); closed at the end. Outside it, each call has its own."""
    global _KEPT
    if _KEPT is not None:  # nested: the outer block keeps them
        yield
        return
    _KEPT = {}
    try:
        yield
    finally:
        kept, _KEPT = _KEPT, None
        for w in kept.values():
            w.close()


def call_in_worker(name: str, library: str | None, fn: Callable, args: tuple, kwargs: dict,
                   log: Callable[[str], None] | None = None) -> Any:
    """Run `fn(*args, **kwargs)` in a process started under allocator `name` (a fresh one,
    or the one `reused_workers` keeps); return its result, or raise its exception. `log`
    receives the worker's log lines as they come."""
    key = (name, library)
    worker = (_KEPT or {}).pop(key, None) or _Worker(name, library)
    try:
        out = worker.call(fn, args, kwargs, log)
    except BaseException as e:
        # a worker that sent back its call's error still serves; one that ended, or that
        # Ctrl-C reached too (let it save what it finished), is closed
        if _KEPT is not None and worker.proc.is_alive() and isinstance(e, Exception):
            _KEPT[key] = worker
        else:
            worker.close()
        raise
    if _KEPT is not None:
        _KEPT[key] = worker
    else:
        worker.close()
    return out


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
