"""The disjoint w / θ / val split and the digits test split (fbnas/data/sampling.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import one_line_error, order

from fbnas.data import DataConfig, build_search_data, digits_split, split_indices
from fbnas.data.sources import bundled_digits

N_DIGITS_TRAIN = 1797 - 360


@pytest.mark.parametrize("n, w_frac, val_frac", [(100, 0.8, 0.1), (7, 0.5, 0.0), (3, 0.99, 0.5),
                                                 (1437, 0.8, 0.1)])
def test_split_is_disjoint_and_covers(n, w_frac, val_frac):
    cfg = DataConfig(w_fraction=w_frac, val_fraction=val_frac)
    w, theta, val = split_indices(n, cfg, seed=3)
    assert w and theta and (val or val_frac == 0)
    assert not (set(w) & set(theta) or set(w) & set(val) or set(theta) & set(val))
    assert sorted(w + theta + val) == list(range(n))
    assert split_indices(n, cfg, seed=3) == (w, theta, val)
    assert split_indices(n, cfg, seed=4) != (w, theta, val) or n < 4


def test_split_fractions_and_limit():
    w, theta, val = split_indices(1000, DataConfig(), seed=0)
    assert (len(val), len(w), len(theta)) == (100, 720, 180)
    w, theta, val = split_indices(1000, DataConfig(limit=50), seed=0)
    assert len(w) + len(theta) + len(val) == 50 and len(val) == 5
    one_line_error(lambda: split_indices(9, DataConfig(limit=2), seed=0),
                   "data: 2 training samples", "raise data.limit")
    w, theta, val = split_indices(2, DataConfig(val_fraction=0.0), seed=0)
    assert (len(w), len(theta), len(val)) == (1, 1, 0)


def test_digits_test_split_is_fixed_stratified_and_disjoint():
    tr, te = digits_split()
    assert len(te) == 360 and len(tr) == N_DIGITS_TRAIN
    assert not set(tr) & set(te) and sorted(np.concatenate([tr, te])) == list(range(1797))
    y = bundled_digits()[1]
    counts = np.bincount(y[te], minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38  # 20% of 174..183 per class


@pytest.mark.slow  # imports scikit-learn (a second), which loading the digits does not
def test_the_digits_and_their_split_are_scikit_learns():
    """The digits as `load_digits()` gives them, and the declared split as `train_test_split`
    draws it (stratified, 20%, random_state 0), whatever the installed scikit-learn."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    images, target = bundled_digits()
    assert np.array_equal(images, (d.images / 16.0).astype(np.float32))
    assert np.array_equal(target, d.target)
    tr, te = train_test_split(np.arange(len(d.target)), test_size=0.2, stratify=d.target,
                              random_state=0)
    assert [list(x) for x in digits_split()] == [sorted(tr), sorted(te)]


def test_search_data_index_sets():
    d = build_search_data(DataConfig(), 16, 1, 10, seed=0)
    w, theta, val = set(d.w_indices), set(d.theta_indices), set(d.val_indices)
    assert not (w & theta or w & val or theta & val)
    assert w | theta | val == set(range(N_DIGITS_TRAIN))
    assert len(d.w_loader.dataset) == N_DIGITS_TRAIN and len(d.test_loader.dataset) == 360
    # loaders really draw from their own part (θ does not reuse the weight sampler)
    assert set(order(d.w_loader)) == w and set(order(d.theta_loader)) == theta
    assert order(d.val_loader) == list(d.val_indices)  # sequential, no shuffle
    assert d.theta_loader.sampler is not d.w_loader.sampler
    # val is read with eval transforms from the training set, never the augmenting view
    assert d.w_loader.dataset.augment and not d.val_loader.dataset.augment
    assert d.val_loader.dataset.images is d.w_loader.dataset.images
    assert not d.test_loader.dataset.augment
