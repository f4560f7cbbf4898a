"""The timers of fbnas/backends/ made by name: the CPU timer (threads restored), torch-xla
missing or built for another torch, unknown devices and settings, CUDA where there is one."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from conftest import latency_space

from fbnas.errors import FbnasError
from fbnas.latency import Protocol, build_table, make_timer
from fbnas.search_space import SearchSpace


def test_cpu_timer_times_and_restores_threads():
    before = torch.get_num_threads()
    timer = make_timer("cpu", threads=1)
    assert timer.describe()["threads"] == 1
    run = timer.prepare(torch.nn.Conv2d(4, 4, 3, padding=1), (4, 8, 8))
    t = timer.sample(run, 3)
    assert 0 < t < 1
    assert torch.get_num_threads() == before
    assert not run.module.training


def test_xla_without_torch_xla_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_xla", None)  # as if not installed
    with pytest.raises(FbnasError, match=r"pip install 'fbnas\[tpu\]'") as e:
        make_timer("xla")
    assert "\n" not in str(e.value)


def test_xla_built_for_another_torch_is_refused(monkeypatch):
    """torch-xla pins the torch it was built for: a mismatched pair is one line naming both
    versions and the extra (the real timer runs in `pytest -m xla`, tests/backends/test_xla.py)."""
    pkg, core, debug = (types.ModuleType(n) for n in ("torch_xla", "torch_xla.core",
                                                       "torch_xla.debug"))
    xm, met = types.ModuleType("torch_xla.core.xla_model"), types.ModuleType("m")
    pkg.__version__, pkg.core, pkg.debug = "1.13.0", core, debug
    core.xla_model, debug.metrics = xm, met
    for name, mod in {"torch_xla": pkg, "torch_xla.core": core, "torch_xla.debug": debug,
                      "torch_xla.core.xla_model": xm, "torch_xla.debug.metrics": met}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    with pytest.raises(FbnasError, match=r"torch-xla 1.13.0 does not match torch "
                                         r".*fbnas\[tpu\]") as e:
        make_timer("xla")
    assert "\n" not in str(e.value)


def test_unknown_device_and_bad_settings():
    with pytest.raises(FbnasError, match=r"^timer: device: unknown timer backend 'tpu' "
                                         r"\(choose from cpu, cuda, "):
        make_timer("tpu")
    with pytest.raises(FbnasError, match="batch must be a positive integer"):
        make_timer("cpu", batch=0)
    with pytest.raises(FbnasError, match="dtype must be one of"):
        make_timer("cpu", dtype="int8")


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: the CUDA timer (events + synchronize) needs a GPU")
def test_cuda_build_and_measure():
    space = SearchSpace.from_dict(latency_space())
    timer = make_timer("cuda")
    table = build_table(space, timer, Protocol(rounds=3, extra_rounds=0), context_probes=2)
    assert table.meta["backend"] == "cuda" and table.meta["gpu_name"]
    assert table.missing(space) == [] and all(e.value > 0 for e in table.entries.values())
