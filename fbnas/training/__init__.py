"""What every trainer runs on, whatever it trains: loggers (logs), the epoch loop with signals,
checkpoints and run directory (loop), and the resume policy (resume). Nothing here knows what
is trained: the search and retrain trainers subclass `loop.EpochRunner`."""

from fbnas.training.logs import attach_log_file, close_logger, make_logger, run_log_handlers
from fbnas.training.loop import (
    EpochRunner,
    Interrupted,
    NonFiniteLoss,
    resolve_device,
    run_trainer,
    torch_threads,
)
from fbnas.training.resume import ResumePolicy, check_kept_settings

__all__ = ["EpochRunner", "Interrupted", "NonFiniteLoss", "ResumePolicy",
           "attach_log_file", "check_kept_settings", "close_logger", "make_logger",
           "resolve_device", "run_log_handlers", "run_trainer", "torch_threads"]
