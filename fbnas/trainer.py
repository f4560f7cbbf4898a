"""Compatibility names for code written against fbnas <= 0.1's `fbnas.trainer`.

The search trainer lives in fbnas.search, the run infrastructure in fbnas.run and cost
resolution in fbnas.costs (docs/architecture.md); new code imports from there.
"""

from fbnas.costs import CostSource, cached_table_path, resolve_costs
from fbnas.run import (
    CHECKPOINT,
    Interrupted,
    NonFiniteLoss,
    attach_log_file,
    check_kept_settings,
    close_logger,
    resolve_device,
    run_trainer,
)
from fbnas.search import SearchTrainer, TauSchedule

__all__ = ["CHECKPOINT", "CostSource", "Interrupted", "NonFiniteLoss", "SearchTrainer",
           "TauSchedule", "attach_log_file", "cached_table_path", "check_kept_settings",
           "close_logger", "resolve_device", "resolve_costs", "run_trainer"]
