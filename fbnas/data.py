"""Datasets and loaders for search and retraining, with disjoint w / θ / val / test splits.

The training set of a dataset is split once, by a seeded permutation, into three disjoint
index lists: `val` (model selection), `w` (supernet weights) and `θ` (architecture
parameters). The dataset's own test split is never used for selection. Every training loader
draws its order from (seed, stream, epoch) through `EpochSampler`, so an epoch's order does not
depend on what ran before it, and a resumed run sees the same batches.

Datasets (`data.dataset`):

- `digits`: scikit-learn's bundled 8x8 digits (1797 images, no download); a fixed, stratified
  20% is the test split.
- `cifar10`, `cifar100`: torchvision's CIFAR from `data.root` (`download: true` fetches it).
- `imagefolder`: `data.root/train/<class>/*` and `data.root/val/<class>/*`; validation is
  carved from train/, and val/ is the test split.
- `synthetic`: seeded random images and labels, for benchmarks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from fbnas.errors import FbnasError
from fbnas.io import read_fields, setting

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "synthetic")
NEEDS_ROOT = ("cifar10", "cifar100", "imagefolder")
SPLITS = ("val", "test")

DIGITS_MEAN, DIGITS_STD = 0.3053, 0.3760  # pixel statistics of load_digits().images / 16
DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0  # the digits test split is fixed, whatever the run's seed
CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
LUMA = (0.299, 0.587, 0.114)  # what torchvision's Grayscale uses
SYNTHETIC_CACHE_FLOATS = 1 << 24  # precompute synthetic images up to 64 MiB, else draw per item
DIGITS_CACHE_FLOATS = 1 << 22

# Independent random streams derived from the run's seed.
_SPLIT, _W, _THETA, _TRAIN, _SYNTH_TRAIN, _SYNTH_TEST, _WORKERS = range(1, 8)


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataConfig:
    """The `data:` section of a config. `batch_size` is per process under distributed runs."""

    dataset: str = setting("digits", "str", choices=DATASETS)
    # cifar*: torchvision root; imagefolder: holds train/ and val/
    root: str | None = setting(None, "str")
    download: bool = setting(False, "bool")  # cifar only
    batch_size: int = setting(64, "int", min=1)
    eval_batch_size: int = setting(256, "int", min=1)
    workers: int = setting(0, "int", min=0)
    # share of the non-val training part used for weights; rest is θ
    w_fraction: float = setting(0.8, "float")
    # share of the training set held out for model selection
    val_fraction: float = setting(0.1, "float")
    augment: bool = setting(True, "bool")
    # cap on training samples, taken after a seeded shuffle
    limit: int | None = setting(None, "int", min=1)
    synthetic_size: int = setting(512, "int", min=1)
    where: str = field(default="data", compare=False, repr=False)  # for error messages

    def __post_init__(self) -> None:
        w = self.where
        if self.dataset not in DATASETS:
            raise FbnasError(f"{w}.dataset: must be one of {', '.join(DATASETS)}; "
                             f"got {self.dataset!r}")
        if self.dataset in NEEDS_ROOT and not self.root:
            what = ("a folder with train/ and val/ subfolders" if self.dataset == "imagefolder"
                    else "the torchvision dataset folder")
            raise FbnasError(f"{w}.root: required for dataset {self.dataset} ({what})")
        for key, lo in (("batch_size", 1), ("eval_batch_size", 1), ("workers", 0),
                        ("synthetic_size", 1)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise FbnasError(f"{w}.{key}: must be an integer >= {lo}, got {v!r}")
        if self.limit is not None and (isinstance(self.limit, bool)
                                       or not isinstance(self.limit, int) or self.limit < 1):
            raise FbnasError(f"{w}.limit: must be an integer >= 1 or null, got {self.limit!r}")
        if not 0.0 < self.w_fraction < 1.0:
            raise FbnasError(f"{w}.w_fraction: must be in (0, 1), got {self.w_fraction}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise FbnasError(f"{w}.val_fraction: must be in [0, 1), got {self.val_fraction}")

    @classmethod
    def from_dict(cls, d: Any, where: str = "data") -> DataConfig:
        return read_fields(cls, d, where, where=where)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("where")
        return d


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------


def _mix(*ints: int) -> int:
    """A well-spread 63-bit seed from a tuple of integers (seed, stream, epoch, ...)."""
    words = np.random.SeedSequence([int(i) % (1 << 64) for i in ints]).generate_state(2)
    return ((int(words[0]) << 32) | int(words[1])) & ((1 << 63) - 1)


def _generator(*ints: int) -> torch.Generator:
    return torch.Generator().manual_seed(_mix(*ints))


def _check_distributed(distributed: tuple[int, int] | None) -> tuple[int, int]:
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
        self.rank, self.world_size = _check_distributed((rank, world_size))
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
            perm = torch.randperm(len(idx), generator=_generator(self.seed, self.stream, epoch))
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
    perm = torch.randperm(n_train, generator=_generator(seed, _SPLIT)).tolist()
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


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------


class _Transformed(Dataset):
    """A view of a (PIL image, label) dataset with its own transform."""

    def __init__(self, base: Dataset, transform: Any):
        self.base = base
        self.transform = transform

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img, y = self.base[i]
        return self.transform(img), int(y)


def _base_grid(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel-centre coordinates in [-1, 1] (align_corners=False), as (1, H, W) x and y."""
    ys = (torch.arange(h, dtype=torch.float32) * 2 + 1) / h - 1
    xs = (torch.arange(w, dtype=torch.float32) * 2 + 1) / w - 1
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return gx[None], gy[None]


def _affine(x: torch.Tensor, base: tuple[torch.Tensor, torch.Tensor], angle_deg: float,
            tx: float, ty: float) -> torch.Tensor:
    """Rotate (degrees) and shift (pixels) a (1, C, H, W) image about its centre, zero fill.

    The sampling grid is built with element-wise ops (no affine_grid): its batched matmul
    wakes the BLAS thread pool, which costs milliseconds per image on a busy small machine.
    """
    _, _, h, w = x.shape
    a = math.radians(angle_deg)
    cos, sin = math.cos(a), math.sin(a)
    gx, gy = base
    sx = gx * cos - gy * (sin * h / w) - 2.0 * tx / w
    sy = gx * (sin * w / h) + gy * cos - 2.0 * ty / h
    grid = torch.stack((sx, sy), dim=-1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


class DigitsDataset(Dataset):
    """8x8 grey digits in [0, 1], scaled to fit (H, W) and centred, normalised; the grey channel
    is repeated to `channels`. With `augment`: shift ±2 px (at 8x8 scale) and rotate ±10°."""

    MAX_SHIFT, MAX_DEG = 2.0, 10.0

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, size: tuple[int, int],
                 channels: int, augment: bool):
        self.images = images  # (N, 8, 8) float in [0, 1]
        self.labels = labels
        self.size = size
        self.channels = channels
        self.augment = augment
        self.side = min(size)
        self._grid = _base_grid(*size)
        self._cache = None
        if len(images) * size[0] * size[1] <= DIGITS_CACHE_FLOATS:
            self._cache = self._fit(images[:, None])

    def _fit(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 1, 8, 8) -> (N, 1, H, W): resize to the shorter side, zero-pad the longer one."""
        x = F.interpolate(x, size=(self.side, self.side), mode="bilinear", align_corners=False,
                          antialias=self.side < x.shape[-1])
        h, w = self.size
        top, left = (h - self.side) // 2, (w - self.side) // 2
        return F.pad(x, (left, w - self.side - left, top, h - self.side - top))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self._cache[i:i + 1] if self._cache is not None else self._fit(self.images[i:i + 1,
                                                                                       None])
        if self.augment:
            r = torch.rand(3).mul_(2).sub_(1).tolist()  # torch's RNG: seeded per worker
            px = self.side / 8.0
            x = _affine(x, self._grid, r[0] * self.MAX_DEG, r[1] * self.MAX_SHIFT * px,
                        r[2] * self.MAX_SHIFT * px)
        x = (x[0] - DIGITS_MEAN) / DIGITS_STD
        return x.expand(self.channels, -1, -1).contiguous(), int(self.labels[i])


class SyntheticDataset(Dataset):
    """`n` random N(0, 1) images with labels uniform in [0, num_classes), fixed by `seed`."""

    def __init__(self, n: int, shape: tuple[int, int, int], num_classes: int, seed: int):
        self.n, self.shape, self.num_classes = n, shape, num_classes
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(num_classes, (n,), generator=g)
        self.base = int(torch.randint(1 << 62, (1,), generator=g))
        self.images = None
        if n * math.prod(shape) <= SYNTHETIC_CACHE_FLOATS:
            self.images = torch.randn((n, *shape), generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.images is not None:
            x = self.images[i]
        else:
            x = torch.randn(self.shape, generator=torch.Generator().manual_seed(self.base + i))
        return x, int(self.labels[i])


@dataclass
class _Source:
    """A dataset's training set under train and eval transforms, its test split, classes."""

    train: Dataset  # training transforms (augmentation)
    train_eval: Dataset  # the same samples, eval transforms
    test: Dataset
    num_classes: int


@functools.lru_cache(maxsize=1)
def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


def digits_split() -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices into load_digits(): a fixed, stratified 20% test split, sorted."""
    from sklearn.model_selection import train_test_split

    target = _load_digits()[1]
    tr, te = train_test_split(np.arange(len(target)), test_size=DIGITS_TEST_FRACTION,
                              stratify=target, random_state=DIGITS_SPLIT_SEED)
    return np.sort(tr), np.sort(te)


def _digits(cfg: DataConfig, size: tuple[int, int], channels: int) -> _Source:
    images, target = _load_digits()
    tr, te = digits_split()
    xtr, ytr = torch.from_numpy(images[tr]), torch.from_numpy(target[tr])
    xte, yte = torch.from_numpy(images[te]), torch.from_numpy(target[te])
    return _Source(
        train=DigitsDataset(xtr, ytr, size, channels, augment=cfg.augment),
        train_eval=DigitsDataset(xtr, ytr, size, channels, augment=False),
        test=DigitsDataset(xte, yte, size, channels, augment=False),
        num_classes=10,
    )


def _synthetic(cfg: DataConfig, size: tuple[int, int], channels: int, num_classes: int,
               seed: int) -> _Source:
    shape = (channels, *size)
    train = SyntheticDataset(cfg.synthetic_size, shape, num_classes, _mix(seed, _SYNTH_TRAIN))
    test = SyntheticDataset(max(cfg.synthetic_size // 4, 1), shape, num_classes,
                            _mix(seed, _SYNTH_TEST))
    return _Source(train, train, test, num_classes)


def _rgb_tail(stats: tuple[tuple[float, ...], tuple[float, ...]], channels: int,
              cfg: DataConfig) -> list[Any]:
    from torchvision import transforms as T

    mean, std = stats
    if channels == 3:
        return [T.ToTensor(), T.Normalize(mean, std)]
    if channels == 1:
        gm = sum(w * m for w, m in zip(LUMA, mean, strict=True))
        gs = sum(w * s for w, s in zip(LUMA, std, strict=True))
        return [T.Grayscale(1), T.ToTensor(), T.Normalize((gm,), (gs,))]
    raise FbnasError(f"{cfg.where}.dataset: {cfg.dataset} images are RGB; the search space's "
                     f"in_channels must be 1 or 3, got {channels}")


def _root(cfg: DataConfig) -> Path:
    root = Path(cfg.root or "").expanduser()
    if not root.is_dir() and not (cfg.download and not root.exists()):
        why = "is not a folder" if root.exists() else "no such folder"
        raise FbnasError(f"{cfg.where}.root: {root}: {why}")
    return root


def _cifar(cfg: DataConfig, size: tuple[int, int], channels: int) -> _Source:
    from torchvision import datasets
    from torchvision import transforms as T

    root = _root(cfg)
    cls = datasets.CIFAR10 if cfg.dataset == "cifar10" else datasets.CIFAR100
    folder = cls.base_folder
    try:
        train = cls(str(root), train=True, download=cfg.download)
        test = cls(str(root), train=False, download=False)
    except RuntimeError:
        raise FbnasError(
            f"{cfg.where}.root: {root} holds no {cfg.dataset.upper()} data (expected "
            f"{root / folder}/ from the python version of the dataset, as torchvision "
            f"downloads it); set {cfg.where}.download: true to fetch it") from None
    except OSError as e:
        raise FbnasError(f"{cfg.where}.root: cannot read or download {cfg.dataset} into "
                         f"{root} ({e})") from None
    resize = [] if size == (32, 32) else [T.Resize(size, antialias=True)]
    aug = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()] if cfg.augment else []
    tail = _rgb_tail(CIFAR_STATS[cfg.dataset], channels, cfg)
    train_tf, eval_tf = T.Compose(aug + resize + tail), T.Compose(resize + tail)
    return _Source(_Transformed(train, train_tf), _Transformed(train, eval_tf),
                   _Transformed(test, eval_tf), len(train.classes))


def _imagefolder(cfg: DataConfig, size: tuple[int, int], channels: int) -> _Source:
    from torchvision import datasets
    from torchvision import transforms as T

    root = _root(cfg)
    for part in ("train", "val"):
        if not (root / part).is_dir():
            raise FbnasError(f"{cfg.where}.root: {root} has no {part}/ folder (expected "
                             f"{root}/train/<class>/<image> and {root}/val/<class>/<image>)")
    found = {}
    for part in ("train", "val"):
        try:
            found[part] = datasets.ImageFolder(str(root / part))
        except OSError as e:  # FileNotFoundError: no class folders, or no images in them
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise FbnasError(f"{cfg.where}.root: {root / part}: {why}") from None
    train, val = found["train"], found["val"]
    if train.class_to_idx != val.class_to_idx:
        only = sorted(set(train.classes) ^ set(val.classes))
        raise FbnasError(f"{cfg.where}.root: {root}: train/ and val/ hold different classes "
                         f"(in one only: {', '.join(only[:5]) or 'none'})")
    resize = round(min(size) / 0.875)
    tail = _rgb_tail(IMAGENET_STATS, channels, cfg)
    eval_tf = T.Compose([T.Resize(resize, antialias=True), T.CenterCrop(size), *tail])
    train_tf = (T.Compose([T.RandomResizedCrop(size, antialias=True), T.RandomHorizontalFlip(),
                           *tail]) if cfg.augment else eval_tf)
    return _Source(_Transformed(train, train_tf), _Transformed(train, eval_tf),
                   _Transformed(val, eval_tf), len(train.classes))


def _hw(input_size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(input_size, int) and not isinstance(input_size, bool):
        input_size = (input_size, input_size)
    try:
        h, w = (int(v) for v in input_size)
    except (TypeError, ValueError):
        raise FbnasError(f"input_size: expected an integer or (H, W), got {input_size!r}") from None
    if h < 1 or w < 1:
        raise FbnasError(f"input_size: must be positive, got {input_size!r}")
    return h, w


def _source(cfg: DataConfig, input_size: int | Sequence[int], in_channels: int,
            num_classes: int, seed: int) -> _Source:
    size = _hw(input_size)
    if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
        raise FbnasError(f"in_channels: must be a positive integer, got {in_channels!r}")
    if cfg.dataset == "digits":
        src = _digits(cfg, size, in_channels)
    elif cfg.dataset == "synthetic":
        src = _synthetic(cfg, size, in_channels, num_classes, seed)
    elif cfg.dataset == "imagefolder":
        src = _imagefolder(cfg, size, in_channels)
    else:
        src = _cifar(cfg, size, in_channels)
    if src.num_classes != num_classes:
        raise FbnasError(f"{cfg.where}.dataset: {cfg.dataset} has {src.num_classes} classes "
                         f"but the search space has num_classes={num_classes}; set the "
                         f"space's num_classes to {src.num_classes}")
    return src


# ---------------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------------


def _every(ds: Dataset) -> range:
    return range(len(ds))  # type: ignore[arg-type]


def _train_loader(ds: Dataset, indices: Sequence[int], cfg: DataConfig, seed: int, stream: int,
                  rank: int, world: int, pin_memory: bool) -> DataLoader:
    sampler = EpochSampler(indices, shuffle=True, seed=seed, stream=stream, rank=rank,
                           world_size=world)
    # Workers are not persistent: each epoch starts them afresh with seeds from (seed, epoch),
    # so the augmentation of an epoch does not depend on earlier epochs (exact resume).
    return DataLoader(ds, batch_size=cfg.batch_size, sampler=sampler, num_workers=cfg.workers,
                      pin_memory=pin_memory, drop_last=len(sampler) >= cfg.batch_size,
                      persistent_workers=False,
                      generator=_generator(seed, _WORKERS, stream, 0))


def _eval_loader(ds: Dataset, indices: Sequence[int], cfg: DataConfig, rank: int, world: int,
                 pin_memory: bool) -> DataLoader:
    sampler = EpochSampler(indices, shuffle=False, rank=rank, world_size=world, pad=False)
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
        loader.generator.manual_seed(_mix(seed, _WORKERS, stream, epoch))  # worker seeds


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

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass over w/θ use epoch `epoch`'s order, a function of (seed, epoch).

        Augmentation draws from torch's RNG: with workers > 0 each worker is seeded from
        (seed, epoch) too (unless workers persist); with workers == 0 it is the caller's RNG.
        """
        _set_epoch([(self.w_loader, _W), (self.theta_loader, _THETA)], self.seed, epoch)

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

    def set_epoch(self, epoch: int) -> None:
        _set_epoch([(self.train_loader, _TRAIN)], self.seed, epoch)

    def iterate(self, loader: DataLoader, start: int = 0) -> Iterator[Any]:
        """The next pass over `loader` from batch `start` on (see SearchData.iterate)."""
        return _iterate(loader, start)


def build_search_data(cfg: DataConfig, input_size: int | Sequence[int], in_channels: int,
                      num_classes: int, seed: int, distributed: tuple[int, int] | None = None,
                      *, pin_memory: bool = False) -> SearchData:
    """w / θ / val / test loaders for a search; `distributed` is (rank, world_size)."""
    rank, world = _check_distributed(distributed)
    src = _source(cfg, input_size, in_channels, num_classes, seed)
    w, theta, val = split_indices(len(src.train), cfg, seed)  # type: ignore[arg-type]
    return SearchData(
        w_loader=_train_loader(src.train, w, cfg, seed, _W, rank, world, pin_memory),
        theta_loader=_train_loader(src.train, theta, cfg, seed, _THETA, rank, world, pin_memory),
        val_loader=(_eval_loader(src.train_eval, val, cfg, rank, world, pin_memory)
                    if val else None),
        test_loader=_eval_loader(src.test, _every(src.test), cfg, rank, world, pin_memory),
        num_classes=src.num_classes, w_indices=w, theta_indices=theta, val_indices=val,
        seed=seed, calib_loader=_eval_loader(src.train_eval, w, cfg, rank, world, pin_memory),
    )


def build_train_data(cfg: DataConfig, input_size: int | Sequence[int], in_channels: int,
                     num_classes: int, seed: int, distributed: tuple[int, int] | None = None,
                     *, pin_memory: bool = False) -> TrainData:
    """Loaders to retrain a child: w ∪ θ for training; val and test exactly as the search's."""
    rank, world = _check_distributed(distributed)
    src = _source(cfg, input_size, in_channels, num_classes, seed)
    w, theta, val = split_indices(len(src.train), cfg, seed)  # type: ignore[arg-type]
    train = tuple(sorted(w + theta))
    return TrainData(
        train_loader=_train_loader(src.train, train, cfg, seed, _TRAIN, rank, world, pin_memory),
        val_loader=(_eval_loader(src.train_eval, val, cfg, rank, world, pin_memory)
                    if val else None),
        test_loader=_eval_loader(src.test, _every(src.test), cfg, rank, world, pin_memory),
        num_classes=src.num_classes, train_indices=train, val_indices=val, seed=seed,
    )


def build_eval_data(cfg: DataConfig, input_size: int | Sequence[int], in_channels: int,
                    num_classes: int, seed: int, split: str = "val",
                    distributed: tuple[int, int] | None = None, *,
                    pin_memory: bool = False) -> DataLoader:
    """One evaluation loader: `val` (the search's held-out part, same seed -> same indices) or
    `test` (the dataset's test split)."""
    if split not in SPLITS:
        raise FbnasError(f"split: must be one of {', '.join(SPLITS)}; got {split!r}")
    rank, world = _check_distributed(distributed)
    src = _source(cfg, input_size, in_channels, num_classes, seed)
    if split == "test":
        return _eval_loader(src.test, _every(src.test), cfg, rank, world, pin_memory)
    _, _, val = split_indices(len(src.train), cfg, seed)  # type: ignore[arg-type]
    if not val:
        raise FbnasError(f"{cfg.where}.val_fraction: is 0, so there is no validation split; "
                         "evaluate on split 'test' or set a val_fraction > 0")
    return _eval_loader(src.train_eval, val, cfg, rank, world, pin_memory)


__all__ = [
    "DATASETS", "DataConfig", "DigitsDataset", "EpochSampler", "SearchData", "SyntheticDataset",
    "TrainData", "build_eval_data", "build_search_data", "build_train_data", "digits_split",
    "split_indices",
]
