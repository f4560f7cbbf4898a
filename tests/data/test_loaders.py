"""Search, train and eval data built from the data section: loaders, their order and
shards, digits, synthetic, CIFAR and image folders, data.classes (fbnas/data/loaders.py,
sources.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import one_line_error, order

from fbnas.data import (
    DataConfig,
    EpochSampler,
    build_eval_data,
    build_search_data,
    build_train_data,
    digits_split,
)

N_DIGITS_TRAIN = 1797 - 360


# ---- loaders --------------------------------------------------------------------------------


@pytest.mark.parametrize("size, channels", [((32, 32), 3), ((16, 16), 1), ((16, 24), 1)])
def test_digits_loaders_shapes(size, channels):
    d = build_search_data(DataConfig(batch_size=32, eval_batch_size=100), size, channels, 10,
                          seed=0)
    for loader, bs in ((d.w_loader, 32), (d.theta_loader, 32), (d.val_loader, 100),
                       (d.test_loader, 100)):
        x, y = next(iter(loader))
        assert x.shape == (bs, channels, *size) and x.dtype == torch.float32
        assert y.dtype == torch.int64 and 0 <= int(y.min()) and int(y.max()) < 10
        assert torch.isfinite(x).all()
    if channels == 3:
        assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 0], x[:, 2])
    x, _ = next(iter(d.test_loader))
    assert abs(float(x.mean())) < 0.5 and 0.5 < float(x.std()) < 1.5  # normalised


def test_augmentation_only_on_training_view():
    d = build_search_data(DataConfig(), 16, 1, 10, seed=0)
    i = d.w_indices[0]
    aug, plain = d.w_loader.dataset, d.val_loader.dataset
    assert torch.equal(plain[i][0], plain[i][0])
    assert not torch.equal(aug[i][0], aug[i][0])
    assert aug[i][1] == plain[i][1]
    d2 = build_search_data(DataConfig(augment=False), 16, 1, 10, seed=0)
    assert torch.equal(d2.w_loader.dataset[i][0], plain[i][0])


def test_same_seed_same_order_and_set_epoch():
    cfg = DataConfig(augment=False)
    a = build_search_data(cfg, 16, 1, 10, seed=5)
    b = build_search_data(cfg, 16, 1, 10, seed=5)
    c = build_search_data(cfg, 16, 1, 10, seed=6)
    e0 = order(a.w_loader)
    assert e0 == order(b.w_loader) and e0 != order(c.w_loader)
    e1 = order(a.w_loader)  # iterating again advances to the next epoch
    assert e1 != e0 and sorted(e1) == sorted(e0)
    a.set_epoch(3)
    e3 = order(a.w_loader)
    assert e3 not in (e0, e1)
    b.set_epoch(3)
    assert order(b.w_loader) == e3  # a resumed run sees the same epoch
    a.set_epoch(0)
    assert order(a.w_loader) == e0
    # the batches themselves match, not only the indices
    a.set_epoch(2), b.set_epoch(2)
    (xa, ya), (xb, yb) = next(iter(a.theta_loader)), next(iter(b.theta_loader))
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # w and θ use independent streams
    a.set_epoch(7)
    assert order(a.w_loader)[:5] != order(a.theta_loader)[:5]


def test_iteration_does_not_touch_global_rng():
    d = build_search_data(DataConfig(augment=False), 16, 1, 10, seed=0)
    torch.manual_seed(1)
    expect = torch.rand(3)
    torch.manual_seed(1)
    for _ in d.theta_loader:
        pass
    assert torch.equal(torch.rand(3), expect)


def test_sampler_distributed_shards():
    idx = list(range(100, 110))  # 10 indices
    for world in (2, 5):  # divides: disjoint exact cover
        shards = [list(EpochSampler(idx, shuffle=True, seed=1, rank=r, world_size=world))
                  for r in range(world)]
        flat = [i for s in shards for i in s]
        assert sorted(flat) == idx and len(set(flat)) == len(flat)
        full = EpochSampler(idx, shuffle=True, seed=1).order(0)
        assert [shards[r][k] for k in range(len(shards[0])) for r in range(world)] == full
    world = 3  # padded like DistributedSampler: equal lengths, every index, 2 repeats
    shards = [EpochSampler(idx, shuffle=True, seed=1, rank=r, world_size=world)
              for r in range(world)]
    lists = [s.order(4) for s in shards]
    assert {len(x) for x in lists} == {4} and all(len(s) == 4 for s in shards)
    flat = [i for x in lists for i in x]
    assert set(flat) == set(idx) and len(flat) - len(set(flat)) == 2
    assert lists != [s.order(5) for s in shards]
    # evaluation shards: no padding, exact
    ev = [list(EpochSampler(idx, shuffle=False, rank=r, world_size=3, pad=False))
          for r in range(3)]
    assert sorted(i for x in ev for i in x) == idx and [len(x) for x in ev] == [4, 3, 3]
    one_line_error(lambda: EpochSampler(idx, shuffle=True, rank=3, world_size=3), "rank")


def test_search_data_distributed():
    cfg = DataConfig(augment=False)
    ranks = [build_search_data(cfg, 16, 1, 10, seed=2, distributed=(r, 2)) for r in range(2)]
    for part in ("w", "theta"):
        got = [order(getattr(d, f"{part}_loader")) for d in ranks]
        want = set(getattr(ranks[0], f"{part}_indices"))
        assert set(got[0]) | set(got[1]) == want and len(got[0]) == len(got[1])
        assert len(set(got[0]) & set(got[1])) <= 1  # at most the one padding repeat
    val = [order(d.val_loader) for d in ranks]
    assert sorted(val[0] + val[1]) == list(ranks[0].val_indices)
    one_line_error(lambda: build_search_data(cfg, 16, 1, 10, seed=0, distributed=(0, 0)),
                   "world_size")


def test_tiny_parts_still_yield_batches():
    cfg = DataConfig(dataset="synthetic", synthetic_size=20, batch_size=64)
    d = build_search_data(cfg, 8, 3, 4, seed=0)
    assert not d.w_loader.drop_last and not d.theta_loader.drop_last
    assert len(list(d.w_loader)) == 1 and len(list(d.theta_loader)) == 1
    big = build_search_data(DataConfig(batch_size=16), 8, 1, 10, seed=0)
    assert big.w_loader.drop_last and big.theta_loader.drop_last
    assert not big.val_loader.drop_last and not big.test_loader.drop_last
    assert all(len(x) == 16 for x, _ in big.theta_loader)
    assert not big.w_loader.pin_memory and not big.w_loader.persistent_workers
    pinned = build_search_data(DataConfig(), 8, 1, 10, seed=0, pin_memory=True)
    assert pinned.w_loader.pin_memory


def test_an_epochs_augmented_batches_do_not_depend_on_earlier_epochs_with_workers():
    # training loaders restart their worker each epoch, seeded from (seed, epoch): what resume
    # needs to be exact with worker processes
    cfg = DataConfig(limit=64, batch_size=16, workers=1, augment=True)
    a = build_search_data(cfg, 16, 1, 10, seed=0)
    assert a.w_loader.num_workers == 1 and not a.w_loader.persistent_workers
    a.set_epoch(0)
    first = [x for x, _ in a.w_loader]
    a.set_epoch(1)
    second = [x for x, _ in a.w_loader]
    b = build_search_data(cfg, 16, 1, 10, seed=0)
    b.set_epoch(1)  # as a run resumed at epoch 1 would
    again = [x for x, _ in b.w_loader]
    assert len(second) == len(again) > 0
    assert all(torch.equal(x, y) for x, y in zip(second, again, strict=True))
    assert not torch.equal(first[0], second[0])


def test_class_count_mismatch():
    one_line_error(lambda: build_search_data(DataConfig(), 16, 1, 100, seed=0),
                   "data.dataset", "digits has 10 classes", "num_classes=100")


def test_limit_caps_training_samples():
    d = build_search_data(DataConfig(limit=40, val_fraction=0.25), 8, 1, 10, seed=0)
    assert (len(d.val_indices), len(d.w_indices), len(d.theta_indices)) == (10, 24, 6)
    assert len(d.test_loader.dataset) == 360  # the test split is not capped


def test_val_fraction_zero_has_no_val_loader():
    cfg = DataConfig(val_fraction=0.0)
    d = build_search_data(cfg, 8, 1, 10, seed=0)
    assert d.val_loader is None and d.val_indices == ()
    assert len(d.w_indices) + len(d.theta_indices) == N_DIGITS_TRAIN
    one_line_error(lambda: build_eval_data(cfg, 8, 1, 10, seed=0, split="val"),
                   "data.val_fraction")


# ---- retrain and eval data ------------------------------------------------------------------


def test_train_and_eval_data_match_search_split():
    cfg = DataConfig(augment=False)
    s = build_search_data(cfg, 8, 1, 10, seed=9)
    t = build_train_data(cfg, 8, 1, 10, seed=9)
    assert set(t.train_indices) == set(s.w_indices) | set(s.theta_indices)
    assert t.val_indices == s.val_indices and not set(t.train_indices) & set(t.val_indices)
    assert set(order(t.train_loader)) == set(t.train_indices)
    t.set_epoch(4)
    e4 = order(t.train_loader)
    t.set_epoch(4)
    assert order(t.train_loader) == e4
    v = build_eval_data(cfg, 8, 1, 10, seed=9, split="val")
    assert order(v) == list(s.val_indices) and not v.dataset.augment
    test = build_eval_data(cfg, 8, 1, 10, seed=9, split="test")
    assert len(test.dataset) == 360 and order(test) == list(range(360))
    one_line_error(lambda: build_eval_data(cfg, 8, 1, 10, seed=0, split="train"), "split")


# ---- synthetic ------------------------------------------------------------------------------


def test_synthetic_is_deterministic_given_seed():
    cfg = DataConfig(dataset="synthetic", synthetic_size=64, batch_size=8)
    a, b = (build_search_data(cfg, (6, 5), 2, 7, seed=1) for _ in range(2))
    c = build_search_data(cfg, (6, 5), 2, 7, seed=2)
    i = a.w_indices[0]
    assert torch.equal(a.w_loader.dataset[i][0], b.w_loader.dataset[i][0])
    assert not torch.equal(a.w_loader.dataset[i][0], c.w_loader.dataset[i][0])
    x, y = next(iter(a.w_loader))
    assert x.shape == (8, 2, 6, 5) and 0 <= int(y.min()) and int(y.max()) < 7
    assert a.num_classes == 7 and len(a.test_loader.dataset) == 16


def test_synthetic_large_images_are_drawn_per_item(monkeypatch):
    import fbnas.data.sources as data

    monkeypatch.setattr(data, "SYNTHETIC_CACHE_FLOATS", 10)
    cfg = DataConfig(dataset="synthetic", synthetic_size=8)
    d = build_search_data(cfg, 4, 3, 2, seed=0)
    ds = d.w_loader.dataset
    assert ds.images is None
    assert torch.equal(ds[3][0], ds[3][0]) and not torch.equal(ds[3][0], ds[4][0])


# ---- cifar and imagefolder: errors and a tiny folder ----------------------------------------


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_errors(tmp_path, name):
    missing = tmp_path / "nope"
    cfg = DataConfig(dataset=name, root=str(missing))
    one_line_error(lambda: build_search_data(cfg, 32, 3, 10, seed=0), "data.root", str(missing),
                   "no such folder")
    cfg = DataConfig(dataset=name, root=str(tmp_path))
    folder = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    one_line_error(lambda: build_search_data(cfg, 32, 3, 10, seed=0), "data.root",
                   str(tmp_path), folder, "download: true")


def _image_folder(root, classes=("cat", "dog"), per_class=(6, 2)):
    from PIL import Image

    rng = np.random.default_rng(0)
    for part, n in zip(("train", "val"), per_class, strict=True):
        for c in classes:
            (root / part / c).mkdir(parents=True)
            for k in range(n):
                arr = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
                Image.fromarray(arr).save(root / part / c / f"{k}.png")


def test_imagefolder_tiny(tmp_path):
    _image_folder(tmp_path)
    cfg = DataConfig(dataset="imagefolder", root=str(tmp_path), batch_size=4,
                     val_fraction=0.25)
    d = build_search_data(cfg, 16, 3, 2, seed=0)
    assert d.num_classes == 2 and len(d.val_indices) == 3
    assert len(d.w_indices) + len(d.theta_indices) == 9
    x, y = next(iter(d.w_loader))
    assert x.shape == (4, 3, 16, 16) and set(y.tolist()) <= {0, 1}
    x, y = next(iter(d.test_loader))  # val/ serves as the test split
    assert x.shape == (4, 3, 16, 16) and len(d.test_loader.dataset) == 4
    g = build_eval_data(cfg, (12, 14), 1, 2, seed=0, split="val")
    assert next(iter(g))[0].shape == (3, 1, 12, 14)
    one_line_error(lambda: build_search_data(cfg, 16, 2, 2, seed=0), "in_channels", "got 2")


def test_imagefolder_errors(tmp_path):
    cfg = DataConfig(dataset="imagefolder", root=str(tmp_path / "x"))
    one_line_error(lambda: build_search_data(cfg, 16, 3, 2, seed=0), "data.root",
                   str(tmp_path / "x"))
    (tmp_path / "x" / "train" / "a").mkdir(parents=True)
    one_line_error(lambda: build_search_data(cfg, 16, 3, 2, seed=0), "data.root",
                   "no val/ folder")
    (tmp_path / "x" / "val").mkdir()
    one_line_error(lambda: build_search_data(cfg, 16, 3, 2, seed=0), "data.root",
                   str(tmp_path / "x" / "train"))
    other = tmp_path / "y"
    _image_folder(other)
    (other / "val" / "dog").rename(other / "val" / "cow")
    cfg = DataConfig(dataset="imagefolder", root=str(other))
    one_line_error(lambda: build_search_data(cfg, 16, 3, 2, seed=0), "different classes")


def test_digits_uncached_path_matches_cached(monkeypatch):
    import fbnas.data.sources as data

    cached = build_search_data(DataConfig(augment=False), (12, 10), 2, 10, seed=0)
    monkeypatch.setattr(data, "DIGITS_CACHE_FLOATS", 0)
    plain = build_search_data(DataConfig(augment=False), (12, 10), 2, 10, seed=0)
    assert cached.w_loader.dataset._cache is not None and plain.w_loader.dataset._cache is None
    i = plain.theta_indices[0]
    assert torch.allclose(cached.w_loader.dataset[i][0], plain.w_loader.dataset[i][0])
    assert plain.w_loader.dataset[i][0].shape == (2, 12, 10)


def test_iterate_resumes_inside_an_epoch():
    cfg = DataConfig(augment=False, batch_size=50)
    a = build_search_data(cfg, 8, 1, 10, seed=3)
    b = build_search_data(cfg, 8, 1, 10, seed=3)
    a.set_epoch(2)
    full = [y for _, y in a.iterate(a.w_loader)]
    b.set_epoch(2)
    rest = [y for _, y in b.iterate(b.w_loader, start=5)]
    assert len(rest) == len(full) - 5
    assert all(torch.equal(p, q) for p, q in zip(full[5:], rest, strict=True))
    assert len([y for _, y in b.iterate(b.w_loader)]) == len(full)  # the skip is one-shot
    t = build_train_data(cfg, 8, 1, 10, seed=3)
    assert len(list(t.iterate(t.train_loader, start=2))) == len(t.train_loader) - 2



@pytest.mark.parametrize("over, want", [
    ({}, ["RandomResizedCrop(0.08, 1.0)", "RandomHorizontalFlip"]),  # imagefolder: imagenet
    ({"augment": "light"}, ["RandomResizedCrop(0.8, 1.0)"]),  # no flip: medical, text
    ({"augment": "imagenet", "flip": False}, ["RandomResizedCrop(0.08, 1.0)"]),
    ({"augment": "light", "crop_scale": [0.5, 0.9], "flip": True},
     ["RandomResizedCrop(0.5, 0.9)", "RandomHorizontalFlip"]),
    ({"augment": "none"}, []), ({"augment": False}, []),
])
def test_imagefolder_augmentation_presets(over, want):
    from torchvision import transforms as T

    from fbnas.data.sources import _crop_flip

    cfg = DataConfig(dataset="imagefolder", root="/nonexistent", **over)
    got = [f"RandomResizedCrop{tuple(t.scale)}" if isinstance(t, T.RandomResizedCrop)
           else type(t).__name__ for t in _crop_flip(cfg, (24, 24), T)]
    assert got == want


def test_cifar_default_is_padded_crop_and_flip_and_digits_can_flip():
    from torchvision import transforms as T

    from fbnas.data.sources import _crop_flip

    cfg = DataConfig(dataset="cifar10", root="/nonexistent")
    assert [type(t).__name__ for t in _crop_flip(cfg, (32, 32), T)] == [
        "RandomCrop", "RandomHorizontalFlip"]
    d = build_search_data(DataConfig(augment="none", flip=True, limit=64), 8, 1, 10, seed=0)
    ds = d.w_loader.dataset
    assert ds.flip and not ds.augment
    torch.manual_seed(0)
    views = {tuple(ds[0][0].flatten().tolist()) for _ in range(20)}
    assert len(views) == 2  # the image and its mirror


# ---- data.classes: a subset of the classes ---------------------------------------------------


@pytest.mark.parametrize("d, needles", [
    ({"classes": 11}, ["data.classes", "11", "10 classes of digits"]),
    ({"dataset": "cifar100", "root": "/x", "classes": 101},
     ["data.classes", "101", "100 classes of cifar100"]),
    ({"classes": 1}, ["data.classes", ">= 2", "got 1"]),
    ({"classes": "ten"}, ["data.classes", "expected an integer", "'ten'"]),
    ({"classes": 2.5}, ["data.classes", "expected an integer", "2.5"]),
    ({"classes": True}, ["data.classes", "expected an integer", "True"]),
    ({"classes": 4, "class_seed": -1}, ["data.class_seed", ">= 0", "-1"]),
    ({"dataset": "synthetic", "classes": 3}, ["data.classes", "synthetic", "num_classes"]),
])
def test_classes_bad_values_are_one_line_errors(d, needles):
    one_line_error(lambda: DataConfig.from_dict(d), *needles)
    if "class_seed" not in d:  # the same check when the config is built in code
        one_line_error(lambda: DataConfig(**{**d, "where": "data"}), "data.classes")


def _digit_of_image():
    """An 8x8 digit image's bytes -> its digit, from the bundled digits (the test's ground
    truth for which class a loader's sample really is)."""
    from fbnas.data.sources import bundled_digits

    images, target = bundled_digits()
    return {img.tobytes(): int(t) for img, t in zip(images, target, strict=True)}


def test_classes_pick_the_same_digits_on_every_split_and_in_search_retrain_and_eval():
    cfg = DataConfig(classes=4, class_seed=3, augment=False)
    s = build_search_data(cfg, 8, 1, 4, seed=0)
    t = build_train_data(cfg, 8, 1, 4, seed=0)
    other_seed = build_search_data(cfg, 8, 1, 4, seed=7)  # another run seed: same classes
    kept = s.class_indices
    assert len(kept) == 4 and list(kept) == sorted(kept) and set(kept) <= set(range(10))
    assert t.class_indices == other_seed.class_indices == kept
    assert s.class_names == t.class_names == tuple(str(k) for k in kept)
    assert s.num_classes == t.num_classes == 4
    # every split holds only the kept digits, all of them, with label i for digit kept[i]
    truth = _digit_of_image()
    for name, loader, idx in (("w", s.w_loader, s.w_indices), ("θ", s.theta_loader,
                                                                 s.theta_indices),
                              ("val", s.val_loader, s.val_indices),
                              ("test", s.test_loader, None),
                              ("retrain", t.train_loader, t.train_indices)):
        ds = loader.dataset
        for i in (range(len(ds)) if idx is None else idx):
            digit = truth[ds.images[i].numpy().tobytes()]
            assert kept[int(ds.labels[i])] == digit, (name, i)
        assert {int(ds.labels[i]) for i in (range(len(ds)) if idx is None else idx)} == \
            set(range(4)), name
    # the kept digits' samples, all of them: the full train/test split filtered
    from fbnas.data.sources import bundled_digits

    _, target = bundled_digits()
    tr, te = digits_split()
    assert len(s.w_loader.dataset) == int(np.isin(target[tr], kept).sum())
    assert len(s.test_loader.dataset) == int(np.isin(target[te], kept).sum())
    # labels the loaders yield are 0..N-1
    ys = torch.cat([y for _, y in s.w_loader])
    assert set(ys.tolist()) == set(range(4))
    # eval's val split: the search's val samples, the same labels
    ev = build_eval_data(cfg, 8, 1, 4, seed=0, split="val")
    assert torch.equal(torch.cat([y for _, y in ev]), torch.cat([y for _, y in s.val_loader]))
    # class_seed picks other classes (not every seed draws the same 4 of 10)
    picks = {build_search_data(DataConfig(classes=4, class_seed=k, limit=40), 8, 1, 4,
                               seed=0).class_indices for k in range(4)}
    assert len(picks) > 1
    # without data.classes: every class, no subset recorded
    full = build_search_data(DataConfig(limit=40), 8, 1, 10, seed=0)
    assert full.class_indices is None and full.class_names == tuple("0123456789")


def test_classes_and_the_space_must_agree_when_built_in_code():
    one_line_error(lambda: build_search_data(DataConfig(classes=3), 8, 1, 10, seed=0),
                   "data.classes keeps 3 classes of digits", "num_classes=10")


def test_classes_on_an_image_folder_keep_the_same_classes_in_train_and_val(tmp_path):
    names = ("ant", "bee", "cat", "dog", "eel")
    _image_folder(tmp_path, classes=names, per_class=(3, 2))
    cfg = DataConfig(dataset="imagefolder", root=str(tmp_path), batch_size=4, classes=3,
                     class_seed=1, val_fraction=0.2)
    s = build_search_data(cfg, 16, 3, 3, seed=0)
    t = build_train_data(cfg, 16, 3, 3, seed=4)
    kept = s.class_indices
    assert t.class_indices == kept and len(kept) == 3
    assert s.class_names == tuple(names[k] for k in kept)
    for loader in (s.w_loader, s.test_loader):
        base = loader.dataset.base
        # the files behind each sample are the kept classes', labelled 0..2 in name order
        for path, y in base.samples:
            assert path.split("/")[-2] == s.class_names[y]
        assert base.classes == list(s.class_names)
    assert len(s.w_loader.dataset) == 9 and len(s.test_loader.dataset) == 6
    assert set(torch.cat([y for _, y in s.w_loader]).tolist()) <= {0, 1, 2}
    # more classes than the folder holds: one line naming the key, the value and the count
    bad = DataConfig(dataset="imagefolder", root=str(tmp_path), classes=6)
    one_line_error(lambda: build_search_data(bad, 16, 3, 6, seed=0), "data.classes", "6",
                   "5 classes of imagefolder", str(tmp_path / "train"))


def _fake_cifar100(root, monkeypatch, n_train=60, n_test=30):
    """A tiny CIFAR-100 in torchvision's python format (its checksums waived)."""
    import pickle

    from torchvision import datasets

    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for name, n in (("train", n_train), ("test", n_test)):
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 "fine_labels": (np.arange(n) % 100).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "meta").write_bytes(pickle.dumps(
        {"fine_label_names": [f"c{i:02d}" for i in range(100)]}))
    monkeypatch.setattr(datasets.CIFAR100, "_check_integrity", lambda self: True)
    monkeypatch.setattr(datasets.cifar, "check_integrity", lambda path, md5=None: True)


@pytest.mark.parametrize("placement", ["loader", "device"])
def test_classes_on_cifar100_both_placements(tmp_path, monkeypatch, placement):
    _fake_cifar100(tmp_path, monkeypatch, n_train=200, n_test=100)
    cfg = DataConfig.from_dict({"dataset": "cifar100", "root": str(tmp_path), "batch_size": 8,
                                "classes": 10, "placement": placement, "val_fraction": 0.2})
    s = build_search_data(cfg, 32, 3, 10, seed=0, device=torch.device("cpu"))
    kept = s.class_indices
    assert len(kept) == 10 and s.class_names == tuple(f"c{k:02d}" for k in kept)
    # 2 train and 1 test image per class in the fake: the kept classes' samples
    assert len(s.w_indices) + len(s.theta_indices) + len(s.val_indices) == 20
    assert sum(len(y) for _, y in s.test_loader) == 10
    for loader in (s.w_loader, s.theta_loader, s.val_loader, s.test_loader):
        ys = torch.cat([y for _, y in loader])
        assert ys.min() >= 0 and ys.max() < 10
    assert (type(s.w_loader).__name__ == "DeviceBatches") == (placement == "device")
    # the raw pixels behind label y are an image of class kept[y] in the original data
    if placement == "device":
        images = s.test_loader.images.permute(0, 2, 3, 1).numpy()
        labels = s.test_loader.labels.tolist()
    else:
        images, labels = s.test_loader.dataset.base.data, s.test_loader.dataset.base.targets
    from torchvision import datasets
    full = datasets.CIFAR100(str(tmp_path), train=False)
    assert len(images) == 10
    for img, y in zip(images, labels, strict=True):
        j = next(j for j in range(len(full.data)) if np.array_equal(full.data[j], img))
        assert full.targets[j] == kept[y]


def test_classes_flow_through_search_retrain_and_eval(tmp_path, capsys):
    """`fbnas train`, `fbnas retrain` and `fbnas eval` with data.classes: the head has N
    outputs, each run directory lists the same classes, eval reads the same split."""
    import json

    import yaml
    from conftest import digits_run_config

    from fbnas._cli import main
    from fbnas.arch import Architecture

    d = digits_run_config(retrain={"epochs": 1, "warmup_epochs": 0, "device": "cpu",
                                   "measure_latency": False},
                          data={"classes": 3, "class_seed": 5},
                          run={"dir": str(tmp_path / "search")})
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(d, sort_keys=False))
    assert main(["train", "--config", str(cfg)]) == 0
    arch = Architecture.load(tmp_path / "search" / "arch_hard.yaml")
    assert arch.macro.num_classes == 3  # the head followed data.classes (the space says 10)
    resolved = yaml.safe_load((tmp_path / "search" / "config.yaml").read_text())
    assert resolved["data"]["classes"] == 3 and resolved["data"]["class_seed"] == 5
    assert resolved["space"]["num_classes"] == 3
    picked = json.loads((tmp_path / "search" / "classes.json").read_text())
    assert picked["classes"] == 3 and len(picked["indices"]) == 3
    assert picked["names"] == [str(k) for k in picked["indices"]]
    assert main(["retrain", "--arch", str(tmp_path / "search" / "arch_hard.yaml"),
                 "--config", str(cfg), "--out", str(tmp_path / "retrain")]) == 0
    assert json.loads((tmp_path / "retrain" / "classes.json").read_text()) == picked
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "retrain" / "checkpoint.pt"),
                 "--split", "test"]) == 0
    n_test = build_eval_data(DataConfig(classes=3, class_seed=5), 8, 1, 3, seed=3,
                             split="test").sampler.indices.numel()
    assert f"test ({n_test} images" in capsys.readouterr().out
    from fbnas.data.sources import bundled_digits

    _, target = bundled_digits()
    assert n_test == int(np.isin(target[digits_split()[1]], picked["indices"]).sum())
