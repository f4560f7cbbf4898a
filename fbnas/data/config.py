"""The `data:` section of a run config."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from fbnas.errors import FbnasError
from fbnas.io import is_number, show
from fbnas.settings import read_fields, setting

DATASETS = ("digits", "cluttered_digits", "cifar10", "cifar100", "imagefolder", "synthetic")
NEEDS_ROOT = ("cifar10", "cifar100", "imagefolder")
SPLITS = ("val", "test")
AUGMENTS = ("default", "none", "light", "imagenet")
PLACEMENTS = ("auto", "loader", "device")  # fbnas.data._device
IN_MEMORY = ("digits", "cluttered_digits", "synthetic", "cifar10", "cifar100")  # placement: device
DIGIT_SETS = ("digits", "cluttered_digits")  # 8x8 digits: shifted and turned, never cropped
# class counts known without reading the data (data.classes is checked against them at load
# for the others)
CLASS_COUNTS = {"digits": 10, "cluttered_digits": 10, "cifar10": 10, "cifar100": 100}
CLUTTER = "clutter_"  # the prefix of the keys of dataset cluttered_digits, set for no other




@dataclass(frozen=True)
class DataConfig:
    """The `data:` section of a config. `batch_size` is per process under distributed runs."""

    dataset: str = setting("digits", "str", choices=DATASETS)
    # cifar*: torchvision root; imagefolder: holds train/ and val/
    root: str | None = setting(None, "str", resumable=True)
    download: bool = setting(False, "bool")  # cifar only
    batch_size: int = setting(64, "int", min=1)
    eval_batch_size: int = setting(256, "int", min=1, resumable=True)
    workers: int = setting(0, "int", min=0, resumable=True)
    # share of the non-val training part used for weights; rest is θ
    w_fraction: float = setting(0.8, "float")
    # share of the training set held out for model selection
    val_fraction: float = setting(0.1, "float")
    # training-time augmentation: default (the dataset's own: digits light, cifar crop + flip,
    # imagefolder imagenet), none, light (small crops, or shifts and turns for digits; no
    # flip), imagenet (RandomResizedCrop + flip); true = default, false = none
    augment: bool | str = setting(True, "raw")
    crop_scale: list | None = setting(None, "list")  # [lo, hi] area share of random crops
    flip: bool | None = setting(None, "bool")  # horizontal flips (null: the preset's)
    # cap on training samples, taken after a seeded shuffle
    limit: int | None = setting(None, "int", min=1)
    # keep N classes of the dataset, drawn by class_seed (the FBNet paper searched on 100
    # random ImageNet classes): the same N on every split and in search, retrain and eval,
    # labels renumbered 0..N-1 in the dataset's class order; the space's num_classes follows
    # N. null: every class
    classes: int | None = setting(None, "int", min=2)
    class_seed: int = setting(0, "int", min=0)
    synthetic_size: int = setting(512, "int", min=1)
    # where a split lives while training: auto (on the device for digits / synthetic / CIFAR
    # data on a GPU, else a DataLoader), device (the whole split as one device tensor, batched
    # on-device augmentation; those datasets only), loader (a DataLoader)
    placement: str = setting("auto", "str", choices=PLACEMENTS, added="auto")
    # dataset cluttered_digits (fbnas.data.clutter): each digit drawn at clutter_digit_size px
    # at a random place on a canvas of the space's input size, among clutter_fragments random
    # clutter_fragment_size px crops of other digits of its own split; clutter_per_source
    # canvases per training and validation digit (clutter_test_per_source per test digit);
    # clutter_seed fixes the canvases and the sources' train / val split (whatever the run's
    # seed). The defaults are configs/cluttered_digits.yaml's, its pilot's (docs/bench.md)
    clutter_digit_size: int = setting(8, "int", min=1, added=8)
    clutter_fragments: int = setting(2, "int", min=0, added=2)
    clutter_fragment_size: int = setting(4, "int", min=1, added=4)
    clutter_per_source: int = setting(3, "int", min=1, added=3)
    clutter_test_per_source: int = setting(4, "int", min=1, added=4)
    clutter_seed: int = setting(0, "int", min=0, added=0)
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
                        ("synthetic_size", 1), ("clutter_digit_size", 1),
                        ("clutter_fragments", 0), ("clutter_fragment_size", 1),
                        ("clutter_per_source", 1), ("clutter_test_per_source", 1),
                        ("clutter_seed", 0)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise FbnasError(f"{w}.{key}: must be an integer >= {lo}, got {v!r}")
        if self.limit is not None and (isinstance(self.limit, bool)
                                       or not isinstance(self.limit, int) or self.limit < 1):
            raise FbnasError(f"{w}.limit: must be an integer >= 1 or null, got {self.limit!r}")
        self._check_classes()
        self._check_clutter()
        if self.augment not in (True, False, *AUGMENTS):
            raise FbnasError(f"{w}.augment: must be one of {', '.join(AUGMENTS)} (or true / "
                             f"false), got {show(self.augment)}")
        cs = self.crop_scale
        if cs is not None and not (
                len(cs) == 2 and all(is_number(v) for v in cs) and 0.0 < cs[0] <= cs[1] <= 1.0):
            raise FbnasError(f"{w}.crop_scale: expected [lo, hi] with 0 < lo <= hi <= 1, got "
                             f"{show(cs)}")
        if cs is not None and self.dataset in DIGIT_SETS:
            raise FbnasError(f"{w}.crop_scale: digits are shifted and turned, not cropped; "
                             "crop_scale applies to cifar10, cifar100 and imagefolder")
        if self.preset == "imagenet" and self.dataset in DIGIT_SETS:
            raise FbnasError(f"{w}.augment: imagenet (random resized crops) does not fit 8x8 "
                             "digits; use light or none")
        if self.placement == "device" and self.dataset not in IN_MEMORY:
            raise FbnasError(f"{w}.placement: device holds {', '.join(IN_MEMORY)} data; "
                             f"{self.dataset} is read through a DataLoader (use auto or loader)")
        if self.placement == "device" and self.dataset.startswith("cifar") and (
                self.preset not in ("cifar", "none") or self.crop_scale is not None):
            raise FbnasError(f"{w}.placement: device applies cifar's default padded crop and "
                             "flip (or augment: none); random resized crops (augment "
                             f"{self.preset}, crop_scale) need placement: loader")
        if not 0.0 < self.w_fraction < 1.0:
            raise FbnasError(f"{w}.w_fraction: must be in (0, 1), got {self.w_fraction}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise FbnasError(f"{w}.val_fraction: must be in [0, 1), got {self.val_fraction}")

    def _check_clutter(self) -> None:
        w = self.where
        if self.dataset != "cluttered_digits":
            for fd in fields(self):
                v = getattr(self, fd.name)
                if fd.name.startswith(CLUTTER) and v != fd.default:
                    raise FbnasError(f"{w}.{fd.name}: applies to dataset cluttered_digits "
                                     f"only, not {self.dataset} (got {show(v)})")
            return
        if self.clutter_fragment_size > self.clutter_digit_size:
            raise FbnasError(f"{w}.clutter_fragment_size: {self.clutter_fragment_size} is "
                             f"larger than the digit ({w}.clutter_digit_size: "
                             f"{self.clutter_digit_size}); a fragment is a crop of a digit")

    def _check_classes(self) -> None:
        w, n = self.where, self.classes
        if isinstance(self.class_seed, bool) or not isinstance(self.class_seed, int) or (
                self.class_seed < 0):
            raise FbnasError(f"{w}.class_seed: must be an integer >= 0, got "
                             f"{show(self.class_seed)}")
        if n is None:
            return
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise FbnasError(f"{w}.classes: must be an integer >= 2 (how many of the dataset's "
                             f"classes to keep) or null, got {show(n)}")
        if self.dataset == "synthetic":
            raise FbnasError(f"{w}.classes: synthetic data has the space's num_classes "
                             f"classes; set space.num_classes instead of {w}.classes: {n}")
        have = CLASS_COUNTS.get(self.dataset)
        if have is not None and n > have:
            raise FbnasError(f"{w}.classes: {n} is more than the {have} classes of "
                             f"{self.dataset}")

    @classmethod
    def from_dict(cls, d: Any, where: str = "data") -> DataConfig:
        return read_fields(cls, d, where, where=where)

    @property
    def preset(self) -> str:
        """The augmentation preset in force: none, light or imagenet, or `cifar` (random crop
        with 4 px padding + flip, CIFAR's default)."""
        a = {True: "default", False: "none"}.get(self.augment, self.augment)
        if a != "default":
            return a
        return {"digits": "light", "cluttered_digits": "light", "imagefolder": "imagenet",
                "synthetic": "none"}.get(self.dataset, "cifar")

    def flips(self) -> bool:
        return self.flip if self.flip is not None else self.preset in ("imagenet", "cifar")

    def to_dict(self) -> dict[str, Any]:
        """The section as a resolved config writes it; `classes` and `class_seed` appear only
        when a class subset is chosen, and the `clutter_*` keys only for dataset
        cluttered_digits, so other runs resolve as before (and resume runs written before the
        keys existed)."""
        d = asdict(self)
        d.pop("where")
        if self.classes is None:
            d.pop("classes")
            d.pop("class_seed")
        if self.dataset != "cluttered_digits":
            d = {k: v for k, v in d.items() if not k.startswith(CLUTTER)}
        return d


