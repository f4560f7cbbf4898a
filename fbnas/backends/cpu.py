"""The `cpu` timer: PyTorch eager on the host CPU, with a fixed and recorded thread count
(default 1) and memory allocator (`fbnas.backends.allocator`; default `retain`, timed in a
worker process started with it), clock `time.thread_time_ns` or `time.perf_counter_ns`.
The exported runtimes (`ort`, `executorch`) time with the same clocks."""

from __future__ import annotations

import time
from typing import Any

import torch

from fbnas.backends import CLOCKS
from fbnas.backends.allocator import DEFAULT
from fbnas.backends.base import Runnable, Timer
from fbnas.errors import FbnasError


class CpuTimer(Timer):
    """CPU: a fixed thread count, inference mode, and one of two clocks.

    `clock="thread"` (the default with 1 thread) reads the calling thread's CPU time
    (CLOCK_THREAD_CPUTIME_ID). With one thread PyTorch runs every op inline on that thread,
    so on an idle machine this equals wall time; on a shared machine it leaves out the time
    the thread was descheduled for other processes, which wall time would count as latency.
    Wall time is read as well, and the share of time lost to descheduling is recorded.
    `clock="wall"` (the default with several threads, where CPU time is not latency) reads
    `time.perf_counter_ns`.
    """

    backend = "cpu"
    host = True
    allocator_default = DEFAULT
    clocks = CLOCKS

    def __init__(self, *args, clock: str | None = None, **kw):
        super().__init__(*args, **kw)
        clock = clock or ("thread" if self.threads == 1 else "wall")
        if clock not in self.clocks:
            raise FbnasError(f"timer: clock must be {' or '.join(self.clocks)}, got {clock!r}")
        if clock == "thread" and self.threads != 1:
            raise FbnasError("timer: clock 'thread' measures one thread; with "
                             f"{self.threads} threads use clock 'wall'")
        self.clock = clock
        self.wall_s = 0.0
        self.cpu_s = 0.0

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["clock"] = self.clock
        return d

    def descheduled_share(self) -> float:
        """Share of wall time the timing thread was not running (other processes, steal)."""
        return max(0.0, 1.0 - self.cpu_s / self.wall_s) if self.wall_s > 0 else 0.0

    def sample(self, run: Runnable, number: int) -> float:
        fn = run.fn
        with self, torch.inference_mode():
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            for _ in range(number):
                fn()
            t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        wall, cpu = (t1 - t0) * 1e-9, (c1 - c0) * 1e-9
        self.wall_s += wall
        self.cpu_s += cpu
        return (cpu if self.clock == "thread" else wall) / number
