from __future__ import annotations

import copy
import functools
import gc
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

# torch (and fbnas.search_space, which imports it) is imported where it is used: pytest-xdist's
# controller process loads this file too, and imports nothing it does not run before it
# starts the workers (1.3 s of the fast tier's wall time).

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

# The space of the end-to-end tests: 8x8 grey digits, 10 classes, 2 searchable layers.
DIGITS_SPACE = {
    "name": "tiny", "input_size": 8, "in_channels": 1, "num_classes": 10,
    "stem": {"channels": 8, "stride": 1},
    "candidates": ["ir_k3_e1", "ir_k5_e3", "skip"],
    "stages": [{"channels": 8, "repeats": 1, "stride": 1},
               {"channels": 16, "repeats": 1, "stride": 2}],
    "head": {"channels": 16},
}

# The space of the latency tests: 5 searchable layers, 4 distinct block signatures.
LATENCY_SPACE = {
    "name": "tiny", "input_size": 8, "num_classes": 5, "stem": {"channels": 8, "stride": 1},
    "candidates": ["ir_k3_e1", "ir_k3_e3", "skip"],
    "stages": [{"channels": 8, "repeats": 3, "stride": 1},
               {"channels": 16, "repeats": 2, "stride": 2}],
    "head": {"channels": 32},
}

# FBNet's own search (every candidate computed, each its own weights, the weights trained on
# the relaxed supernet), which most tests exercise; the defaults are the recommended search.
PAPER_SEARCH = {"mode": "full", "weights": "separate", "weight_sampling": "mode",
                "uniform_paths": 0}

# A run config on DIGITS_SPACE that searches for 2 epochs on 200 digits with the FLOPs cost.
_DIGITS_RUN = {
    "space": DIGITS_SPACE,
    "data": {"dataset": "digits", "batch_size": 32, "limit": 200, "val_fraction": 0.2},
    "latency": {"cost": "flops"},
    "loss": {"kind": "fbnet", "alpha": 0.2, "beta": 0.6},
    "search": {"epochs": 2, "warmup_epochs": 1, "seed": 3, "device": "cpu", **PAPER_SEARCH},
    "run": {"progress": False, "tensorboard": False},
}


# The quickstart's config (`base:`) with its space cut to two layers of three candidates (8
# latency-table entries where the quickstart has 44; ir_k5_e6 kept so the sweep's reference
# exists): for the scripts' checks whose cost is timing or lowering every entry of a space.
SMALL_QUICKSTART = """base: quickstart
space:
  name: quickstart_small
  candidates: [ir_k3_e1, ir_k5_e6, skip]
  stages:
    - {channels: 8, repeats: 1, stride: 1}
    - {channels: 16, repeats: 1, stride: 2}
  head: {channels: 32, pool: avg}
"""


@functools.cache
def _nan_gradient():
    import torch

    class NanGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * float("nan")

    return NanGradient


def nan_gradient(x):
    """`x` through an identity whose backward is NaN: a finite loss whose gradient is not (the
    non-finite gradient tests)."""
    return _nan_gradient().apply(x)


def needs(package: str, extra: str):
    """The module `package`, or the calling test skipped with its name and fbnas's extra that
    installs it (an optional package: Ray, ExecuTorch, ONNX Runtime)."""
    return pytest.importorskip(package, reason=f"needs {package}: pip install 'fbnas[{extra}]'")


def fit_through_a_bad_step(t, policy: str, match: str, position: tuple) -> None:
    """Fit search trainer `t`, which meets one non-finite step: under `nan_policy: stop` the
    error matches `match` and the checkpoint holds `position` (epoch, phase, step) and finite
    values; under `skip` the run ends with that one step skipped and finite weights. Closes
    `t`'s log."""
    import torch

    from fbnas.training.checkpoint import load_checkpoint
    from fbnas.training.logs import close_logger
    from fbnas.training.loop import NonFiniteLoss

    try:
        if policy == "stop":
            with pytest.raises(NonFiniteLoss, match=match):
                t.train()
            state = load_checkpoint(t.run_dir / "checkpoint.pt", kind="search")
            assert (state["epoch"], state["phase"], state["step"]) == position
            assert all(torch.isfinite(v).all() for v in state["model"].values()
                       if v.is_floating_point())
        else:
            t.train()
            assert t.skipped_steps == 1
            assert all(torch.isfinite(p).all() for p in t.model.parameters())
    finally:
        close_logger(t.log)


def randomise_bn(net: torch.nn.Module) -> None:
    """Random BatchNorm statistics and affine parameters (seeded): a path that equals its child
    network must equal it with every BN doing something."""
    import torch

    g = torch.Generator().manual_seed(1)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g))
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
            m.weight.data.copy_(torch.randn(m.weight.shape, generator=g))
            m.bias.data.copy_(torch.randn(m.bias.shape, generator=g))


def digits_run_config(retrain: dict | None = None, **sections: dict) -> dict:
    """A fresh copy of the tiny digits run config; each of `sections` (space, data, latency,
    loss, search, run) updates that section's keys, and `retrain`, when given, is the whole
    retrain section (placed before `run`, as in a config file)."""
    d = copy.deepcopy(_DIGITS_RUN)
    for name, keys in sections.items():
        d[name].update(copy.deepcopy(keys))
    if retrain is not None:
        d = {**{k: v for k, v in d.items() if k != "run"}, "retrain": copy.deepcopy(retrain),
             "run": d["run"]}
    return d


def one_line_error(fn, *needles: str) -> str:
    """The message of the FbnasError `fn()` raises: one line, holding every one of `needles`."""
    from fbnas.errors import FbnasError

    with pytest.raises(FbnasError) as ei:
        fn()
    msg = str(ei.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def order(loader) -> list[int]:
    """The dataset indices the loader's next pass visits (advances its sampler's epoch)."""
    return list(iter(loader.sampler))


def latency_space(**over) -> dict:
    """A fresh copy of LATENCY_SPACE with top-level keys replaced by `over`."""
    return copy.deepcopy({**LATENCY_SPACE, **over})


def _xdist_controller(config) -> bool:
    """Whether this process hands the tests to pytest-xdist's workers (and runs none)."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses",
                                                                 0))


def pytest_configure(config):
    """One intra-op thread for the whole run: the tests' networks are tiny, and on a small
    shared machine a second thread only spins (the fast tier ran ~1.7x faster on the 2-core
    VM). Tests about threads (the timers', DataLoader workers) set their own.

    No cyclic garbage collection while the tests are collected, and what collection made
    (the imported packages, the test items) frozen out of later collections: Python's full
    collections over torch's and the tests' objects took about 2 of each worker's 8 seconds
    of start-up, and recur during the tests. Cycles the tests make are still collected."""
    if _xdist_controller(config):
        return
    import torch

    torch.set_num_threads(1)
    gc.disable()


def pytest_collection_finish(session):
    gc.freeze()
    gc.enable()


@pytest.fixture
def tiny_space_dict() -> dict:
    return copy.deepcopy(TINY_SPACE)


@pytest.fixture
def tiny_space():
    from fbnas.search_space import SearchSpace

    return SearchSpace.from_dict(TINY_SPACE, "tiny")


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)


def run_bundle_standalone(folder, rounds: int = 3) -> dict:
    """Run a latency bundle's run_bundle.py from inside its folder with fbnas made
    unimportable (the runner must need only torch and executorch); its results.json."""
    import json
    import subprocess
    import sys

    block = ("import runpy, sys; sys.modules['fbnas'] = None; "
             "runpy.run_path('run_bundle.py', run_name='__main__')")
    run = subprocess.run([sys.executable, "-I", "-c", block, "--rounds", str(rounds)],
                         cwd=folder, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads((folder / "results.json").read_text())



def slow_reference_op(monkeypatch, factor: float) -> None:
    """From now on the fake device's reference op (everything it times but child networks)
    takes `factor` times as long: the reference moving against whole networks after a build."""
    from fbnas.arch import ChildNet
    from fbnas.backends.fake import FakeTimer

    prepare = FakeTimer.prepare

    def slower(self, module, input_chw, label=""):
        run = prepare(self, module, input_chw, label)
        if not isinstance(module, ChildNet):
            run.cost_s *= factor
        return run

    monkeypatch.setattr(FakeTimer, "prepare", slower)


def count_candidate_calls(net) -> list[list[int]]:
    """calls[l][i]: how many times candidate i of searchable layer l of `net` (a Supernet)
    ran. An IRF candidate is counted at its projection conv, which runs once per candidate
    forward whether the layer computed it alone or with others up to its first depthwise
    stage (fbnas.blocks.batched); any other candidate at its own forward."""
    from fbnas.blocks.irf import IRFForward

    calls = [[0] * len(op.candidates) for op in net.mixed]
    for li, op in enumerate(net.mixed):
        for i, block in enumerate(op.candidates):
            where = block.pwl[0] if isinstance(block, IRFForward) else block

            def hook(*_, li=li, i=i):
                calls[li][i] += 1
            where.register_forward_hook(hook)
    return calls


def assert_same_grads_and_buffers(net, ref, what: str) -> None:
    """Every parameter's gradient (present in both or neither) and every buffer of `net`
    equal to `ref`'s, in float64 tolerances; `what` names the case in a failure."""
    import torch

    for (k, p), (_, q) in zip(net.named_parameters(), ref.named_parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), (what, k)
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12,
                                       msg=f"{what} {k}")
    for (k, b), (_, c) in zip(net.named_buffers(), ref.named_buffers(), strict=True):
        torch.testing.assert_close(b, c, rtol=1e-12, atol=1e-12, msg=f"{what} {k}")
