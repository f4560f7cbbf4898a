"""data.dataset: cluttered_digits: the sources split before any canvas is drawn, no source image
(digit or fragment) in two of train / val / test or of w / θ / val, canvases fixed by
data.clutter_seed, one-line errors (fbnas/data/clutter.py, sources.py, sampling.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import one_line_error

from fbnas.data import DataConfig, build_search_data, build_train_data, digits_split
from fbnas.data.clutter import draw, scale_digits
from fbnas.data.sampling import split_groups
from fbnas.data.sources import bundled_digits, load_source

SMALL = {"dataset": "cluttered_digits", "clutter_per_source": 1, "clutter_test_per_source": 1,
         "val_fraction": 0.15, "batch_size": 32}


def _cfg(**over) -> DataConfig:
    return DataConfig.from_dict({**SMALL, **over})


def _used(ds, rows) -> set[int]:
    """The source images (digits and fragments) the canvases `rows` of `ds` were drawn from."""
    rows = np.asarray(list(rows), dtype=np.int64)
    return set(ds.source[rows].tolist()) | set(ds.fragments[rows].ravel().tolist())


@pytest.fixture(scope="module")
def source():
    return load_source(_cfg(clutter_per_source=2, clutter_test_per_source=3), 24, 1, 10, 0)


def test_no_source_image_is_in_two_of_train_val_and_test(source):
    """The digits' fixed test split is the test part; the rest split into train and val by
    clutter_seed; every digit and every fragment of a part's canvases comes from that part."""
    tr, te = digits_split()
    val = list(source.val)
    rest = sorted(set(range(len(source.train))) - set(val))
    train_used = _used(source.train, rest)
    val_used = _used(source.train, val)
    test_used = _used(source.test, range(len(source.test)))
    assert not train_used & val_used and not train_used & test_used
    assert not val_used & test_used
    assert test_used <= set(te.tolist()) and set(source.test.source.tolist()) == set(te.tolist())
    assert train_used | val_used <= set(tr.tolist())
    assert set(source.train.source.tolist()) == set(tr.tolist())
    assert len(set(source.train.source[val].tolist())) == round(0.15 * len(tr))
    # a fragment is cut from another source image than the canvas's digit
    for ds in (source.train, source.test):
        assert not (ds.fragments == ds.source[:, None]).any()
    # clutter_per_source canvases per source, consecutive; labels are the digit's
    _, target = bundled_digits()
    assert len(source.train) == 2 * len(tr) and len(source.test) == 3 * len(te)
    assert np.array_equal(np.bincount(source.test.source, minlength=1797)[te], np.full(len(te), 3))
    assert torch.equal(source.train.labels, torch.from_numpy(target[source.train.source]))


@pytest.mark.parametrize("build", [build_search_data, build_train_data])
def test_w_theta_val_keep_each_source_image_in_one_part(build):
    """The run's split (by search.seed) moves whole source images: the digits of w's canvases
    are not θ's, and val is the part the data drew apart (clutter_seed) under any run seed, its
    digits and fragments in no w or θ canvas. (w's fragments may be cut from θ's digits: both
    are the training part, and retraining merges them.)"""
    cfg = _cfg(clutter_per_source=2)
    parts = []
    for seed in (0, 1):
        d = build(cfg, 16, 1, 10, seed=seed)
        ds = (d.w_loader if build is build_search_data else d.train_loader).dataset
        if build is build_search_data:
            w = set(ds.source[list(d.w_indices)].tolist())
            assert not w & set(ds.source[list(d.theta_indices)].tolist())
            assert len(d.w_indices) + len(d.theta_indices) + len(d.val_indices) == len(ds)
            assert 0.75 < len(d.w_indices) / (len(d.w_indices) + len(d.theta_indices)) < 0.85
            parts.append(d.w_indices)
            fit = d.w_indices + d.theta_indices
        else:
            fit = d.train_indices
        assert not _used(ds, fit) & _used(ds, d.val_indices)
        assert d.val_indices == tuple(load_source(cfg, 16, 1, 10, seed).val)
    if parts:
        assert parts[0] != parts[1]  # the w / θ split follows the run's seed, val does not


def test_same_config_same_canvases_and_clutter_seed_changes_them(source):
    again = load_source(_cfg(clutter_per_source=2, clutter_test_per_source=3), 24, 1, 10,
                        seed=7)  # the run's seed: unused
    for a, b in ((source.train, again.train), (source.test, again.test)):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
        assert np.array_equal(a.fragments, b.fragments)
    other = load_source(_cfg(clutter_per_source=2, clutter_test_per_source=3, clutter_seed=1),
                        24, 1, 10, 0)
    assert not torch.equal(other.test.images, source.test.images)
    assert set(other.test.source.tolist()) == set(source.test.source.tolist())  # fixed test
    assert other.val != source.val or not np.array_equal(other.train.source[list(other.val)],
                                                         source.train.source[list(source.val)])


def test_canvases_hold_their_digit_and_clutter_and_are_normalised(source):
    d = build_search_data(_cfg(), (24, 32), 3, 10, seed=0)
    x, y = next(iter(d.test_loader))
    assert x.shape == (len(y), 3, 24, 32) and y.dtype == torch.int64
    assert torch.equal(x[:, 0], x[:, 2])
    x, _ = next(iter(d.val_loader))
    assert abs(float(x.mean())) < 0.3 and 0.7 < float(x.std()) < 1.3
    # the digit is drawn whole at its place: a window of the canvas is at least the digit
    images, target = bundled_digits()
    digit = scale_digits(images, 8)
    c = draw(digit, target, np.arange(10), (20, 20), 3, 4, 2, seed=3)
    assert c.images.shape == (20, 20, 20) and c.images.dtype == np.float32
    assert np.array_equal(c.labels, target[c.source])
    assert 0.0 <= c.images.min() and c.images.max() <= 1.0
    for img, s in zip(c.images, c.source, strict=True):
        assert any(np.all(img[i:i + 8, j:j + 8] >= digit[s])
                   for i in range(13) for j in range(13))
        assert img.sum() > digit[s].sum()  # and some clutter beside it
    plain = draw(digit, target, np.arange(10), (20, 20), 0, 4, 1, seed=3)
    assert np.allclose(plain.images.sum((1, 2)), digit[:10].sum((1, 2)), rtol=1e-5)


def test_device_placement_holds_the_canvases():
    cfg = _cfg(placement="device", augment="none", limit=200)
    dev = build_search_data(cfg, 16, 1, 10, seed=0, device=torch.device("cpu"))
    ref = build_search_data(_cfg(augment="none", limit=200), 16, 1, 10, seed=0)
    assert type(dev.w_loader).__name__ == "DeviceBatches"
    for la, lb in ((dev.w_loader, ref.w_loader), (dev.test_loader, ref.test_loader)):
        (xa, ya), (xb, yb) = next(iter(la)), next(iter(lb))
        assert torch.equal(ya, yb)
        torch.testing.assert_close(xa, xb, rtol=0, atol=1e-5)
    aug = build_search_data(_cfg(placement="device", limit=200), 16, 1, 10, seed=0,
                            device=torch.device("cpu"))
    xa, _ = next(iter(aug.w_loader))
    assert xa.shape == (32, 1, 16, 16) and torch.isfinite(xa).all()


def test_limit_and_too_few_sources_keep_whole_source_images():
    groups = np.repeat(np.arange(10), 3)
    cfg = DataConfig(dataset="cluttered_digits", limit=7)
    w, theta, val = split_groups(groups, range(27, 30), cfg, 0)
    assert val == (27, 28, 29) and len(w) + len(theta) == 6  # 2 sources of 3 canvases
    assert not set(groups[list(w)]) & set(groups[list(theta)])
    one_line_error(lambda: split_groups(np.zeros(4, dtype=np.int64), (), cfg, 0),
                   "data: 1 source images outside val are too few")


@pytest.mark.parametrize("d, needles", [
    ({"clutter_fragment_size": 9}, ["data.clutter_fragment_size: 9 is larger than the digit",
                                    "clutter_digit_size: 8"]),
    ({"clutter_fragments": -1}, ["data.clutter_fragments: must be >= 0, got -1"]),
    ({"clutter_per_source": 0}, ["data.clutter_per_source: must be >= 1, got 0"]),
    ({"clutter_test_per_source": 0}, ["data.clutter_test_per_source: must be >= 1, got 0"]),
    ({"clutter_digit_size": 0}, ["data.clutter_digit_size: must be >= 1"]),
    ({"clutter_seed": "x"}, ["data.clutter_seed: expected an integer"]),
    ({"dataset": "digits", "clutter_fragments": 5},
     ["data.clutter_fragments: applies to dataset cluttered_digits only, not digits"]),
    ({"crop_scale": [0.5, 1.0]}, ["data.crop_scale", "not cropped"]),
    ({"classes": 11}, ["data.classes: 11 is more than the 10 classes of cluttered_digits"]),
])
def test_bad_settings_are_one_line_errors(d, needles):
    one_line_error(lambda: DataConfig.from_dict({"dataset": "cluttered_digits", **d}), *needles)


def test_bad_settings_in_code_and_at_load_are_one_line_errors():
    one_line_error(lambda: DataConfig(dataset="cluttered_digits", clutter_fragments=-2),
                   "data.clutter_fragments: must be an integer >= 0, got -2")
    one_line_error(lambda: load_source(_cfg(clutter_digit_size=20), 16, 1, 10, 0),
                   "data.clutter_digit_size: 20 does not fit the canvas", "input_size 16x16")
    one_line_error(lambda: load_source(_cfg(clutter_digit_size=12), (12, 10), 1, 10, 0),
                   "data.clutter_digit_size: 12", "12x10")


def test_resolved_config_lists_the_clutter_keys_only_for_this_dataset():
    cfg = _cfg(clutter_fragments=6)
    d = cfg.to_dict()
    assert (d["clutter_fragments"], d["clutter_per_source"], d["clutter_seed"]) == (6, 1, 0)
    assert DataConfig(dataset="cluttered_digits").to_dict()["clutter_test_per_source"] == 4
    assert DataConfig.from_dict(d) == cfg
    assert not any(k.startswith("clutter_") for k in DataConfig().to_dict())


def test_classes_keep_sources_and_fragments_of_the_kept_digits():
    src = load_source(_cfg(classes=3, class_seed=1), 16, 1, 3, 0)
    _, target = bundled_digits()
    kept = set(src.kept)
    for ds in (src.train, src.test):
        assert set(target[ds.source].tolist()) <= kept
        assert set(target[ds.fragments.ravel()].tolist()) <= kept
        assert int(ds.labels.max()) == 2


def test_a_tiny_search_and_retrain_run_on_it(tmp_path):
    """`fbnas train` and `fbnas retrain` on cluttered digits: the resolved config keeps the
    clutter keys, and the retrain reads the same data."""
    import json

    import yaml
    from conftest import digits_run_config

    from fbnas._cli import main

    d = digits_run_config(
        retrain={"epochs": 1, "warmup_epochs": 0, "device": "cpu", "measure_latency": False},
        space={"input_size": 12},
        data={"dataset": "cluttered_digits", "clutter_digit_size": 6,
              "clutter_fragment_size": 3, "clutter_fragments": 2, "clutter_per_source": 1,
              "clutter_test_per_source": 1,
              "classes": 3},  # 3 of the digits: a third of the canvases, for speed
        search={"epochs": 1, "warmup_epochs": 0}, run={"dir": str(tmp_path / "search")})
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(d, sort_keys=False))
    assert main(["train", "--config", str(cfg)]) == 0
    resolved = yaml.safe_load((tmp_path / "search" / "config.yaml").read_text())
    assert resolved["data"]["dataset"] == "cluttered_digits"
    assert resolved["data"]["clutter_digit_size"] == 6
    assert main(["retrain", "--arch", str(tmp_path / "search" / "arch_hard.yaml"),
                 "--config", str(cfg), "--out", str(tmp_path / "retrain")]) == 0
    res = json.loads((tmp_path / "retrain" / "results.json").read_text())
    assert res["dataset"] == "cluttered_digits" and 0.0 <= res["top1"] <= 1.0
    assert res["arch"]["ops"] and yaml.safe_load((tmp_path / "retrain" / "config.yaml").read_text(
    ))["data"]["clutter_fragments"] == 2
