"""What a cost table can hold: one registration per cost kind (latency, FLOPs, params), with
its units (a counted kind names its counter: `fbnas.arch.module_flops` / `count_params`).

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

from fbnas.registry import Registry, located


@dataclass(frozen=True)
class CostKind:
    """One kind of cost a table holds per block."""

    unit: str  # in logs, reports and plots
    table_unit: str  # the table file's `unit` field (as written since schema 1)
    # counted kinds: what counts one block at batch 1, no device needed, called as
    # `counter(module, input_chw)`: the function, or where it lives ("module:function",
    # imported when something is first counted: torch is not imported before that)
    counter: Callable[[Any, tuple[int, int, int]], float] | str | None = None
    measured: bool = False  # timed on a device (latency): tables with statistics, a timer

    def __post_init__(self) -> None:
        if self.measured == (self.counter is not None):
            raise ValueError("a cost kind is either measured or counted (has a `counter`)")

    @property
    def counted(self) -> bool:
        return self.counter is not None

    def count(self, module: Any, input_chw: tuple[int, int, int]) -> float:
        """The counted cost of `module` on one input of `input_chw`."""
        fn = located(self.counter) if isinstance(self.counter, str) else self.counter
        if fn is None:
            raise ValueError("a measured cost kind is timed on a device, not counted")
        return float(fn(module, input_chw))


COST_KINDS: Registry[CostKind] = Registry("cost kind", "latency.cost")
COST_KINDS.register("latency", CostKind("us", "us", measured=True))
COST_KINDS.register("flops", CostKind("FLOPs", "flops", "fbnas.arch:module_flops"))
COST_KINDS.register("params", CostKind("params", "params", "fbnas.arch:count_params"))


def counted_kinds() -> tuple[str, ...]:
    """The kinds tabulated by counting (flops, params)."""
    return tuple(n for n, k in COST_KINDS.items() if k.counted)


def is_measured(cost: str) -> bool:
    """Whether the registered kind `cost` is measured on a device (latency), not counted."""
    return COST_KINDS.get(cost).measured
