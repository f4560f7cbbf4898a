"""Datasets: digits, cluttered digits, CIFAR, ImageFolder, synthetic, and their transforms.

torchvision (about 1.1 s to import on the 2-core VM, after torch) is imported inside the
functions that load the datasets that need it, so a run pays only for the dataset it uses; the
bundled digits are read from scikit-learn's data file without importing scikit-learn (about
0.9 s), and their test split is declared here (`DIGITS_TEST_MASK`).

Over the ~450-line guide (docs/architecture.md): every dataset's loader sits here beside the
one dispatch (`load_source`) that chooses among them; cluttered digits' drawing lives apart, in
`fbnas.data.clutter`. Splitting the loaders one module each is the next step if it grows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from fbnas.data.clutter import Canvases, draw, scale_digits
from fbnas.data.config import DataConfig
from fbnas.data.sampling import Stream, mix_seed, seeded_generator
from fbnas.errors import FbnasError

DIGITS_MEAN, DIGITS_STD = 0.3053, 0.3760  # pixel statistics of load_digits().images / 16
# the fixed test split of the 1,797 digits: bit i (most significant first) set where sample i
# is a test sample. It is scikit-learn's `train_test_split(range(1797), test_size=0.2,
# stratify=target, random_state=0)` (360 test samples), written out so that the split does not
# depend on the installed scikit-learn and loading the digits does not import it; the slow tier
# checks it against scikit-learn (tests/data/test_sampling.py)
DIGITS_TEST_MASK = (
    "000004883524104000064100934205001a00080100240028062c12001000940a009019120420f8a0028110a0"
    "00080a8820441524494240a00a0000004004d80000818020004805c400104008a0100005404800301000020e"
    "c409000224840083a8013c20a6980a0000000b08400804a0184802024041c1008004404684376a8102160044"
    "80004042a0a4180a5000840b8561c608108008004c80c02004068e00010882008100380803c008190000100e"
    "01008410a0210033282904c044c080680e0102830082008822a6402c24042108a860809081a00c0282024212"
    "0138a41500"
)
CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
LUMA = (0.299, 0.587, 0.114)  # what torchvision's Grayscale uses
SYNTHETIC_CACHE_FLOATS = 1 << 24  # precompute synthetic images up to 64 MiB, else draw per item
DIGITS_CACHE_FLOATS = 1 << 22



class _Transformed(Dataset):
    """A view of a (PIL image, label) dataset with its own transform."""

    def __init__(self, base: Dataset, transform: Any, device_spec: dict | None = None):
        self.base = base
        self.transform = transform
        # what fbnas.data._device needs to apply the same transform to a batch on a device
        # (None: this view is read through a DataLoader only)
        self.device_spec = device_spec

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
    a = math.radians(angle_deg)
    return turn_shift(x, base, math.cos(a), math.sin(a), tx, ty)


def turn_shift(x: torch.Tensor, base: tuple[torch.Tensor, torch.Tensor], cos, sin, tx, ty
               ) -> torch.Tensor:
    """`_affine`'s resampling of (N, C, H, W) images, given the angle's cos and sin and the
    shifts in pixels: floats (one image), or (N, 1, 1) tensors (one turn and shift per image,
    fbnas.data._device)."""
    _, _, h, w = x.shape
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
                 channels: int, augment: bool, flip: bool = False):
        self.images = images  # (N, 8, 8) float in [0, 1]
        self.flip = flip
        self.labels = labels
        self.size = size
        self.channels = channels
        self.augment = augment
        self.side = min(size)
        self._grid = _base_grid(*size)
        # normalisation, and the pixels (at the input size) one unit of MAX_SHIFT moves
        self.mean, self.std, self.shift_px = DIGITS_MEAN, DIGITS_STD, self.side / 8.0
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
            px = self.shift_px
            x = _affine(x, self._grid, r[0] * self.MAX_DEG, r[1] * self.MAX_SHIFT * px,
                        r[2] * self.MAX_SHIFT * px)
        if self.flip and bool(torch.rand(()) < 0.5):
            x = x.flip(-1)
        x = (x[0] - self.mean) / self.std
        return x.expand(self.channels, -1, -1).contiguous(), int(self.labels[i])


class ClutteredDigitsDataset(DigitsDataset):
    """Canvases of cluttered digits (fbnas.data.clutter) at the input size, normalised by the
    training canvases' mean and sd; the grey channel is repeated to `channels`. With
    `augment`: the digits' turn (±10°) and shift (±2 digit pixels) of the whole canvas.
    `source` and `fragments` say which source digits each canvas was drawn from."""

    def __init__(self, canvases: Canvases, channels: int, augment: bool, mean: float,
                 std: float, digit_size: int):
        self.images = torch.from_numpy(canvases.images)  # (N, H, W)
        self.labels = torch.from_numpy(canvases.labels)
        self.source, self.fragments = canvases.source, canvases.fragments
        self.size = tuple(canvases.images.shape[1:])
        self.channels, self.augment, self.flip = channels, augment, False
        self.side = min(self.size)
        self._grid = _base_grid(*self.size)
        self.mean, self.std, self.shift_px = mean, std, digit_size / 8.0
        self._cache = self.images[:, None]  # already at the input size

    def _fit(self, x: torch.Tensor) -> torch.Tensor:
        return x


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
class Source:
    """A dataset's training set under train and eval transforms, its test split, classes."""

    train: Dataset  # training transforms (augmentation)
    train_eval: Dataset  # the same samples, eval transforms
    test: Dataset
    num_classes: int
    names: tuple[str, ...] = ()  # the class names, in label order
    # `data.classes`: the dataset's class indices kept (label i is class kept[i]); None: all
    kept: tuple[int, ...] | None = None
    # samples drawn from one source image (cluttered_digits): the source of each training
    # sample, and the validation part the data fixes (training indices, whole sources); the
    # w / θ / val split then keeps each source in one part (fbnas.data.sampling.split_groups).
    # None: samples are split one by one (split_indices)
    groups: np.ndarray | None = None
    val: tuple[int, ...] | None = None


def pick_classes(cfg: DataConfig, names: Sequence[str], where_from: str = "") -> tuple[int, ...]:
    """The `data.classes` classes kept of a dataset with classes `names`: sorted indices, drawn
    by `data.class_seed` alone (so search, retrain and eval keep the same ones, whatever the
    run's seed). `where_from` names the data in the error for too many classes."""
    n, have = cfg.classes, len(names)
    if n is None:
        return tuple(range(have))
    if n > have:
        raise FbnasError(f"{cfg.where}.classes: {n} is more than the {have} classes of "
                         f"{cfg.dataset}{where_from}")
    perm = torch.randperm(have, generator=seeded_generator(cfg.class_seed, Stream.CLASSES))
    return tuple(sorted(perm[:n].tolist()))


def _keep_classes(ds: Any, kept: Sequence[int]) -> None:
    """Keep only the samples of classes `kept` in a torchvision CIFAR or ImageFolder dataset,
    in place, with labels renumbered: class kept[i] becomes label i."""
    new = {old: i for i, old in enumerate(kept)}
    targets = list(ds.targets)
    rows = [i for i, t in enumerate(targets) if t in new]
    ds.targets = [new[targets[i]] for i in rows]
    if hasattr(ds, "samples"):  # ImageFolder: (path, label) pairs
        ds.samples = [(ds.samples[i][0], new[targets[i]]) for i in rows]
        ds.imgs = ds.samples
    if hasattr(ds, "data"):  # CIFAR: (N, 32, 32, 3) uint8
        ds.data = ds.data[np.asarray(rows, dtype=np.int64)]
    ds.classes = [ds.classes[k] for k in kept]
    ds.class_to_idx = {c: i for i, c in enumerate(ds.classes)}


@functools.lru_cache(maxsize=1)
def bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits: (images / 16 as float32 (N, 8, 8), labels), as its
    `load_digits()` gives them, read from its data file (`datasets/data/digits.csv.gz`: 64
    pixel columns then the label) without importing scikit-learn."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # finds the package; imports nothing
    if spec is None or spec.origin is None:
        raise FbnasError("data.dataset digits: needs scikit-learn, whose bundled data file "
                         "holds the digits (pip install scikit-learn)")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise FbnasError(f"data.dataset digits: {path} is missing (the scikit-learn "
                         "installed has no bundled digits)")
    raw = np.loadtxt(path, delimiter=",")
    images = raw[:, :-1].reshape(-1, 8, 8)
    return (images / 16.0).astype(np.float32), raw[:, -1].astype(np.int64)


def digits_split() -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices into the bundled digits: the fixed, stratified 20% test split
    (`DIGITS_TEST_MASK`), each sorted."""
    n = len(bundled_digits()[1])
    test = np.unpackbits(np.frombuffer(bytes.fromhex("".join(DIGITS_TEST_MASK)), np.uint8),
                         count=n).astype(bool)
    return np.flatnonzero(~test), np.flatnonzero(test)


def _kept_digits(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                            tuple[str, ...], tuple[int, ...]]:
    """(images, labels, train indices, test indices, names, kept classes) of the bundled
    digits, the fixed split, restricted to `data.classes` with labels renumbered 0..N-1."""
    images, target = bundled_digits()
    tr, te = digits_split()
    names = tuple(str(d) for d in range(10))
    kept = pick_classes(cfg, names)
    if cfg.classes is not None:  # the samples of the kept digits, labels renumbered
        tr, te = (ix[np.isin(target[ix], kept)] for ix in (tr, te))
        target = np.searchsorted(np.asarray(kept), target)  # kept digits -> 0..N-1
    return images, target, tr, te, names, kept


def _digits(cfg: DataConfig, size: tuple[int, int], channels: int) -> Source:
    images, target, tr, te, names, kept = _kept_digits(cfg)
    xtr, ytr = torch.from_numpy(images[tr]), torch.from_numpy(target[tr])
    xte, yte = torch.from_numpy(images[te]), torch.from_numpy(target[te])
    return Source(
        train=DigitsDataset(xtr, ytr, size, channels, augment=cfg.preset == "light",
                            flip=cfg.flips()),
        train_eval=DigitsDataset(xtr, ytr, size, channels, augment=False),
        test=DigitsDataset(xte, yte, size, channels, augment=False),
        num_classes=len(kept), names=tuple(names[k] for k in kept),
        kept=kept if cfg.classes is not None else None,
    )


def _cluttered_digits(cfg: DataConfig, size: tuple[int, int], channels: int) -> Source:
    """The digits' sources split into test (the digits' fixed test split), val (`val_fraction`
    of the rest, drawn by `clutter_seed`) and train *before* any canvas is drawn; each part's
    canvases (fbnas.data.clutter) take their digit and their fragments from that part only.

    The run's w / θ split (by its seed, after drawing) keeps each source's canvases in one part
    (`groups`), so no digit is in both; a fragment in a w canvas may be cut from a θ canvas's
    digit, as both come from the train part: no label of a θ digit reaches w that way (a
    fragment is clutter, under another digit's label), and retraining merges w and θ anyway.
    Val and test share nothing with them."""
    w = cfg.where
    d, fs = cfg.clutter_digit_size, cfg.clutter_fragment_size
    if d > min(size):
        raise FbnasError(f"{w}.clutter_digit_size: {d} does not fit the canvas, the search "
                         f"space's input_size {size[0]}x{size[1]}")
    images, target, tr, te, names, kept = _kept_digits(cfg)  # sources of the kept digits
    perm = torch.randperm(len(tr), generator=seeded_generator(cfg.clutter_seed, Stream.CLUTTER,
                                                             0)).numpy()
    n_val = min(max(round(cfg.val_fraction * len(tr)), 1), len(tr) - 2) if (
        cfg.val_fraction > 0) else 0
    parts = {"train": np.sort(tr[perm[n_val:]]), "val": np.sort(tr[perm[:n_val]]), "test": te}
    if cfg.clutter_fragments:
        for part, src in parts.items():
            if 0 < len(src) < 2:
                raise FbnasError(f"{w}.clutter_fragments: the {part} part has one source "
                                 "digit; its fragments need another (set 0, or keep more "
                                 "digits)")
    scaled = scale_digits(images, d)
    per = {"train": cfg.clutter_per_source, "val": cfg.clutter_per_source,
           "test": cfg.clutter_test_per_source}
    drawn = {part: draw(scaled, target, src, size, cfg.clutter_fragments, fs, per[part],
                        mix_seed(cfg.clutter_seed, Stream.CLUTTER, k))
             for k, (part, src) in enumerate(parts.items(), 1)}
    train = drawn["train"]
    mean, std = float(train.images.mean(dtype=np.float64)), float(train.images.std(
        dtype=np.float64))
    fit = Canvases(*(np.concatenate([getattr(drawn["train"], f), getattr(drawn["val"], f)])
                     for f in ("images", "labels", "source", "fragments")))
    n_train = len(train.labels)

    def view(c: Canvases, augment: bool) -> ClutteredDigitsDataset:
        return ClutteredDigitsDataset(c, channels, augment, mean, max(std, 1e-6), d)

    return Source(
        train=view(fit, cfg.preset == "light"), train_eval=view(fit, False),
        test=view(drawn["test"], False), num_classes=len(kept),
        names=tuple(names[k] for k in kept), kept=kept if cfg.classes is not None else None,
        groups=fit.source, val=tuple(range(n_train, len(fit.labels))))


def _synthetic(cfg: DataConfig, size: tuple[int, int], channels: int, num_classes: int,
               seed: int) -> Source:
    shape = (channels, *size)
    train = SyntheticDataset(cfg.synthetic_size, shape, num_classes,
                             mix_seed(seed, Stream.SYNTH_TRAIN))
    test = SyntheticDataset(max(cfg.synthetic_size // 4, 1), shape, num_classes,
                            mix_seed(seed, Stream.SYNTH_TEST))
    return Source(train, train, test, num_classes, tuple(str(c) for c in range(num_classes)))


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


def _cifar(cfg: DataConfig, size: tuple[int, int], channels: int) -> Source:
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
    kept = _subset(cfg, train, test, f" in {root}")
    resize = [] if size == (32, 32) else [T.Resize(size, antialias=True)]
    aug = _crop_flip(cfg, (32, 32), T)
    tail = _rgb_tail(CIFAR_STATS[cfg.dataset], channels, cfg)
    train_tf, eval_tf = T.Compose(aug + resize + tail), T.Compose(resize + tail)
    on_device = cfg.preset in ("cifar", "none") and cfg.crop_scale is None
    spec = {"size": size, "channels": channels, "stats": CIFAR_STATS[cfg.dataset]}
    train_spec = {**spec, "crop": cfg.preset == "cifar", "flip": cfg.flips()}
    eval_spec = {**spec, "crop": False, "flip": False}
    return Source(_Transformed(train, train_tf, train_spec if on_device else None),
                  _Transformed(train, eval_tf, eval_spec if on_device else None),
                  _Transformed(test, eval_tf, eval_spec if on_device else None),
                  len(train.classes), tuple(train.classes), kept)


def _subset(cfg: DataConfig, train: Any, test: Any, where_from: str) -> tuple[int, ...] | None:
    """`data.classes`: keep the chosen classes in a torchvision train and test set (in place);
    their indices, or None without a subset."""
    if cfg.classes is None:
        return None
    kept = pick_classes(cfg, train.classes, where_from)
    for ds in (train, test):
        _keep_classes(ds, kept)
    return kept


def _imagefolder(cfg: DataConfig, size: tuple[int, int], channels: int) -> Source:
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
    kept = _subset(cfg, train, val, f" in {root / 'train'}")
    resize = round(min(size) / 0.875)
    tail = _rgb_tail(IMAGENET_STATS, channels, cfg)
    eval_tf = T.Compose([T.Resize(resize, antialias=True), T.CenterCrop(size), *tail])
    aug = _crop_flip(cfg, size, T)
    train_tf = T.Compose([*aug, *tail]) if aug else eval_tf
    return Source(_Transformed(train, train_tf), _Transformed(train, eval_tf),
                   _Transformed(val, eval_tf), len(train.classes), tuple(train.classes), kept)


CROP_SCALES = {"light": (0.8, 1.0), "imagenet": (0.08, 1.0)}


def _crop_flip(cfg: DataConfig, size: tuple[int, int], T) -> list:
    """The training crop and flip of the preset (`data.augment`), with `data.crop_scale` and
    `data.flip` overriding its defaults; [] for none."""
    preset = cfg.preset
    if preset == "none":
        return [T.RandomHorizontalFlip()] if cfg.flip else []
    if preset == "cifar" and cfg.crop_scale is None:
        crop = [T.RandomCrop(size, padding=4)]
    else:
        scale = tuple(cfg.crop_scale or CROP_SCALES.get(preset, CROP_SCALES["light"]))
        crop = [T.RandomResizedCrop(size, scale=scale, antialias=True)]
    return crop + ([T.RandomHorizontalFlip()] if cfg.flips() else [])


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


def load_source(cfg: DataConfig, input_size: int | Sequence[int], in_channels: int,
            num_classes: int, seed: int) -> Source:
    size = _hw(input_size)
    if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
        raise FbnasError(f"in_channels: must be a positive integer, got {in_channels!r}")
    if cfg.dataset == "digits":
        src = _digits(cfg, size, in_channels)
    elif cfg.dataset == "cluttered_digits":
        src = _cluttered_digits(cfg, size, in_channels)
    elif cfg.dataset == "synthetic":
        src = _synthetic(cfg, size, in_channels, num_classes, seed)
    elif cfg.dataset == "imagefolder":
        src = _imagefolder(cfg, size, in_channels)
    else:
        src = _cifar(cfg, size, in_channels)
    if src.num_classes != num_classes:
        has = (f"{cfg.where}.classes keeps {src.num_classes} classes of {cfg.dataset}"
               if src.kept is not None else f"{cfg.dataset} has {src.num_classes} classes")
        raise FbnasError(f"{cfg.where}.dataset: {has} but the search space has "
                         f"num_classes={num_classes}; set the space's num_classes to "
                         f"{src.num_classes}")
    return src


