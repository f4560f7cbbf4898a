"""fbnas: hardware-aware differentiable neural architecture search in the style of FBNet.

The public API is the names below, imported from `fbnas` itself:

    from fbnas import load_config, SearchTrainer, run_trainer, SearchRun, LatencyTable

Each is imported from its module the first time it is asked for, so `import fbnas` (and the
command line's help) imports no torch; the modules themselves stay importable as they are.
"""

from __future__ import annotations

from fbnas.errors import FbnasError
from fbnas.registry import lazy_exports

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    # configs, spaces, architectures
    "Config": "fbnas.config", "load_config": "fbnas.config",
    "SearchSpace": "fbnas.search_space", "load_space": "fbnas.search_space",
    "Architecture": "fbnas.arch", "build_child": "fbnas.arch",
    "load_child": "fbnas.training.checkpoint",
    # the search and the retrain
    "Supernet": "fbnas.supernet", "SearchTrainer": "fbnas.trainer",
    "ChildTrainer": "fbnas.retrain", "run_trainer": "fbnas.training.loop",
    # latency tables and exports
    "LatencyTable": "fbnas.latency.table", "export_child": "fbnas.backends.export",
    # runs and results
    "SearchRun": "fbnas.fit.search_run", "refit": "fbnas.fit.select",
    "load_results": "fbnas.runs.results", "find_results": "fbnas.runs.index",
    "format_table": "fbnas.runs.index", "results_table": "fbnas.runs.index",
    "pareto": "fbnas.runs.index",
    # the ground-truth benchmark
    "Bench": "fbnas.bench.table",
    # extension points (docs/architecture.md, "Where to add")
    "register_block": "fbnas.blocks", "register_family": "fbnas.blocks",
    "TIMERS": "fbnas.backends", "FORMATS": "fbnas.backends", "COST_KINDS": "fbnas.latency.kinds",
    "LOSSES": "fbnas.loss", "MODES": "fbnas.search.modes",
}

__all__ = ["FbnasError", "__version__", *_PUBLIC]


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC)
