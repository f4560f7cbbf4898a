"""The XLA timer on a real torch-xla (PJRT's CPU client):
`pytest -m xla tests/backends/test_xla.py`.

These run in the second, separate venv that `.ci/run` builds with the matching torch /
torch-xla pair (torch-xla pins the torch it was built for, so it cannot share the main venv);
the default run deselects them (`-m "not xla"` in pyproject's addopts), and selected
without torch-xla they fail rather than skip.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml
from conftest import latency_space
from torch import nn

from fbnas._cli import main
from fbnas.arch import arch_from_indices
from fbnas.errors import FbnasError
from fbnas.latency import LatencyTable, make_timer
from fbnas.latency.measure import Protocol, measure
from fbnas.search_space import SearchSpace

pytestmark = pytest.mark.xla
os.environ.setdefault("PJRT_DEVICE", "CPU")

TINY = latency_space()
QUICK = ["--rounds", "4", "--sample-ms", "2"]


@pytest.fixture(autouse=True)
def torch_xla():
    """torch-xla itself: selected with `-m xla`, these tests fail (not skip) without it."""
    import torch_xla
    return torch_xla


def test_table_built_and_validated_on_xla(tmp_path, capsys, torch_xla):
    """`fbnas latency build --device xla` on a small space: every entry timed on the XLA
    device, the call overhead taken off, the runtime recorded; the table predicts whole
    networks timed on XLA (validate) and an arch measured there."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({"space": TINY}))
    out = tmp_path / "xla.json"
    assert main(["latency", "build", "--config", str(cfg), "--table", str(out), "--device", "xla",
                 "--probes", "2", "--quiet", *QUICK]) == 0
    table = LatencyTable.load(out)
    space = SearchSpace.from_dict(TINY)
    assert len(table) == 11 and table.meta["backend"] == "xla"
    assert table.meta["runtime"] == "torch_xla"
    assert table.meta["runtime_version"] == torch_xla.__version__
    assert table.meta["device_name"].startswith("XLA")
    # an identity skip runs no graph at all: its time is the call overhead, taken off
    assert all(e.value >= 0 for e in table.entries.values())
    assert all(e.value > 0 for k, e in table.entries.items() if not k.startswith("skip"))
    stem = [k for k in table.entries if k.startswith("stem")]
    others = [e for k, e in table.entries.items() if k not in stem]
    assert others and all("call_overhead_ratio" in e.stats for e in others)
    assert table.predict(arch_from_indices(space, [0, 1, 2, 1, 0], "a"), "raw") > 0
    capsys.readouterr()
    # `--device` defaults to the table's backend
    rep = tmp_path / "rep.json"
    assert main(["latency", "validate", "--config", str(cfg), "--table", str(out), "-n", "6",
                 "--json", str(rep), *QUICK]) == 0
    r = json.loads(rep.read_text())
    assert r["n"] == 6 and all(a["measured_us"] > 0 for a in r["archs"])
    assert -1.0 <= r["table"]["spearman"] <= 1.0
    arch = tmp_path / "a.yaml"
    arch_from_indices(space, [1, 1, 1, 1, 1], "big").save(arch)
    js = tmp_path / "m.json"
    assert main(["latency", "measure", "--arch", str(arch), "--table", str(out),
                 "--json", str(js), *QUICK]) == 0
    assert json.loads(js.read_text())["results"][0]["median_us"] > 0


class _Changing(nn.Module):
    """A different graph at every call: XLA compiles each one."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        for _ in range(self.calls % 5):
            x = x + 1.0
        return x * float(self.calls)


def test_recompilation_during_timing_is_refused():
    timer = make_timer("xla")
    runs = {"changing": timer.prepare(_Changing(), (4, 8, 8), "changing")}
    with pytest.raises(FbnasError, match="XLA recompiled during timed runs") as e:
        measure(timer, runs, Protocol(rounds=3, extra_rounds=0, reference=False))
    assert "\n" not in str(e.value)


def test_a_stable_graph_compiles_once_and_is_timed():
    timer = make_timer("xla")
    run = timer.prepare(nn.Conv2d(4, 8, 3, padding=1), (4, 8, 8), "conv")
    compiled = timer._compiles()
    m = measure(timer, {"conv": run}, Protocol(rounds=3, extra_rounds=0, reference=False))
    assert timer._compiles() == compiled  # traced again every call, never recompiled
    assert 0 < m.ratio("conv") < 1.0


def test_output_is_computed_on_the_device():
    """What the timer runs is the module's real output (a dropped output would execute
    nothing): the XLA result equals eager."""
    timer = make_timer("xla")
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 3, padding=1).eval()
    x = torch.randn(1, 3, 8, 8)
    want = conv(x)
    run = timer.prepare(conv, (3, 8, 8), "conv")
    with torch.no_grad():
        got = run.module(x.to(timer._device())).cpu()
    torch.testing.assert_close(got, want.detach(), rtol=1e-4, atol=1e-5)
