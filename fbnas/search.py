"""Compatibility name for code written against fbnas <= 0.1: the search trainer lives in
fbnas.trainer."""

from fbnas.trainer import Interrupted, NonFiniteLoss, SearchTrainer, TauSchedule

__all__ = ["Interrupted", "NonFiniteLoss", "SearchTrainer", "TauSchedule"]
