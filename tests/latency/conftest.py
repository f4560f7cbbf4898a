"""Fixtures of the latency tests."""

from __future__ import annotations

import pytest

from fbnas.latency import build_table

from .fakes import FAST, fake, tiny_space


@pytest.fixture(scope="module")
def built():
    space = tiny_space()
    table = build_table(space, fake(noise=0.02, seed=1), FAST, context_probes=3)
    return space, table
