"""data: the section's keys, defaults and one-line errors (fbnas/data/config.py)."""

from __future__ import annotations

import pytest
from conftest import one_line_error

from fbnas.data import DataConfig


def test_config_defaults_and_round_trip():
    cfg = DataConfig.from_dict({})
    assert cfg == DataConfig()
    assert (cfg.dataset, cfg.batch_size, cfg.eval_batch_size, cfg.workers) == ("digits", 64, 256, 0)
    assert (cfg.w_fraction, cfg.val_fraction, cfg.augment, cfg.limit) == (0.8, 0.1, True, None)
    d = DataConfig.from_dict({"dataset": "cifar10", "root": "/x", "download": True, "limit": 9})
    assert DataConfig.from_dict(d.to_dict()) == d
    assert "where" not in d.to_dict()
    assert DataConfig.from_dict(None) == DataConfig()


@pytest.mark.parametrize("d, needles", [
    ({"batchsize": 3}, ["data: unknown key 'batchsize'"]),
    ({"w_fraction": 1.0}, ["data.w_fraction", "(0, 1)"]),
    ({"w_fraction": 0}, ["data.w_fraction"]),
    ({"val_fraction": 1.0}, ["data.val_fraction", "[0, 1)"]),
    ({"val_fraction": -0.1}, ["data.val_fraction"]),
    ({"val_fraction": "0.1"}, ["data.val_fraction", "expected a number"]),
    ({"batch_size": 0}, ["data.batch_size", ">= 1"]),
    ({"augment": "yes"}, ["data.augment", "light", "'yes'"]),
    ({"augment": "imagenet"}, ["data.augment", "digits"]),
    ({"crop_scale": [0.5, 1.0]}, ["data.crop_scale", "digits"]),
    ({"dataset": "synthetic", "crop_scale": [0.9, 0.5]}, ["data.crop_scale", "lo <= hi"]),
    ({"dataset": "synthetic", "crop_scale": 0.5}, ["data.crop_scale", "expected a list"]),
    ({"flip": "sometimes"}, ["data.flip", "true or false"]),
    ({"limit": 0}, ["data.limit"]),
    ({"dataset": "mnist"}, ["data.dataset", "digits", "'mnist'"]),
    ({"dataset": "cifar10"}, ["data.root", "required", "cifar10"]),
    ({"dataset": "imagefolder"}, ["data.root", "train/ and val/"]),
    ({"placement": "gpu"}, ["data.placement", "device", "'gpu'"]),
    ({"dataset": "imagefolder", "root": "/x", "placement": "device"},
     ["data.placement", "digits, synthetic, cifar10, cifar100", "imagefolder"]),
    ({"dataset": "cifar10", "root": "/x", "placement": "device", "augment": "light"},
     ["data.placement", "padded crop", "placement: loader"]),
])
def test_config_errors_name_the_key(d, needles):
    one_line_error(lambda: DataConfig.from_dict(d), *needles)


def test_config_where_prefixes_messages():
    one_line_error(lambda: DataConfig.from_dict({"w_fraction": 2}, "run.yaml: data"),
                   "run.yaml: data.w_fraction")
    one_line_error(lambda: DataConfig(val_fraction=1.5), "data.val_fraction")
