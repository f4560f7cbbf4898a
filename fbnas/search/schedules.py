"""What the search does when: the temperature per epoch (`TauSchedule`, owned by the search
trainer; the config holds only its numbers) and the single paths a warm-up weight step trains
(`warmup_paths`, `search.warmup_sampling`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fbnas.config import SearchConfig


@dataclass(frozen=True)
class TauSchedule:
    """The Gumbel-softmax temperature per (0-based) epoch: τ0 during the weights-only warm-up,
    then `exp`: max(τ_min, τ0·exp(−decay·k)), or `linear`: τ0 → τ_min over the θ epochs, with
    k the epochs since warm-up."""

    tau0: float
    kind: str
    decay: float
    tau_min: float
    warmup: int
    epochs: int

    @classmethod
    def from_config(cls, s: SearchConfig) -> TauSchedule:
        return cls(s.tau0, s.tau_schedule, s.tau_decay, s.tau_min, s.warmup_epochs, s.epochs)

    def __call__(self, epoch: int) -> float:
        k = max(0, epoch - self.warmup)
        if self.kind == "exp":
            return max(self.tau_min, self.tau0 * math.exp(-self.decay * k))
        n = max(1, self.epochs - self.warmup - 1)
        return self.tau0 + (self.tau_min - self.tau0) * min(1.0, k / n)


def warmup_paths(how: str, sizes: list[int]) -> list[list[list[int]]] | None:
    """The single paths (per layer, the one active candidate) a warm-up weight step trains, for
    layers with `sizes` candidates; None for `mode` (the search mode's own sampling).
    `uniform`: one path drawn uniformly (SPOS). `fair`: K = max(sizes) paths in which each
    layer's candidates appear once each, in shuffled order (FairNAS strict fairness)."""
    if how == "mode":
        return None
    if how == "uniform":
        return [[[int(torch.randint(n, (1,)))] for n in sizes]]
    perms = [torch.randperm(n).tolist() for n in sizes]
    return [[[p[k % len(p)]] for p in perms] for k in range(max(sizes))]
