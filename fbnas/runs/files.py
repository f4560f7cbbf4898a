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
