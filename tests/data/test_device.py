"""data.placement: device: each split held on the device, visited in the loader's order,
augmented there, resumed mid-epoch (fbnas/data/_device.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fbnas.data import DataConfig, build_search_data


def _placed(placement: str, **over):
    cfg = DataConfig.from_dict({"placement": placement, "batch_size": 32, "limit": 300, **over})
    return build_search_data(cfg, 16, 1, 10, seed=0, device=torch.device("cpu"))


def test_auto_placement_keeps_a_dataloader_on_the_cpu():
    d = _placed("auto")
    assert isinstance(d.w_loader, torch.utils.data.DataLoader)
    assert type(_placed("device").w_loader).__name__ == "DeviceBatches"


def test_device_placement_puts_each_split_on_the_device_once():
    """The w, θ, val and calibration loaders are views of one training split: they share one
    uploaded tensor; the test split has its own."""
    d = _placed("device")
    views = (d.w_loader, d.theta_loader, d.val_loader, d.calib_loader)
    assert all(v.images is d.w_loader.images for v in views)
    assert d.test_loader.images is not d.w_loader.images


@pytest.mark.parametrize("dataset", ["digits", "synthetic"])
def test_device_placement_visits_the_loaders_samples_in_its_order(dataset):
    """The same batches of the same samples in the same order as the DataLoader path; the
    evaluation splits (no augmentation) are the same tensors."""
    dev, loader = _placed("device", dataset=dataset), _placed("loader", dataset=dataset)
    for e in (0, 1):
        dev.set_epoch(e)
        loader.set_epoch(e)
        a = list(dev.iterate(dev.w_loader))
        b = list(loader.iterate(loader.w_loader))
        assert len(a) == len(b) == len(dev.w_loader) == len(loader.w_loader)
        assert all(torch.equal(ya, yb) for (_, ya), (_, yb) in zip(a, b, strict=True))
        assert all(xa.shape == xb.shape for (xa, _), (xb, _) in zip(a, b, strict=True))
    for la, lb in ((dev.val_loader, loader.val_loader), (dev.test_loader, loader.test_loader),
                   (dev.calib_loader, loader.calib_loader)):
        for (xa, ya), (xb, yb) in zip(la, lb, strict=True):
            assert torch.equal(ya, yb)
            torch.testing.assert_close(xa, xb, rtol=0, atol=1e-5)


def test_device_augmentation_is_the_datasets_turn_and_shift():
    """The batched turn/shift is DigitsDataset's per-image _affine for the same draws."""
    from fbnas.data._device import on_device
    from fbnas.data.sources import DIGITS_MEAN, DIGITS_STD, _affine, load_source

    cfg = DataConfig.from_dict({"limit": 300})
    ds = load_source(cfg, 16, 1, 10, 0).train
    images, _, transform = on_device(ds, torch.device("cpu"))
    x = images[:5]
    got = transform(x, torch.Generator().manual_seed(7))
    r = torch.rand(5, 3, generator=torch.Generator().manual_seed(7)).mul_(2).sub_(1)
    px = ds.side / 8.0
    want = torch.cat([_affine(x[i:i + 1], ds._grid, float(r[i, 0]) * ds.MAX_DEG,
                              float(r[i, 1]) * ds.MAX_SHIFT * px,
                              float(r[i, 2]) * ds.MAX_SHIFT * px) for i in range(5)])
    torch.testing.assert_close(got, (want - DIGITS_MEAN) / DIGITS_STD, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, (x - DIGITS_MEAN) / DIGITS_STD)  # it did move the images


def test_device_placement_resumes_mid_epoch_exactly():
    """Batch k of a pass started at batch k is batch k of the uninterrupted pass, augmentation
    included; another epoch augments differently."""
    d = _placed("device")
    d.set_epoch(3)
    full = list(d.iterate(d.w_loader))
    d.set_epoch(3)
    rest = list(d.iterate(d.w_loader, start=2))
    assert len(rest) == len(full) - 2
    for (xa, ya), (xb, yb) in zip(full[2:], rest, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    d.set_epoch(4)
    other = list(d.iterate(d.w_loader))
    assert not torch.equal(other[0][0], full[0][0])


def _fake_cifar(root, monkeypatch, n_train=40, n_test=12):
    """A tiny CIFAR-10 in torchvision's python format (its checksums waived)."""
    import pickle

    from torchvision import datasets

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = n_test if name == "test_batch" else n_train // 5
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 "labels": rng.integers(0, 10, n).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps(
        {"label_names": [f"c{i}" for i in range(10)]}))
    monkeypatch.setattr(datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(datasets.cifar, "check_integrity", lambda path, md5=None: True)


def _cifar_data(root, placement, size=32, channels=3, **over):
    cfg = DataConfig.from_dict({"dataset": "cifar10", "root": str(root), "batch_size": 8,
                                "placement": placement, "val_fraction": 0.2, **over})
    return build_search_data(cfg, size, channels, 10, seed=0, device=torch.device("cpu"))


def test_cifar_on_the_device_matches_the_loader(tmp_path, monkeypatch):
    """CIFAR held on the device: the loader path's samples in its order; evaluation pixels
    equal; the padded crop and flip are RandomCrop(32, padding=4) and a mirror of the same
    image (checked against numpy for the same draws)."""
    from fbnas.data._device import on_device
    from fbnas.data.sources import CIFAR_STATS

    _fake_cifar(tmp_path, monkeypatch)
    dev, loader = _cifar_data(tmp_path, "device"), _cifar_data(tmp_path, "loader")
    assert type(dev.w_loader).__name__ == "DeviceBatches"
    dev.set_epoch(1)
    loader.set_epoch(1)
    for (_, ya), (_, yb) in zip(dev.iterate(dev.w_loader), loader.iterate(loader.w_loader),
                                strict=True):
        assert torch.equal(ya, yb)
    for la, lb in ((dev.val_loader, loader.val_loader), (dev.test_loader, loader.test_loader)):
        for (xa, ya), (xb, yb) in zip(la, lb, strict=True):
            assert torch.equal(ya, yb)
            torch.testing.assert_close(xa, xb, rtol=0, atol=1e-6)
    assert dev.val_loader.images is dev.w_loader.images  # the train split, uploaded once
    ds = dev.w_loader  # the train view's transform, on raw images
    images, _, transform = on_device(loader.w_loader.dataset, torch.device("cpu"))
    got = transform(images[:6], torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    oy, ox = torch.randint(0, 9, (2, 6), generator=g)
    coin = torch.rand(6, generator=g) < 0.5
    raw = np.pad(images[:6].numpy(), ((0, 0), (0, 0), (4, 4), (4, 4)))
    mean, std = (np.array(v, dtype=np.float32)[:, None, None] for v in CIFAR_STATS["cifar10"])
    for i in range(6):
        crop = raw[i, :, oy[i]:oy[i] + 32, ox[i]:ox[i] + 32].astype(np.float32) / 255
        if coin[i]:
            crop = crop[:, :, ::-1]
        np.testing.assert_allclose(got[i].numpy(), (crop - mean) / std, rtol=0, atol=1e-5)
    assert ds.batch_size == 8


def test_cifar_on_the_device_resized_and_grey_is_close_to_the_loader(tmp_path, monkeypatch):
    """Resize (torch's antialiased bilinear) and greyscale (in float) differ from PIL's only
    in rounding: the evaluation images agree closely."""
    _fake_cifar(tmp_path, monkeypatch)
    dev = _cifar_data(tmp_path, "device", size=24, channels=1)
    loader = _cifar_data(tmp_path, "loader", size=24, channels=1)
    for (xa, _), (xb, _) in zip(dev.test_loader, loader.test_loader, strict=True):
        assert xa.shape == xb.shape == (len(xa), 1, 24, 24)
        assert float((xa - xb).abs().mean()) < 0.05
