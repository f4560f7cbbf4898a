"""What a cost table can hold: one registration per cost kind (latency, FLOPs, params), with
its units (a counted kind counts with `fbnas.arch.module_flops` / `count_params`).

    COST_KINDS.get("flops").unit         # "FLOPs": logs, reports, plots
    COST_KINDS.get("flops").table_unit   # "flops": the `unit` field of a table file
    COST_KINDS.get("flops").count(module, (3, 32, 32))   # counted kinds need no device

A kind with a `count` is tabulated by counting each block (`fbnas latency build --cost`);
one registered `measured=True` (latency) is measured on a device, and every place that treats
measured and counted costs apart asks `is_measured`. `latency.cost` and `--cost` take their
choices from COST_KINDS, so a new kind is one registration here. Importing this module imports
no torch (the command line reads the kinds for its help); counting does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fbnas.registry import Registry


def _flops(module: Any, input_chw: tuple[int, int, int]) -> float:
    from fbnas.arch import module_flops  # torch, only when something is counted

    return float(module_flops(module, input_chw))


def _params(module: Any, input_chw: tuple[int, int, int]) -> float:
    from fbnas.arch import count_params

    return float(count_params(module))


@dataclass(frozen=True)
class CostKind:
    """One kind of cost a table holds per block."""

    unit: str  # in logs, reports and plots
    table_unit: str  # the table file's `unit` field (as written since schema 1)
    # counted kinds: the cost of one block at batch 1, no device needed
    count: Callable[[Any, tuple[int, int, int]], float] | None = None
    measured: bool = False  # timed on a device (latency): tables with statistics, a timer

    def __post_init__(self) -> None:
        if self.measured == (self.count is not None):
            raise ValueError("a cost kind is either measured or counted (has a `count`)")

    @property
    def counted(self) -> bool:
        return self.count is not None


COST_KINDS: Registry[CostKind] = Registry("cost kind", "latency.cost")
COST_KINDS.register("latency", CostKind("us", "us", measured=True))
COST_KINDS.register("flops", CostKind("FLOPs", "flops", _flops))
COST_KINDS.register("params", CostKind("params", "params", _params))


def counted_kinds() -> tuple[str, ...]:
    """The kinds tabulated by counting (flops, params)."""
    return tuple(n for n, k in COST_KINDS.items() if k.counted)


def is_measured(cost: str) -> bool:
    """Whether the registered kind `cost` is measured on a device (latency), not counted."""
    return COST_KINDS.get(cost).measured
