"""A search run directory opened once, as `fbnas sample`, `bench score`, `fidelity`, the sweep,
a retrain from supernet weights and the scripts read it:

    run = SearchRun.open("runs/quickstart")       # a run directory, or its checkpoint.pt
    run.config, run.theta, run.table, run.costs, run.target, run.arch, run.recorded_pick
    net = run.supernet()                           # the searched weights and θ
    data = run.search_data()                       # its w / θ / val splits

What is opened is read lazily and once: a reader that needs the architecture only does not
load the checkpoint.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch

from fbnas.arch import Architecture
from fbnas.config import Config, SearchConfig, apply_overrides, config_from_dict, load_config
from fbnas.data import build_search_data
from fbnas.errors import FbnasError
from fbnas.io import load_json
from fbnas.latency.resolve import CostSource, run_costs, run_target
from fbnas.latency.table import LatencyTable
from fbnas.runs.files import CHECKPOINT, RunFiles
from fbnas.supernet import Supernet
from fbnas.training.checkpoint import load_checkpoint


class SearchRun:
    """One search run directory: its files (`files`), checkpoint (`state`), config, θ, cost
    table, costs, target, history, returned architecture and recorded final pick."""

    def __init__(self, run_dir: Path, checkpoint: Path):
        self.dir, self.files, self.checkpoint = run_dir, RunFiles(run_dir), checkpoint

    @classmethod
    def open(cls, path: str | os.PathLike) -> SearchRun:
        """The run at `path`: a run directory or a search checkpoint file."""
        p = Path(path)
        # a missing path is taken as a directory: reading its checkpoint says what is missing
        return cls(p.parent, p) if p.is_file() else cls(p, p / CHECKPOINT)

    # ---- the checkpoint ---------------------------------------------------------------------
    @functools.cached_property
    def state(self) -> dict[str, Any]:
        """The search checkpoint (a one-line error if absent, damaged or not a search's)."""
        return load_checkpoint(self.checkpoint, kind="search")

    @property
    def epoch(self) -> int:
        return int(self.state["epoch"])

    @functools.cached_property
    def config(self) -> Config:
        """The config the run was searched with (its checkpoint's)."""
        return config_from_dict(self.state["config"], f"{self.checkpoint}: config",
                                finished=True)

    def config_with(self, overrides: list[str]) -> Config:
        """The run's config with `--set`-style overrides applied."""
        return config_from_dict(apply_overrides(self.state["config"], overrides),
                                f"{self.checkpoint}: config", finished=True)

    @functools.cached_property
    def theta(self) -> list[torch.Tensor]:
        """θ per decision, checked against the space (each layer's ops, then each searched
        stage's widths)."""
        cfg = self.config
        theta = []
        for i, cands in enumerate(cfg.space.decision_candidates()):
            t = self.state["model"].get(f"theta.{i}")
            if t is None or t.ndim != 1 or len(t) != len(cands) or not t.is_floating_point():
                raise FbnasError(f"{self.checkpoint}: damaged checkpoint: model.theta.{i} does "
                                 f"not fit decision {i} of its search space "
                                 f"'{cfg.space.name}' ({len(cands)} candidates)")
            theta.append(t)
        return theta

    def supernet(self, cfg: Config | None = None) -> Supernet:
        """The supernet with the run's weights and θ (on the CPU; costs play no part; `cfg`:
        the run's config with overrides)."""
        cfg = cfg or self.config
        net = Supernet(cfg.space, mode=cfg.search.mode, weights=cfg.search.weights)
        net.load_search_state(self.state["model"], str(self.checkpoint))
        return net

    def search_data(self, cfg: Config | None = None):
        """The run's w / θ / val / test splits (`cfg`: the run's config with overrides)."""
        cfg = cfg or self.config
        m = cfg.space.macro
        return build_search_data(cfg.data, m.input_size, m.in_channels, m.num_classes,
                                 seed=cfg.search.seed)

    # ---- the cost table -----------------------------------------------------------------------
    @functools.cached_property
    def table(self) -> LatencyTable | None:
        """The cost table saved in the run (optional; one that is there must load)."""
        p = self.files.table
        return LatencyTable.load(p) if p.exists() else None

    @functools.cached_property
    def costs(self) -> CostSource:
        if self.table is None:
            raise FbnasError(f"{self.dir}: no {self.files.table.name}: the run's costs are unknown")
        return run_costs(self.config.space, self.table)

    @property
    def target(self) -> float:
        """The run's loss.target in its table's units."""
        return run_target(self.config.space, self.config.loss, self.costs)

    @property
    def fit_tolerance(self) -> float:
        """search.fit_tolerance of the run's config.yaml, else the default."""
        p = self.files.config
        return load_config(p).search.fit_tolerance if p.is_file() else SearchConfig().fit_tolerance

    # ---- what it wrote ---------------------------------------------------------------------------
    @functools.cached_property
    def history(self) -> list[dict[str, Any]]:
        return load_json(self.files.history, expect=list)

    @property
    def search_seconds(self) -> float:
        """The search's wall time: its epochs' seconds (history.json)."""
        return float(sum(h.get("seconds", 0.0) for h in self.history))

    @functools.cached_property
    def arch(self) -> Architecture | None:
        """The architecture the search returned (arch_hard.yaml), None before it finished."""
        p = self.files.arch
        return Architecture.load(p) if p.is_file() else None

    @property
    def recorded_pick(self) -> tuple[list[list[int]], dict | None]:
        """The networks the run's final pick ranked (`search.final_pick: path`, recorded in its
        arch_hard.yaml), best first: a re-fit starts from them, as the search's fit did (a
        record from before the ranking was kept holds the chosen one only); ([], None) where
        the run made none."""
        a = self.arch
        if a is None:
            return [], None
        pick = a.meta.get("final_pick")
        cands = pick.get("candidates_indices") or [] if isinstance(pick, dict) else []
        if not cands or not 0 <= int(pick.get("chosen", -1)) < len(cands):
            return [], None
        order = pick.get("ranked") or [int(pick["chosen"])]
        return [list(cands[int(i)]) for i in order], pick
