"""Mixed precision and memory layout for the training steps (`search.precision`,
`search.channels_last`, and the same keys under `retrain:`).

precision:
    float32  everything in float32 (the default).
    bf16     forward under `torch.autocast(dtype=torch.bfloat16)` on CPU or CUDA: convolutions
             and matmuls in bfloat16, reductions, softmax and the losses in float32. No loss
             scaling is needed (bf16 has float32's exponent range).
    fp16     CUDA only: autocast to float16 with dynamic loss scaling (`torch.amp.GradScaler`),
             one scaler for the weight optimizer and one for θ; a step whose scaled gradients
             overflow is skipped by the scaler and the scale lowered.
Weights, optimizer state, θ and the cost table stay float32 in every mode; validation,
BN re-calibration and `fbnas eval` run in float32.

channels_last: the network's 4-D weights and every input batch in `torch.channels_last`
memory format (NHWC), which cuDNN's and oneDNN's fastest convolution kernels prefer. Values are
the same up to float rounding; checkpoints load into either layout.

docs/search_modes.md lists the measured effect of each (scripts/speed/precision.py).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from fbnas.errors import FbnasError

PRECISIONS = ("float32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _grad_scaler(device_type: str) -> Any:
    if hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
        return torch.amp.GradScaler(device_type)
    return torch.cuda.amp.GradScaler()  # older torch: CUDA only, which is all fp16 allows


def cpu_has_bf16() -> bool:
    """Whether oneDNN has native bf16 kernels on this CPU (else bf16 is emulated, slowly)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


LAYOUTS = ("auto", True, False)  # channels_last: auto (on CUDA), true, false


def layout_setting(value: object, where: str) -> bool | str:
    """A `channels_last` setting read: true, false or auto (a one-line error otherwise)."""
    if value not in LAYOUTS or (value in (0, 1) and not isinstance(value, bool)):
        raise FbnasError(f"{where}: expected true, false or auto, got {value!r}")
    return value


def resolve_channels_last(value: bool | str, device: torch.device) -> bool:
    """`channels_last: auto` is on for CUDA (any precision: cuDNN's NHWC convolutions and
    BatchNorm; docs/search_modes.md) and off on the CPU, where NHWC is not measured faster for
    the search step; true and false are themselves."""
    return device.type == "cuda" if value == "auto" else bool(value)


class Precision:
    """The autocast context, loss scalers and layout conversion of one trainer."""

    def __init__(self, precision: str, channels_last: bool | str, device: torch.device,
                 where: str = "search", scalers: int = 1, local_sgd: bool = False):
        if precision not in PRECISIONS:
            raise FbnasError(f"{where}.precision: {precision!r} is not one of "
                             f"{', '.join(PRECISIONS)}")
        if precision == "fp16" and device.type != "cuda":
            raise FbnasError(f"{where}.precision: fp16 needs a CUDA device (this run is on "
                             f"{device.type}); use bf16 on CPU")
        if precision == "fp16" and local_sgd:
            # under no_sync each rank's scaler would skip different steps, and the ranks'
            # optimizer states (and scales) would drift apart
            raise FbnasError(f"{where}.precision: fp16 cannot be combined with "
                             "run.ddp_sync_every > 1; use bf16 or run.ddp_sync_every: 1")
        self.precision, self.device = precision, device
        self.channels_last = resolve_channels_last(channels_last, device)
        self.dtype = _DTYPES.get(precision)
        self.scalers = [_grad_scaler(device.type) for _ in range(scalers)] \
            if precision == "fp16" else []

    def warning(self, where: str = "search") -> str | None:
        """A line to log when the setting will likely be slower than float32 here."""
        if self.precision == "bf16" and self.device.type == "cpu" and not cpu_has_bf16():
            return (f"{where}.precision bf16: this CPU has no native bf16 (AVX512-BF16 / AMX); "
                    "bf16 steps will be slower than float32 here (scripts/speed/precision.py)")
        return None

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for a training forward pass (a no-op in float32)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def model(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.channels_last:
            model.to(memory_format=torch.channels_last)  # 4-D parameters and buffers only
        return model

    def input(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    # ---- loss scaling (fp16) ---------------------------------------------------------------
    def scale(self, loss: torch.Tensor, i: int = 0) -> torch.Tensor:
        return self.scalers[i].scale(loss) if self.scalers else loss

    def unscale_(self, opt: torch.optim.Optimizer, i: int = 0) -> None:
        if self.scalers:
            self.scalers[i].unscale_(opt)

    def step(self, opt: torch.optim.Optimizer, i: int = 0) -> None:
        """`opt.step()`, through the scaler under fp16 (which skips steps with inf/NaN
        gradients and adapts the scale)."""
        if self.scalers:
            self.scalers[i].step(opt)
            self.scalers[i].update()
        else:
            opt.step()

    def state_dict(self) -> list[dict[str, Any]]:
        return [s.state_dict() for s in self.scalers]

    def load_state_dict(self, states: list[dict[str, Any]] | None) -> None:
        for s, st in zip(self.scalers, states or [], strict=False):
            s.load_state_dict(st)
