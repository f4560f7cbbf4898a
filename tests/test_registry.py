"""fbnas.registry: the one mechanism behind every extension point, and the config and CLI
taking their choices from it."""

import pytest
import torch
from conftest import digits_run_config

from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.registry import Registry
from fbnas.search.modes import MODES, PathSample, SearchMode
from fbnas.supernet import Supernet


def test_register_lookup_and_choices_in_order():
    r = Registry("widget", "section.widget")
    r.register("b", 2, fast=True)

    @r.register("a", fast=False)
    def a():
        return 1

    assert r.get("b") == 2 and r.get("a") is a
    assert r.choices() == ("b", "a") and list(r) == ["b", "a"] and len(r) == 2
    assert r.choices(fast=True) == ("b",)
    assert r.attr("a", "fast") is False and r.attr("a", "missing", 7) == 7
    assert "a" in r and "c" not in r and 3 not in r


def test_duplicate_raises_and_unknown_names_the_key_and_choices():
    r = Registry("widget", "section.widget")
    r.register("x", 1)
    with pytest.raises(ValueError, match="widget 'x' is already registered"):
        r.register("x", 2)
    assert r.get("x") == 1
    with pytest.raises(FbnasError, match=r"^section\.widget: unknown widget 'y' \(choose from "
                                         r"x\)$"):
        r.get("y")
    with pytest.raises(FbnasError, match=r"^here: unknown widget"):
        r.get("y", "here")
    with pytest.raises(FbnasError, match="unknown widget"):
        r.get(["not", "hashable"])
    r.unregister("x")
    assert r.choices() == ()


@pytest.fixture
def extra_mode():
    @MODES.register("first_only")
    class FirstOnly(SearchMode):
        """Always the first candidate (a test mode)."""

        name = "first_only"

        def sample(self, theta, tau, hard):
            m = [torch.nn.functional.one_hot(torch.tensor(0), len(t)).to(t.dtype) + 0 * t
                 for t in theta]
            return PathSample(m, [[0] for _ in theta], m)

    yield "first_only"
    MODES.unregister("first_only")


def test_a_registered_mode_is_a_config_choice_and_runs(extra_mode, tiny_space):
    d = digits_run_config(search={"mode": extra_mode})
    assert config_from_dict(d).search.mode == extra_mode
    net = Supernet(tiny_space, mode=extra_mode)
    logits, _ = net(torch.randn(2, 3, 16, 16))
    assert logits.shape[0] == 2
    assert net.sample_path(1.0).active == [[0]] * len(net.theta)
