"""A run's logger: the console, and RUN_DIR/train.log on rank 0 once the run starts.

Lines logged while a trainer validates its inputs (a latency table being measured, say) go to
the console and to a memory buffer; `attach_log_file` writes that buffer into train.log when
the run directory is created, so a refused run writes nothing and a started one loses no line.
"""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

from fbnas.io import ensure_dir


def logger_name(run_dir: Path, rank: int = 0) -> str:
    return f"fbnas.run.{run_dir.resolve()}" + (f".rank{rank}" if rank else "")


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
        fh = logging.FileHandler(run_dir / "train.log")
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
