"""A run's logger: the console, and RUN_DIR/train.log on rank 0 once the run starts; and a
phase's progress on the console.

Lines logged while a trainer validates its inputs (a latency table being measured, say) go to
the console and to a memory buffer; `attach_log_file` writes that buffer into train.log when
the run directory is created, so a refused run writes nothing and a started one loses no line.

`Progress` is a tqdm bar where the console is a terminal; where it is a file or a pipe (a job
scheduler's log, `> log 2>&1`) it is a plain line every `PLAIN_EVERY_S` seconds inside a long
phase, with the figures the bar shows, and nothing else: no carriage-return redraws. The
epoch's own line comes from the logger either way.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import time
from pathlib import Path
from typing import IO, Any

from fbnas.io import clock, ensure_dir
from fbnas.runs.files import RunFiles

PLAIN_EVERY_S = 30.0  # a plain progress line at most this often (not on a terminal)
BAR_REFRESH_S = 0.5  # a bar's figures are read from the device at most this often


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is an interactive terminal (False for files, pipes, closed streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """A phase's progress over `total` steps (from `initial`, a resumed phase), labelled `desc`:
    a tqdm bar on a terminal, else a plain line at most every `every` seconds (see the module
    docstring). `due()` says when figures are wanted, so that reading them from the device
    (a sync) happens only when they are shown."""

    def __init__(self, total: int, desc: str, initial: int = 0, stream: IO[str] | None = None,
                 every: float | None = None, unit: str = "step"):
        self.stream = stream if stream is not None else sys.stderr
        self.every = PLAIN_EVERY_S if every is None else every
        self.total, self.desc, self.unit = total, desc, unit
        self.n = self.start = min(initial, total)
        self.t0 = self.shown_at = time.monotonic()
        self.bar = None
        if is_terminal(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=self.n, leave=False, dynamic_ncols=True,
                            desc=desc, file=self.stream)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)

    def due(self) -> bool:
        """Whether to `show` figures now: every BAR_REFRESH_S on a bar, every `every` seconds
        in plain lines."""
        wait = BAR_REFRESH_S if self.bar is not None else self.every
        return time.monotonic() - self.shown_at >= wait

    def show(self, figures: dict[str, float] | None = None) -> None:
        """The bar's figures, or a plain line: desc, steps done, elapsed, rate, figures."""
        self.shown_at = time.monotonic()
        figs = {k: f"{v:.3g}" for k, v in (figures or {}).items()}
        if self.bar is not None:
            self.bar.set_postfix(figs)
            return
        self.stream.write(self.line(figs) + "\n")
        self.stream.flush()

    def line(self, figs: dict[str, str] | None = None) -> str:
        spent = time.monotonic() - self.t0
        done = self.n - self.start
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = f", {done / spent:.3g} {self.unit}/s" if spent > 0 and done else ""
        tail = "".join(f", {k}={v}" for k, v in (figs or {}).items())
        return (f"{self.desc}: {self.n}/{self.total} {self.unit}s{pct} in {clock(spent)}"
                f"{rate}{tail}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def logger_name(run_dir: Path, rank: int = 0) -> str:
    return f"fbnas.training.{run_dir.resolve()}" + (f".rank{rank}" if rank else "")


def run_log_handlers(run_dir: Path, rank: int = 0) -> set[logging.Handler]:
    """The handlers the run's logger has now (to close only those added after)."""
    return set(logging.getLogger(logger_name(run_dir, rank)).handlers)


def make_logger(run_dir: Path, rank: int = 0, file: bool = True) -> logging.Logger:
    """The run's logger: the console, and run_dir/train.log on rank 0 (`file=False`: the
    console, and a buffer that `attach_log_file` writes to train.log once the run starts)."""
    if rank:  # another rank of a torchrun job: warnings only, to stderr, nothing in run_dir
        log = logging.getLogger(logger_name(run_dir, rank))
        log.setLevel(logging.WARNING)
        log.propagate = False
        if not log.handlers:
            sh = logging.StreamHandler()
            sh.setFormatter(logging.Formatter(f"[rank {rank}] %(message)s"))
            log.addHandler(sh)
        return log
    log = logging.getLogger(logger_name(run_dir))
    log.setLevel(logging.INFO)
    log.propagate = False
    if not any(type(h) is logging.StreamHandler for h in log.handlers):
        sh = logging.StreamHandler()
        sh.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(sh)
    if file:
        attach_log_file(log, run_dir)
    elif not any(isinstance(h, logging.FileHandler) for h in log.handlers):
        # lines logged while inputs are validated (e.g. a table being measured) reach
        # train.log too, once there is one; flushed by hand only
        log.addHandler(logging.handlers.MemoryHandler(1 << 20, flushLevel=logging.CRITICAL + 1))
    return log


def attach_log_file(log: logging.Logger, run_dir: Path) -> None:
    """Add run_dir/train.log (created if needed) to `log`, once, writing what was buffered."""
    buffers = [h for h in log.handlers if isinstance(h, logging.handlers.MemoryHandler)]
    fh = next((h for h in log.handlers if isinstance(h, logging.FileHandler)), None)
    if fh is None:
        ensure_dir(run_dir)
        fh = logging.FileHandler(RunFiles(run_dir).log)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s",
                                          "%H:%M:%S"))
        log.addHandler(fh)
    for mh in buffers:
        mh.setTarget(fh)
        mh.flush()
        log.removeHandler(mh)
        mh.close()


def close_logger(log: logging.Logger, keep: set[logging.Handler] | frozenset = frozenset()
                 ) -> None:
    """Close and remove the logger's handlers (but those in `keep`: another live trainer's)."""
    for h in list(log.handlers):
        if h in keep:
            continue
        if isinstance(h, logging.handlers.MemoryHandler):
            h.setTarget(None)  # a refused run's buffer goes nowhere
        h.close()
        log.removeHandler(h)
