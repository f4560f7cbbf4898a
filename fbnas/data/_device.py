"""A small dataset's split held on the training device (`data.placement: device`).

For data that fits (digits, synthetic, CIFAR: 150 MB as uint8), per-sample loading in a
DataLoader — a Python call, an augmentation and a host-to-device copy per image — can cost
more than a small supernet's step on a GPU. `DeviceBatches` stands in for the DataLoader: the
whole split lives on the device as one tensor, a batch is one `index_select`, and augmentation
is one batched op on the device. The order of the samples is the DataLoader path's (the same
`EpochSampler`, so resuming mid-epoch skips the same samples); augmentation draws from a
device generator seeded by (epoch seed, batch number), so a resumed epoch augments its
remaining batches exactly as an uninterrupted one would. The draws differ from the DataLoader
path's (per-sample CPU RNG), so the two placements are two valid, reproducible runs, not the
same run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from fbnas.data.sampling import EpochSampler, mix_seed
from fbnas.data.sources import (
    LUMA,
    DigitsDataset,
    SyntheticDataset,
    _Transformed,
    turn_shift,
)

Transform = Callable[[torch.Tensor, torch.Generator | None], torch.Tensor]


def supports(ds: object) -> bool:
    """Whether `ds` can be held on the device: digits, synthetic data, or a CIFAR view whose
    transform the device can apply (the default padded crop and flip, or none)."""
    return isinstance(ds, (DigitsDataset, SyntheticDataset)) or (
        isinstance(ds, _Transformed) and ds.device_spec is not None)


class DeviceBatches:
    """The DataLoader interface the trainers use (len, iteration, `sampler`, `batch_size`,
    `generator`) over a split held on `device` (see the module docstring)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, sampler: EpochSampler,
                 batch_size: int, drop_last: bool, transform: Transform | None,
                 seed: int = 0):
        self.images, self.labels = images, labels
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self.transform = transform
        # seeded per epoch by the data's set_epoch (as a DataLoader's worker seeds are)
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        first = self.sampler._skip // self.batch_size  # resuming at batch `first`
        order = list(iter(self.sampler))
        base = self.generator.initial_seed()
        dev = self.images.device
        for b, i in enumerate(range(0, len(order), self.batch_size)):
            idx = order[i:i + self.batch_size]
            if self.drop_last and len(idx) < self.batch_size:
                return
            at = torch.as_tensor(idx, device=dev)
            x = self.images.index_select(0, at)
            if self.transform is not None:
                g = torch.Generator(device=dev).manual_seed(mix_seed(base, first + b))
                x = self.transform(x, g)
            yield x, self.labels.index_select(0, at)


def on_device(ds: DigitsDataset | SyntheticDataset | _Transformed, device: torch.device,
              held: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, Transform]:
    """(images, labels, transform) of `ds` on `device`: what `ds[i]` would give, batched.
    `held` (one dict per set of loaders) shares the uploaded tensors between views of the
    same data — a split's training and evaluation views, the w and θ loaders — so that each
    is put on the device once."""
    held = {} if held is None else held

    def upload(key: tuple, make: Callable[[], tuple[torch.Tensor, torch.Tensor]]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if key not in held:
            held[key] = tuple(t.to(device) for t in make())
        return held[key]

    if isinstance(ds, _Transformed):
        images, labels = upload(("cifar", id(ds.base)), lambda: (
            torch.as_tensor(ds.base.data).permute(0, 3, 1, 2).contiguous(),
            torch.as_tensor(list(ds.base.targets), dtype=torch.long)))
        return images, labels, _cifar_transform(ds.device_spec, device)
    if isinstance(ds, SyntheticDataset):
        images, labels = upload(("synthetic", id(ds)), lambda: (
            ds.images if ds.images is not None
            else torch.stack([ds[i][0] for i in range(len(ds))]), ds.labels))
        return images, labels, lambda x, g: x
    images, labels = upload(("digits", id(ds.images), ds.size), lambda: (
        ds._cache if ds._cache is not None else ds._fit(ds.images[:, None]), ds.labels))
    grid = tuple(t.to(device) for t in ds._grid)
    channels, augment, flip = ds.channels, ds.augment, ds.flip
    px, mean, std = ds.shift_px, ds.mean, ds.std

    def transform(x: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
        n = len(x)
        if augment:  # DigitsDataset's turn and shift, one per image, in one grid_sample
            r = torch.rand(n, 3, generator=g, device=x.device).mul_(2).sub_(1)
            a = torch.deg2rad(r[:, 0] * ds.MAX_DEG)[:, None, None]
            tx = (r[:, 1] * ds.MAX_SHIFT * px)[:, None, None]
            ty = (r[:, 2] * ds.MAX_SHIFT * px)[:, None, None]
            x = turn_shift(x, grid, torch.cos(a), torch.sin(a), tx, ty)
        if flip:
            coin = torch.rand(n, generator=g, device=x.device) < 0.5
            x = torch.where(coin[:, None, None, None], x.flip(-1), x)
        x = (x - mean) / std
        return x.expand(-1, channels, -1, -1).contiguous()

    return images, labels, transform


def _cifar_transform(spec: dict, device: torch.device) -> Transform:
    """The transform of a CIFAR view held on the device as uint8 (N, 3, 32, 32):
    RandomCrop(32, padding=4) and a horizontal flip (as configured), Resize to the space's
    input size, greyscale for one input channel, ToTensor + Normalize. At 32x32 with 3
    channels a batch equals the DataLoader path's pixels for the same crops and flips; a
    resize (torch's antialiased bilinear, not PIL's) or greyscale (float, not PIL's rounding
    to 8 bits) differ from it in the last bits."""
    size, channels = tuple(spec["size"]), spec["channels"]
    mean, std = (torch.tensor(v, device=device).view(1, 3, 1, 1) for v in spec["stats"])
    luma = torch.tensor(LUMA, device=device).view(1, 3, 1, 1)
    crop, flip = spec["crop"], spec["flip"]
    ar = torch.arange(32, device=device)

    def transform(x: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
        x = x.float().div_(255)
        n = len(x)
        if crop:  # 4 px of zeros around, a random 32x32 window per image
            xp = F.pad(x, (4, 4, 4, 4))
            oy, ox = torch.randint(0, 9, (2, n), generator=g, device=x.device)
            rows = (oy[:, None] + ar)[:, None, :, None]  # (n, 1, 32, 1)
            cols = (ox[:, None] + ar)[:, None, None, :]  # (n, 1, 1, 32)
            x = xp[torch.arange(n, device=x.device)[:, None, None, None],
                   torch.arange(3, device=x.device)[None, :, None, None], rows, cols]
        if flip:
            coin = torch.rand(n, generator=g, device=x.device) < 0.5
            x = torch.where(coin[:, None, None, None], x.flip(-1), x)
        if size != (32, 32):
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False,
                              antialias=True)
        if channels == 1:
            m = (luma * mean).sum(1, keepdim=True)
            s = (luma * std).sum(1, keepdim=True)
            return ((x * luma).sum(1, keepdim=True) - m) / s
        return (x - mean) / std

    return transform
