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


def _worker(conn, parent: int, fn: Callable, args: tuple, kwargs: dict) -> None:
    global _PIPE
    _PIPE = conn
    _exit_with_parent(parent)
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
        proc = ctx.Process(target=_worker, args=(send, os.getpid(), fn, args, kwargs), daemon=True)
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
