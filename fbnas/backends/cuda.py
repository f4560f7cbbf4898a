"""The `cuda` timer: CUDA events recorded around the loop, read after `Event.synchronize()`;
warm-up runs absorb cuDNN autotuning (`cudnn.benchmark` is switched on and recorded)."""

from __future__ import annotations

from typing import Any

import torch

from fbnas.backends.base import Runnable, Timer
from fbnas.errors import FbnasError


class CudaTimer(Timer):
    """CUDA: events around the loop, read after the end event has completed."""

    backend = "cuda"

    def __init__(self, *args, device_index: int = 0, **kw):
        super().__init__(*args, **kw)
        if not torch.cuda.is_available():
            raise FbnasError("timer: --device cuda asked for, but torch sees no CUDA device "
                             f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
        self.index = device_index
        self._saved_benchmark = torch.backends.cudnn.benchmark

    # cuDNN picks its fastest algorithm per shape while timing (as deployed code would);
    # the warm-up calls of every entry absorb that autotuning.
    def _activate(self) -> None:
        self._saved_benchmark = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True

    def _deactivate(self) -> None:
        torch.backends.cudnn.benchmark = self._saved_benchmark

    def _device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.index)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["gpu_name"] = self.device_name()
        d["cuda_version"] = torch.version.cuda
        d["cudnn_version"] = torch.backends.cudnn.version()
        d["cudnn_benchmark"] = True
        return d

    def sample(self, run: Runnable, number: int) -> float:
        fn = run.fn
        with self, torch.inference_mode(), torch.cuda.device(self.index):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(number):
                fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        return ms * 1e-3 / number
