"""The files of a run directory, named once: every reader and writer asks `RunFiles`.

    files = RunFiles(run_dir)
    files.checkpoint, files.theta, files.table, files.arch, files.results, ...
"""

from __future__ import annotations

import os
from pathlib import Path

CHECKPOINT = "checkpoint.pt"  # the last checkpoint of a search or a retrain
CONFIG = "config.yaml"  # the resolved config the run was made with
THETA = "theta.json"  # a search's θ (and probabilities) per decision
HISTORY = "history.json"  # per-epoch figures
TABLE = "cost_table.json"  # the cost table a search used
ARCH = "arch_hard.yaml"  # the architecture a search returned
RESULTS = "results.json"  # a retrain's results (fbnas.runs.results)
LOG = "train.log"
CLASSES = "classes.json"  # the `data.classes` subset a run keeps
TENSORBOARD = "tb"


def _file(name: str) -> property:
    return property(lambda self: self.dir / name, doc=f"RUN_DIR/{name}")


class RunFiles:
    """The paths of one run directory's files."""

    __slots__ = ("dir",)

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)

    @classmethod
    def of(cls, checkpoint_or_dir: str | os.PathLike) -> RunFiles:
        """The run a checkpoint belongs to, given as its file or as the run folder (the one
        rule every command that takes either applies: export, eval, latency measure)."""
        p = Path(checkpoint_or_dir)
        return cls(p if p.is_dir() else p.parent)

    @staticmethod
    def checkpoint_of(checkpoint_or_dir: str | os.PathLike) -> Path:
        """The checkpoint file meant by a checkpoint file or a run folder."""
        p = Path(checkpoint_or_dir)
        return RunFiles(p).checkpoint if p.is_dir() else p

    checkpoint = _file(CHECKPOINT)
    config = _file(CONFIG)
    theta = _file(THETA)
    history = _file(HISTORY)
    table = _file(TABLE)
    arch = _file(ARCH)
    results = _file(RESULTS)
    log = _file(LOG)
    classes = _file(CLASSES)
    tensorboard = _file(TENSORBOARD)
