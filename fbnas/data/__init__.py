"""Datasets and loaders for search and retraining, with disjoint w / θ / val / test splits.

The training set of a dataset is split once, by a seeded permutation, into three disjoint
index lists: `val` (model selection), `w` (supernet weights) and `θ` (architecture
parameters). The dataset's own test split is never used for selection. Every training loader
draws its order from (seed, stream, epoch) through `EpochSampler`, so an epoch's order does not
depend on what ran before it, and a resumed run sees the same batches.

Datasets (`data.dataset`):

- `digits`: scikit-learn's bundled 8x8 digits (1797 images, no download); a fixed, stratified
  20% is the test split.
- `cluttered_digits`: those digits, each at a random place on a canvas of the space's input
  size among random fragments of other digits (fbnas.data.clutter, cluttered MNIST's
  construction), `data.clutter_*`; the sources split into train / val / test before any
  canvas is drawn (test: the digits' test split; val: fixed by `clutter_seed`), each part's
  canvases drawn from its own digits only, and the w / θ split keeps a source's canvases in
  one part.
- `cifar10`, `cifar100`: torchvision's CIFAR from `data.root` (`download: true` fetches it).
- `imagefolder`: `data.root/train/<class>/*` and `data.root/val/<class>/*`; validation is
  carved from train/, and val/ is the test split.
- `synthetic`: seeded random images and labels, for benchmarks.

`data.classes: N` keeps N classes of digits, CIFAR or an image folder (the FBNet paper's 100
ImageNet classes), drawn by `data.class_seed` alone, so every split and every command of a
run (search, retrain, eval) keeps the same ones, labelled 0..N-1 in the dataset's class order;
`SearchData` / `TrainData` carry their indices and names (`class_indices`, `class_names`).
"""
from fbnas.data.config import DATASETS, NEEDS_ROOT, SPLITS, DataConfig
from fbnas.data.loaders import (
    SearchData,
    TrainData,
    build_eval_data,
    build_search_data,
    build_train_data,
    calibration_images,
)
from fbnas.data.sampling import EpochSampler, split_indices
from fbnas.data.sources import DigitsDataset, SyntheticDataset, digits_split

__all__ = [
    "DATASETS", "NEEDS_ROOT", "SPLITS", "DataConfig", "DigitsDataset", "EpochSampler",
    "SearchData", "SyntheticDataset", "TrainData", "build_eval_data", "build_search_data",
    "build_train_data", "calibration_images", "digits_split", "split_indices",
]
