"""Plots of a search run: written atomically, so a failed write keeps the previous PNG."""

from __future__ import annotations

import errno
import json

import pytest
import yaml

from fbnas.errors import FbnasError
from fbnas.search_space import SearchSpace

pytest.importorskip("matplotlib")

from matplotlib.figure import Figure  # noqa: E402

from fbnas.plots import plot_run  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
NAMES = ("theta_final.png", "theta_evolution.png", "curves.png")


@pytest.fixture
def run_dir(tmp_path, tiny_space_dict):
    """A run folder with just what `plot_run` reads: config.yaml and a 3-epoch history.json."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"space": tiny_space_dict,
                                                     "latency": {"cost": "flops"}}))
    ops = SearchSpace.from_dict(tiny_space_dict).layer_candidates()
    hist = [{"epoch": e, "probs": [[1 / len(row)] * len(row) for row in ops], "w_ce": 2.0 - e,
             "val_acc": 0.1 * e, "tau": 5.0 * 0.9**e} for e in range(3)]
    (run / "history.json").write_text(json.dumps(hist))
    return run


def test_plot_run_writes_three_pngs(run_dir):
    written = plot_run(run_dir)
    assert [p.name for p in written] == list(NAMES)
    for p in written:
        assert p.read_bytes().startswith(PNG) and p.stat().st_size > 1000
    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == sorted(NAMES)


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"),
                                 RuntimeError("renderer crashed")], ids=["enospc", "crash"])
def test_a_failing_savefig_keeps_the_previous_png_and_leaves_no_temp_file(run_dir, monkeypatch,
                                                                          exc):
    import matplotlib.pyplot as plt

    out = run_dir / "plots"
    out.mkdir()
    old = {n: b"old " + n.encode() for n in NAMES}
    for n, data in old.items():
        (out / n).write_bytes(data)
    real = Figure.savefig
    calls = []

    def savefig(self, fname, *args, **kwargs):
        calls.append(fname)
        if len(calls) == 1:  # the first plot is written for real
            return real(self, fname, *args, **kwargs)
        # the second fails mid-write (to a file object or to a path, whichever it was given)
        if hasattr(fname, "write"):
            fname.write(PNG + b"half a plot")
            fname.flush()
        else:
            with open(fname, "wb") as f:
                f.write(PNG + b"half a plot")
        raise exc

    monkeypatch.setattr(Figure, "savefig", savefig)
    with pytest.raises(FbnasError if isinstance(exc, OSError) else RuntimeError) as e:
        plot_run(run_dir)
    if isinstance(exc, OSError):
        assert str(out / "theta_evolution.png") in str(e.value)
        assert "no space left" in str(e.value) and "previous file is unchanged" in str(e.value)
    assert len(calls) == 2
    assert (out / "theta_final.png").read_bytes().startswith(PNG)  # replaced whole
    assert (out / "theta_evolution.png").read_bytes() == old["theta_evolution.png"]
    assert (out / "curves.png").read_bytes() == old["curves.png"]  # never reached
    assert sorted(p.name for p in out.iterdir()) == sorted(NAMES)  # no .*.tmp left
    assert plt.get_fignums() == []  # the failed figure was closed too


def test_a_failure_while_drawing_closes_the_figure_and_writes_nothing(run_dir, monkeypatch):
    """An error before savefig (here in tight_layout of the second plot) must not leak the open
    figure into pyplot's registry, nor leave a file for the plot it was drawing."""
    import matplotlib.pyplot as plt

    real = Figure.tight_layout
    calls = []

    def tight_layout(self, *args, **kwargs):
        calls.append(self)
        if len(calls) == 2:
            raise RuntimeError("layout failed")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "tight_layout", tight_layout)
    with pytest.raises(RuntimeError, match="layout failed"):
        plot_run(run_dir)
    assert plt.get_fignums() == []
    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == ["theta_final.png"]
