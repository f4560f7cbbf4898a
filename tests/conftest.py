from __future__ import annotations

import pytest
import torch

from fbnas.search_space import SearchSpace

TINY_SPACE = {
    "name": "tiny",
    "input_size": 16,
    "num_classes": 5,
    "stem": {"channels": 8, "stride": 2},
    "candidates": ["ir_k3_e1", "ir_k5_e3", "skip"],
    "stages": [
        {"channels": 8, "repeats": 1, "stride": 1},
        {"channels": 16, "repeats": 2, "stride": 2},
    ],
    "head": {"channels": 32},
}


@pytest.fixture
def tiny_space_dict() -> dict:
    import copy

    return copy.deepcopy(TINY_SPACE)


@pytest.fixture
def tiny_space() -> SearchSpace:
    return SearchSpace.from_dict(TINY_SPACE, "tiny")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
