"""The `fake` timer: no clock at all: a deterministic cost from the module's FLOPs
(`fbnas.arch.module_flops`) and layer count, with optional seeded noise and machine drift,
so that build and validate are testable."""

from __future__ import annotations

import math
import random
from typing import Any

import torch
from torch import nn

from fbnas.arch import module_flops
from fbnas.backends import QUANTIZATIONS
from fbnas.backends.base import Runnable, Timer

_PLAIN = (int, float, str, bool, tuple, type(None))
_COUNTED: dict[tuple, tuple[int, int]] = {}


def _signature(module: nn.Module) -> tuple:
    """What decides a module's FLOP count and leaf count: each submodule's type and plain
    attributes (channels, kernel, stride, groups, flags) and every parameter's and buffer's
    shape, in order."""
    return tuple(
        (name, type(m).__qualname__,
         tuple(sorted((k, v) for k, v in vars(m).items() if isinstance(v, _PLAIN))),
         tuple((k, tuple(t.shape)) for k, t in m.named_parameters(recurse=False)),
         tuple((k, tuple(t.shape)) for k, t in m.named_buffers(recurse=False)))
        for name, m in module.named_modules())


class FakeTimer(Timer):
    """Deterministic stand-in for a device: time per call = overhead per leaf module + FLOPs /
    throughput, times seeded noise and a slow 'machine speed' drift. For tests only."""

    backend = "fake"
    host = True  # tests run it in a worker under an allocator; in process by default
    quantizations = QUANTIZATIONS  # int8: FLOPs at INT8_SPEEDUP times the throughput
    INT8_SPEEDUP = 2.5

    def __init__(self, *args, noise: float = 0.0, drift: float = 0.0, seed: int = 0,
                 flops_per_s: float = 2e9, overhead_s: float = 4e-6, **kw):
        super().__init__(*args, **kw)
        self.noise, self.drift = float(noise), float(drift)
        self.flops_per_s, self.overhead_s = flops_per_s, overhead_s
        self.rng = random.Random(seed)
        self.samples_taken = 0

    def device_name(self) -> str:
        return "fake device"

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["cpu_model"] = "fake"
        d["torch_version"] = "fake"  # so that fake tables are identical across torch versions
        return d

    def prepare(self, module: nn.Module, input_chw: tuple[int, int, int],
                label: str = "") -> Runnable:
        # Shapes are all the fake needs: run on the meta device, which computes nothing.
        where = "meta"
        if isinstance(module, torch.jit.ScriptModule):  # cannot move: count on the CPU
            module, where = module.eval(), "cpu"
        else:
            module = module.eval().to("meta")
        key = (_signature(module), tuple(input_chw), where)
        if key not in _COUNTED:  # counting FLOPs runs a forward: once per structure
            _COUNTED[key] = (module_flops(module, input_chw, where),
                             sum(1 for m in module.modules() if not list(m.children())))
        flops, leaves = _COUNTED[key]
        speed = self.flops_per_s * (self.INT8_SPEEDUP if self.quantization == "int8" else 1)
        cost = self.batch * flops / speed + leaves * self.overhead_s
        return Runnable(lambda: None, module, cost_s=cost, label=label)

    def speed(self) -> float:
        """The fake machine's slowness factor now (1 = nominal)."""
        return 1.0 + self.drift * (0.5 + 0.5 * math.sin(self.samples_taken / 7.0))

    def sample(self, run: Runnable, number: int) -> float:
        self.samples_taken += 1
        jitter = 1.0 + self.noise * abs(self.rng.gauss(0.0, 1.0))
        return run.cost_s * self.speed() * jitter
