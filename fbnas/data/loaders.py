"""Loaders for search (w / θ / val / calibration), retraining and evaluation."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from fbnas.data._device import DeviceBatches, on_device, supports
from fbnas.data.config import SPLITS, DataConfig
from fbnas.data.sampling import (
    EpochSampler,
    Stream,
    check_distributed,
    mix_seed,
    seeded_generator,
    split_groups,
    split_indices,
)
from fbnas.data.sources import Source, load_source
from fbnas.errors import FbnasError


def split_source(src: Source, cfg: DataConfig, seed: int
                 ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(w, θ, val) of a source's training set: sample by sample, or by source image with the
    val part the data fixed (cluttered_digits: no source image in two parts)."""
    if src.groups is None:
        return split_indices(len(src.train), cfg, seed)  # type: ignore[arg-type]
    return split_groups(src.groups, src.val or (), cfg, seed)


def _every(ds: Dataset) -> range:
    return range(len(ds))  # type: ignore[arg-type]


def placed_on(cfg: DataConfig, device: torch.device | None, ds: Dataset) -> torch.device | None:
    """The device a split is held on (`data.placement`), or None for a DataLoader."""
    if device is None or cfg.placement == "loader" or not supports(ds):
        return None
    if cfg.placement == "auto" and device.type != "cuda":
        return None  # on a CPU a DataLoader costs little beside the step
    return device


def _train_loader(ds: Dataset, indices: Sequence[int], cfg: DataConfig, seed: int, stream: int,
                  rank: int, world: int, pin_memory: bool,
                  device: torch.device | None = None, held: dict | None = None) -> DataLoader:
    sampler = EpochSampler(indices, shuffle=True, seed=seed, stream=stream, rank=rank,
                           world_size=world)
    if placed_on(cfg, device, ds) is not None:
        images, labels, transform = on_device(ds, device, held)  # type: ignore[arg-type]
        return DeviceBatches(images, labels, sampler, cfg.batch_size,  # type: ignore[return-value]
                             len(sampler) >= cfg.batch_size, transform,
                             mix_seed(seed, Stream.WORKERS, stream, 0))
    # Workers are not persistent: each epoch starts them afresh with seeds from (seed, epoch),
    # so the augmentation of an epoch does not depend on earlier epochs (exact resume).
    return DataLoader(ds, batch_size=cfg.batch_size, sampler=sampler, num_workers=cfg.workers,
                      pin_memory=pin_memory, drop_last=len(sampler) >= cfg.batch_size,
                      persistent_workers=False,
                      generator=seeded_generator(seed, Stream.WORKERS, stream, 0))


def _eval_loader(ds: Dataset, indices: Sequence[int], cfg: DataConfig, rank: int, world: int,
                 pin_memory: bool, device: torch.device | None = None,
                 held: dict | None = None) -> DataLoader:
    sampler = EpochSampler(indices, shuffle=False, rank=rank, world_size=world, pad=False)
    if placed_on(cfg, device, ds) is not None:
        images, labels, transform = on_device(ds, device, held)  # type: ignore[arg-type]
        return DeviceBatches(images, labels, sampler,  # type: ignore[return-value]
                             cfg.eval_batch_size, False, transform)
    return DataLoader(ds, batch_size=cfg.eval_batch_size, sampler=sampler,
                      num_workers=cfg.workers, pin_memory=pin_memory, drop_last=False,
                      persistent_workers=cfg.workers > 0,
                      generator=torch.Generator().manual_seed(0))


def _iterate(loader: DataLoader, start: int) -> Iterator[Any]:
    if start:
        loader.sampler.skip_next(start * loader.batch_size)  # type: ignore[union-attr]
    return iter(loader)


def _set_epoch(loaders: Sequence[tuple[DataLoader, int]], seed: int, epoch: int) -> None:
    for loader, stream in loaders:
        loader.sampler.set_epoch(epoch)
        loader.generator.manual_seed(mix_seed(seed, Stream.WORKERS, stream, epoch))  # worker seeds


@dataclass(frozen=True)
class SearchData:
    """Loaders of a search: w (weights) and θ (architecture) from disjoint parts of the training
    set, val (held out from it, eval transforms, for selection; None when val_fraction is 0) and
    test (the dataset's test split). Index tuples point into the training set."""

    w_loader: DataLoader
    theta_loader: DataLoader
    val_loader: DataLoader | None
    test_loader: DataLoader
    num_classes: int
    w_indices: tuple[int, ...]
    theta_indices: tuple[int, ...]
    val_indices: tuple[int, ...]
    seed: int
    # The weight split under eval transforms, in a fixed order: for re-estimating BatchNorm
    # statistics of one path (no augmentation, so it draws no random numbers).
    calib_loader: DataLoader | None = None
    class_names: tuple[str, ...] = ()  # label i is class class_names[i]
    # `data.classes`: the dataset's class indices kept, in label order (None: every class)
    class_indices: tuple[int, ...] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass over w/θ use epoch `epoch`'s order, a function of (seed, epoch).

        Augmentation draws from torch's RNG: with workers > 0 each worker is seeded from
        (seed, epoch) too (unless workers persist); with workers == 0 it is the caller's RNG.
        """
        _set_epoch([(self.w_loader, Stream.W), (self.theta_loader, Stream.THETA)], self.seed, epoch)

    def iterate(self, loader: DataLoader, start: int = 0) -> Iterator[Any]:
        """The next pass over `loader` (w or θ) from batch `start` on: the skipped batches are
        not loaded, and the rest are the ones an uninterrupted pass would yield (resume)."""
        return _iterate(loader, start)


@dataclass(frozen=True)
class TrainData:
    """Loaders to retrain a child: train = the search's w ∪ θ parts, val and test as in search."""

    train_loader: DataLoader
    val_loader: DataLoader | None
    test_loader: DataLoader
    num_classes: int
    train_indices: tuple[int, ...]
    val_indices: tuple[int, ...]
    seed: int
    class_names: tuple[str, ...] = ()  # as SearchData's
    class_indices: tuple[int, ...] | None = None

    def set_epoch(self, epoch: int) -> None:
        _set_epoch([(self.train_loader, Stream.TRAIN)], self.seed, epoch)

    def iterate(self, loader: DataLoader, start: int = 0) -> Iterator[Any]:
        """The next pass over `loader` from batch `start` on (see SearchData.iterate)."""
        return _iterate(loader, start)


def build_search_data(cfg: DataConfig, input_size: int | Sequence[int], in_channels: int,
                      num_classes: int, seed: int, distributed: tuple[int, int] | None = None,
                      *, pin_memory: bool = False, device: torch.device | None = None
                      ) -> SearchData:
    """w / θ / val / test loaders for a search; `distributed` is (rank, world_size); `device`:
    the training device (`data.placement` may hold the splits there)."""
    rank, world = check_distributed(distributed)
    src = load_source(cfg, input_size, in_channels, num_classes, seed)
    w, theta, val = split_source(src, cfg, seed)
    at = (rank, world, pin_memory, device, {})  # the {}: uploads shared by the loaders
    return SearchData(
        w_loader=_train_loader(src.train, w, cfg, seed, Stream.W, *at),
        theta_loader=_train_loader(src.train, theta, cfg, seed, Stream.THETA, *at),
        val_loader=_eval_loader(src.train_eval, val, cfg, *at) if val else None,
        test_loader=_eval_loader(src.test, _every(src.test), cfg, *at),
        num_classes=src.num_classes, w_indices=w, theta_indices=theta, val_indices=val,
        seed=seed, calib_loader=_eval_loader(src.train_eval, w, cfg, *at),
        class_names=src.names, class_indices=src.kept,
    )


def build_train_data(cfg: DataConfig, input_size: int | Sequence[int], in_channels: int,
                     num_classes: int, seed: int, distributed: tuple[int, int] | None = None,
                     *, pin_memory: bool = False, device: torch.device | None = None
                     ) -> TrainData:
    """Loaders to retrain a child: w ∪ θ for training; val and test exactly as the search's."""
    rank, world = check_distributed(distributed)
    src = load_source(cfg, input_size, in_channels, num_classes, seed)
    w, theta, val = split_source(src, cfg, seed)
    train = tuple(sorted(w + theta))
    at = (rank, world, pin_memory, device, {})  # the {}: uploads shared by the loaders
    return TrainData(
        train_loader=_train_loader(src.train, train, cfg, seed, Stream.TRAIN, *at),
        val_loader=_eval_loader(src.train_eval, val, cfg, *at) if val else None,
        test_loader=_eval_loader(src.test, _every(src.test), cfg, *at),
        num_classes=src.num_classes, train_indices=train, val_indices=val, seed=seed,
        class_names=src.names, class_indices=src.kept,
    )


def build_eval_data(cfg: DataConfig, input_size: int | Sequence[int], in_channels: int,
                    num_classes: int, seed: int, split: str = "val",
                    distributed: tuple[int, int] | None = None, *,
                    pin_memory: bool = False) -> DataLoader:
    """One evaluation loader: `val` (the search's held-out part, same seed -> same indices) or
    `test` (the dataset's test split)."""
    if split not in SPLITS:
        raise FbnasError(f"split: must be one of {', '.join(SPLITS)}; got {split!r}")
    rank, world = check_distributed(distributed)
    src = load_source(cfg, input_size, in_channels, num_classes, seed)
    if split == "test":
        return _eval_loader(src.test, _every(src.test), cfg, rank, world, pin_memory)
    _, _, val = split_source(src, cfg, seed)
    if not val:
        raise FbnasError(f"{cfg.where}.val_fraction: is 0, so there is no validation split; "
                         "evaluate on split 'test' or set a val_fraction > 0")
    return _eval_loader(src.train_eval, val, cfg, rank, world, pin_memory)




def calibration_images(cfg: DataConfig, input_size: int | Sequence[int], in_channels: int,
                       num_classes: int, seed: int, n: int) -> torch.Tensor:
    """The first `n` training images (the w ∪ θ part a child trains on, without
    augmentation), as one N×C×H×W tensor: what a post-training int8 quantization observes its
    activation ranges on (`fbnas export --quantize int8`)."""
    src = load_source(cfg, input_size, in_channels, num_classes, seed)
    w, theta, _ = split_source(src, cfg, seed)
    idx = sorted(w + theta)[:n]
    return torch.stack([src.train_eval[i][0] for i in idx]) if idx else \
        torch.empty(0, in_channels, *((input_size,) * 2 if isinstance(input_size, int)
                                      else input_size))


def take_images(loader: DataLoader, limit: int, device: torch.device) -> Iterator[torch.Tensor]:
    """The first `limit` images of `loader` (labels dropped), batch by batch, on `device`: the
    BatchNorm re-estimation batches of validation and `fbnas fidelity`."""
    n = 0
    for x, _ in loader:
        if n >= limit:
            return
        x = x[: limit - n]
        n += len(x)
        yield x.to(device, non_blocking=True)
