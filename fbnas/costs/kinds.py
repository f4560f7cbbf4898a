"""What a cost table can hold: one registration per cost kind (latency, FLOPs, params), with
its units, and the one way fbnas counts FLOPs.

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fbnas.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn


def count_flops(module: nn.Module, input_chw: Sequence[int], device: str | torch.device = "cpu"
                ) -> int:
    """FLOPs of one forward of `module` (as it is: put it in eval mode first) on a zero input
    of batch 1, counted by torch's FlopCounterMode: 2 per multiply-add of the convolutions and
    matrix products, as is usual for FLOP counts. On the meta device nothing is computed."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, *input_chw, device=device)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        module(x)
    return int(counter.get_total_flops())


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


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
COST_KINDS.register("flops", CostKind("FLOPs", "flops",
                                      lambda m, chw: float(count_flops(m, chw))))
COST_KINDS.register("params", CostKind("params", "params", lambda m, chw: float(count_params(m))))


def counted_kinds() -> tuple[str, ...]:
    """The kinds tabulated by counting (flops, params)."""
    return tuple(n for n, k in COST_KINDS.items() if k.counted)


def is_measured(cost: str) -> bool:
    """Whether the registered kind `cost` is measured on a device (latency), not counted."""
    return COST_KINDS.get(cost).measured
