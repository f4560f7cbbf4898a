"""The `data:` section of a run config."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fbnas.errors import FbnasError
from fbnas.io import read_fields, setting

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "synthetic")
NEEDS_ROOT = ("cifar10", "cifar100", "imagefolder")
SPLITS = ("val", "test")





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


