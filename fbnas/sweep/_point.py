"""One sweep point's work, a function of its config alone (any order, any process): its search
(`search_point`, or resumed, or re-read when finished) and its retrain (`retrain_point`).
`fbnas.sweep.driver` runs the points one after another, `fbnas.sweep.ray_tasks` on a Ray cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fbnas.arch import Architecture
from fbnas.config import Config, apply_overrides, config_from_dict
from fbnas.fit.search_run import SearchRun
from fbnas.io import load_json
from fbnas.retrain import ChildTrainer
from fbnas.runs.files import RunFiles
from fbnas.runs.results import load_results
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger


def search_done(cfg: Config) -> bool:
    """Has this point's search run all its epochs (its run directory says so)?"""
    files = RunFiles(cfg.run.dir)
    return files.checkpoint.is_file() and SearchRun.open(files.dir).epoch >= cfg.search.epochs


def search_point(cfg: Config) -> Architecture:
    """Search (or resume, or re-read a finished search) in `cfg.run.dir`; its argmax
    architecture. Resuming checks the run was made with these settings (one-line error if
    not); a finished run just writes its architecture again."""
    files = RunFiles(cfg.run.dir)
    t = SearchTrainer(cfg, files.dir, resume=files.checkpoint.is_file())
    try:
        t.train()
    finally:
        close_logger(t.log)
    return Architecture.load(files.arch)


def retrain_config(base: dict, config_path: str | Path, run: Path) -> Config:
    """The retrain config of one sweep point (timed later, all children together)."""
    return config_from_dict(apply_overrides(base, [
        f"run.dir={run}", "retrain.measure_latency=false"]), str(config_path))


def retrain_point(cfg: Config, arch: Architecture, extra: dict[str, Any]) -> dict[str, Any]:
    """Retrain `arch` (or resume, or re-read a finished retrain) in `cfg.run.dir`; its
    results. Resuming checks the run trained this architecture with this recipe."""
    files = RunFiles(cfg.run.dir)
    done = files.results.is_file()
    if done:
        load_results(files.results)  # checked: a damaged file is a one-line error
    t = ChildTrainer(cfg, arch, files.dir, resume=files.checkpoint.is_file(),
                     extra={"sweep": extra})
    try:
        return load_json(files.results) if done else t.train()
    finally:
        close_logger(t.log)
