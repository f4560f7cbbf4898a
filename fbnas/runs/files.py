"""The files of a run directory, named once: every reader and writer asks `RunFiles`.

    files = RunFiles(run_dir)
    files.checkpoint, files.theta, files.table, files.arch, files.results, ...
"""

from __future__ import annotations

import os
from dataclasses import dataclass
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


@dataclass(frozen=True)
class RunFiles:
    """The paths of one run directory's files."""

    dir: Path

    def __init__(self, run_dir: str | os.PathLike):
        object.__setattr__(self, "dir", Path(run_dir))

    @property
    def checkpoint(self) -> Path:
        return self.dir / CHECKPOINT

    @property
    def config(self) -> Path:
        return self.dir / CONFIG

    @property
    def theta(self) -> Path:
        return self.dir / THETA

    @property
    def history(self) -> Path:
        return self.dir / HISTORY

    @property
    def table(self) -> Path:
        return self.dir / TABLE

    @property
    def arch(self) -> Path:
        return self.dir / ARCH

    @property
    def results(self) -> Path:
        return self.dir / RESULTS

    @property
    def log(self) -> Path:
        return self.dir / LOG

    @property
    def classes(self) -> Path:
        return self.dir / CLASSES

    @property
    def tensorboard(self) -> Path:
        return self.dir / TENSORBOARD
