"""Seeded, epoch-deterministic order: the disjoint w / θ / val split and the samplers."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from fbnas.data.config import DataConfig
from fbnas.errors import FbnasError


class Stream:
    """Independent random streams derived from the run's seed."""

    SPLIT, W, THETA, TRAIN, SYNTH_TRAIN, SYNTH_TEST, WORKERS, CLASSES, CLUTTER = range(1, 10)




def mix_seed(*ints: int) -> int:
    """A well-spread 63-bit seed from a tuple of integers (seed, stream, epoch, ...)."""
    words = np.random.SeedSequence([int(i) % (1 << 64) for i in ints]).generate_state(2)
    return ((int(words[0]) << 32) | int(words[1])) & ((1 << 63) - 1)


def seeded_generator(*ints: int) -> torch.Generator:
    return torch.Generator().manual_seed(mix_seed(*ints))


def check_distributed(distributed: tuple[int, int] | None) -> tuple[int, int]:
    if distributed is None:
        return 0, 1
    try:
        rank, world = (int(x) for x in distributed)
    except (TypeError, ValueError):
        raise FbnasError(f"distributed: expected (rank, world_size), got {distributed!r}") from None
    if world < 1 or not 0 <= rank < world:
        raise FbnasError(f"distributed: need 0 <= rank < world_size, got rank={rank}, "
                         f"world_size={world}")
    return rank, world


class EpochSampler(Sampler[int]):
    """Yields a fixed list of dataset indices; shuffled, the order is a function of
    (seed, stream, epoch) only.

    Each `iter()` uses the current epoch and then advances it by one, so a loader iterated
    without `set_epoch` still reshuffles; `set_epoch(e)` pins the next pass to epoch e's order.
    Distributed: every rank draws the same permutation; with `pad`, it is padded by wrapping
    around to a multiple of world_size (as DistributedSampler does) and rank r takes positions
    r, r + world_size, ...; without `pad` (evaluation) the shards are uneven and exact.
    """

    def __init__(self, indices: Sequence[int], *, shuffle: bool, seed: int = 0, stream: int = 0,
                 rank: int = 0, world_size: int = 1, pad: bool = True):
        self.indices = torch.as_tensor(list(indices), dtype=torch.long)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.stream = int(stream)
        self.rank, self.world_size = check_distributed((rank, world_size))
        self.pad = pad
        self.epoch = 0
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def skip_next(self, n: int) -> None:
        """Make the next pass start at its n-th index (resuming inside an epoch)."""
        self._skip = max(int(n), 0)

    def order(self, epoch: int) -> list[int]:
        """This rank's indices, in the order epoch `epoch` yields them."""
        idx = self.indices
        if self.shuffle and len(idx) > 1:
            gen = seeded_generator(self.seed, self.stream, epoch)
            perm = torch.randperm(len(idx), generator=gen)
            idx = idx[perm]
        if self.world_size > 1:
            if self.pad and len(idx) > 0:
                total = math.ceil(len(idx) / self.world_size) * self.world_size
                reps = math.ceil(total / len(idx))
                idx = idx.repeat(reps)[:total]
            idx = idx[self.rank::self.world_size]
        return idx.tolist()

    def __iter__(self) -> Iterator[int]:
        out = self.order(self.epoch)[self._skip:]
        self.epoch += 1
        self._skip = 0
        return iter(out)

    def __len__(self) -> int:
        n = len(self.indices)
        if self.world_size == 1:
            return n
        if self.pad:
            return math.ceil(n / self.world_size)
        return len(range(self.rank, n, self.world_size))


def split_indices(n_train: int, cfg: DataConfig, seed: int
                  ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(w, θ, val) index tuples into a training set of `n_train` samples: disjoint, sorted.

    One seeded permutation of the training set; `limit` keeps its first `limit` entries; of
    those, the first `val_fraction` are val, then `w_fraction` of the rest are w, the rest θ.
    """
    perm = torch.randperm(n_train, generator=seeded_generator(seed, Stream.SPLIT)).tolist()
    if cfg.limit is not None:
        perm = perm[:cfg.limit]
    n = len(perm)
    need_val = 1 if cfg.val_fraction > 0 else 0
    if n - need_val < 2:
        if cfg.limit is not None:
            fix = f"raise {cfg.where}.limit"
        elif cfg.dataset == "synthetic":
            fix = f"raise {cfg.where}.synthetic_size"
        else:
            fix = "use a larger dataset"
        raise FbnasError(f"{cfg.where}: {n} training samples are too few: val, w and θ need "
                         f"{need_val + 2} at least ({fix})")
    n_val = min(max(round(cfg.val_fraction * n), need_val), n - 2)  # w and θ keep one each
    rest = n - n_val
    n_w = min(max(round(cfg.w_fraction * rest), 1), rest - 1)
    val = tuple(sorted(perm[:n_val]))
    w = tuple(sorted(perm[n_val:n_val + n_w]))
    theta = tuple(sorted(perm[n_val + n_w:]))
    return w, theta, val


def split_groups(groups: Sequence[int], val: Sequence[int], cfg: DataConfig, seed: int
                 ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(w, θ, val) index tuples into a training set whose samples come in groups (the
    canvases drawn from one source image, `cluttered_digits`) and whose val part is fixed by
    the data (`val`: sample indices, whole groups): disjoint, sorted, and no group in two parts.

    The groups of the other samples are put in one seeded order (as `split_indices` orders
    samples); `limit` keeps the groups in that order while their samples number `limit` or
    fewer (2 groups at least); the first `w_fraction` of the groups kept are w, the rest θ.
    """
    groups = np.asarray(groups, dtype=np.int64)
    val = tuple(sorted(int(i) for i in val))
    rest = np.ones(len(groups), dtype=bool)
    rest[list(val)] = False
    names, sizes = np.unique(groups[rest], return_counts=True)  # sorted
    perm = torch.randperm(len(names), generator=seeded_generator(seed, Stream.SPLIT)).numpy()
    names, sizes = names[perm], sizes[perm]
    if cfg.limit is not None:
        names = names[:max(int(np.sum(np.cumsum(sizes) <= cfg.limit)), 2)]
    if len(names) < 2:
        fix = f"raise {cfg.where}.limit" if cfg.limit is not None else "use more sources"
        raise FbnasError(f"{cfg.where}: {len(names)} source images outside val are too few: "
                         f"w and θ need 1 each at least ({fix})")
    n_w = min(max(round(cfg.w_fraction * len(names)), 1), len(names) - 1)
    part = {int(g): k for k, g in enumerate(names)}
    where = np.array([part.get(int(g), -1) if r else -1 for g, r in zip(groups, rest,
                                                                         strict=True)])
    w = tuple(int(i) for i in np.flatnonzero((where >= 0) & (where < n_w)))
    theta = tuple(int(i) for i in np.flatnonzero(where >= n_w))
    return w, theta, val
