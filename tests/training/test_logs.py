"""Progress output that reads well anywhere: a tqdm bar on a terminal; on a file or a pipe
plain lines (one per epoch from the log, one every 30 s inside a long phase), no '\\r'
redraws; `run.progress: false` prints no progress at all. The same for the latency
commands' progress (fbnas.latency.build.MeasureProgress)."""

from __future__ import annotations

import io
import re

import pytest
import yaml
from conftest import digits_run_config

import fbnas.latency.build as build
import fbnas.training.logs as logs
from fbnas._cli import main
from fbnas.latency.build import MeasureProgress
from fbnas.training.logs import Progress

EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+) tau ")
STEP_LINE = re.compile(r"^epoch (\d+)/(\d+) (w|theta): (\d+)/(\d+) steps \(\d+%\) in \d+:\d\d")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _train(tmp_path, epochs: int = 3, **run) -> str:
    """A tiny search through the command line; its console output (stdout + stderr)."""
    d = digits_run_config(search={"epochs": epochs, "warmup_epochs": 1},
                          run={"dir": str(tmp_path / "run"), "progress": True, **run})
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(d, sort_keys=False))
    assert main(["train", "--config", str(cfg)]) == 0
    return cfg


def test_training_off_a_terminal_prints_one_plain_line_per_epoch(tmp_path, capsys):
    _train(tmp_path, epochs=3)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "\r" not in text
    lines = text.splitlines()
    epochs = [m.groups() for m in map(EPOCH_LINE.match, lines) if m]
    assert epochs == [(str(e), "3") for e in (1, 2, 3)]
    # short phases (well under 30 s): no step lines, and no blank lines left by bars
    assert not any(STEP_LINE.match(line) for line in lines)
    assert all(line.strip() for line in lines)


def test_a_long_phase_off_a_terminal_prints_a_line_every_period(tmp_path, capsys,
                                                                 monkeypatch):
    """With the period at 0 every step is "long enough": one plain line per step, with the
    bar's figures, in order; still no carriage return."""
    monkeypatch.setattr(logs, "PLAIN_EVERY_S", 0.0)
    _train(tmp_path, epochs=2)
    text = capsys.readouterr().err
    assert "\r" not in text
    steps = [(m, line) for line in text.splitlines() if (m := STEP_LINE.match(line))]
    w1 = [(int(m.group(4)), int(m.group(5)), line) for m, line in steps
          if m.group(1) == "1" and m.group(3) == "w"]
    total = w1[0][1]
    assert [n for n, _, _ in w1] == list(range(1, total + 1))  # one line per step
    assert all("ce=" in line and "acc=" in line and "step/s" in line for _, _, line in w1)
    assert any(m.group(3) == "theta" for m, _ in steps)  # the θ phase of epoch 2 too


def test_progress_false_prints_no_progress_at_all(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(logs, "PLAIN_EVERY_S", 0.0)
    _train(tmp_path, epochs=2, progress=False)
    text = capsys.readouterr().err
    assert not any(STEP_LINE.match(line) for line in text.splitlines())
    assert len([line for line in text.splitlines() if EPOCH_LINE.match(line)]) == 2


def test_progress_is_a_bar_on_a_terminal_and_lines_elsewhere():
    tty, plain = Terminal(), io.StringIO()
    bars = [Progress(4, "epoch 1/1 w", stream=tty, every=0.0),
            Progress(4, "epoch 1/1 w", stream=plain, every=0.0)]
    for p in bars:
        for _ in range(4):
            p.update(1)
            if p.due() or p.bar is None:
                p.show({"ce": 1.25})
        p.close()
    assert bars[0].bar is not None and "\r" in tty.getvalue()  # tqdm redraws in place
    assert bars[1].bar is None and "\r" not in plain.getvalue()
    lines = plain.getvalue().splitlines()
    assert [line.split(":")[1].split()[0] for line in lines] == ["1/4", "2/4", "3/4", "4/4"]
    assert all(line.endswith("ce=1.25") for line in lines)
    # a resumed phase counts from where it stopped
    resumed = io.StringIO()
    p = Progress(10, "retrain 2/5", initial=6, stream=resumed, every=0.0)
    p.update(1)
    p.show()
    assert resumed.getvalue().startswith("retrain 2/5: 7/10 steps (70%) in 0:00")


def test_plain_lines_wait_for_the_period():
    out = io.StringIO()
    p = Progress(100, "x", stream=out, every=3600.0)
    for _ in range(100):
        p.update(1)
        if p.due():
            p.show({"ce": 1.0})
    p.close()
    assert out.getvalue() == ""  # nothing before an hour; the epoch's log line says the rest


@pytest.mark.parametrize("tty", [False, True])
def test_latency_progress_lines_off_a_terminal(tty, monkeypatch):
    """MeasureProgress (latency build / validate): plain lines off a terminal, one at the end;
    a pass that starts over (validate's repeats) keeps counting; extra rounds grow the total."""
    monkeypatch.setattr(build, "PLAIN_EVERY_S", 0.0)
    stream = Terminal() if tty else io.StringIO()
    bar = MeasureProgress(3 * 2, rounds=2, what="validate tiny", stream=stream)
    cb = bar.passes(3)
    for _ in range(2):  # two passes of 3 networks x 2 rounds, then 1 extra round of 1
        for done in range(1, 7):
            cb(done, 6, f"net{done % 3}")
    cb(7, 7, "net0")
    bar.close()
    assert bar.n == 13 and bar.total == 13
    text = stream.getvalue()
    if tty:
        assert bar.bar is not None and "\r" in text
        return
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 14  # one per sample (period 0), one at the end
    assert lines[0].startswith("validate tiny: 1/12 samples (8%) in 0:00, ETA")
    assert lines[-1].startswith("validate tiny: 13/13 samples (100%) in ")
