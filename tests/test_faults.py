"""Fault injection: SIGKILL at any point of a search, a full disk, non-finite losses.

(a) A real `fbnas train` process on a tiny config is killed with SIGKILL (no handler runs) in
    the middle of a weight step, of a θ step and of a checkpoint write; each time the
    checkpoint on disk loads, and `fbnas train --resume` continues. The chain of resumed runs
    ends with exactly (bitwise) the θ and weights of an uninterrupted run. The work a kill
    loses is measured: optimizer steps applied after the last checkpoint.
(b) A full disk (OSError ENOSPC from the file write) while writing a checkpoint, a latency
    table and an architecture: the previous file is intact, no temp file is left, and the CLI
    says so in one line (exit status 2).
(c) Non-finite losses: tests/test_trainer.py covers a NaN θ-step loss under nan_policy stop and
    skip; here the weight step (inf) and the retrain step.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import digits_run_config, fit_through_a_bad_step, nan_gradient

from fbnas._cli import main
from fbnas.arch import Architecture
from fbnas.training.checkpoint import load_checkpoint

ROOT = Path(__file__).parents[1]
EVERY = 6  # run.checkpoint_every_steps
TINY = digits_run_config(
    # 320 samples: 64 val, 205 w, 51 θ -> batch 12: 17 weight steps and 4 θ steps per epoch
    data={"batch_size": 12, "limit": 320},
    search={"epochs": 3, "w_lr": 0.05, "theta_lr": 0.05, "bn_calib_samples": 64},
    run={"checkpoint_every_steps": EVERY})
N_W, N_THETA = 17, 4

# The child: patches torch's optimizers and fbnas' checkpoint writer to log every applied step
# and every checkpoint written, and to SIGKILL itself at the k-th event of one kind; then runs
# the CLI.
CHILD = r'''
import io, os, signal, sys
mode, k, log_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
log = open(log_path, "a", buffering=1)
count = {"w": 0, "theta": 0, "ckpt": 0}

def event(kind):
    count[kind] += 1
    return mode == kind and count[kind] == k

def die():
    log.write("killed\n")
    os.kill(os.getpid(), signal.SIGKILL)

import torch

def wrap_step(cls, kind):
    orig = cls.step
    def step(self, *a, **kw):
        if event(kind):
            die()  # gradients computed, the update not applied
        out = orig(self, *a, **kw)
        log.write(kind + "\n")
        return out
    cls.step = step

wrap_step(torch.optim.SGD, "w")
wrap_step(torch.optim.Adam, "theta")

import fbnas.training.checkpoint as C
orig_write = C.atomic_write
def atomic_write(path, write, mode="w"):
    if event("ckpt"):
        def half(f):  # half of the checkpoint reaches the temp file, then the process dies
            buf = io.BytesIO()
            write(buf)
            data = buf.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
            die()
        return orig_write(path, half, mode)
    orig_write(path, write, mode)
    log.write("ckpt\n")
C.atomic_write = atomic_write

from fbnas._cli import main
sys.exit(main(sys.argv[4:]))
'''


def _config(tmp_path: Path, name: str, **run) -> Path:
    d = copy.deepcopy(TINY)
    d["run"]["dir"] = str(tmp_path / name)
    d["run"].update(run)
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _fbnas(tmp_path: Path, args: list[str], mode: str = "none", k: int = 0) -> tuple[int, list]:
    """Run `fbnas ARGS` in a child process that dies at the k-th `mode` event; returns the
    exit status and the events it logged (steps applied, checkpoints written)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    log = tmp_path / f"events-{mode}-{k}.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script), mode, str(k), str(log), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    events = log.read_text().split() if log.exists() else []
    if mode != "none":
        assert proc.returncode == -9, proc.stderr[-2000:]  # killed by SIGKILL, as planned
        assert events[-1] == "killed"
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.returncode, events


def _lost(events: list[str]) -> int:
    """Optimizer steps applied after the last checkpoint was written: the work lost."""
    tail = events[::-1]
    n = tail.index("ckpt") if "ckpt" in tail else len(tail)
    return sum(1 for e in tail[:n] if e in ("w", "theta"))


def _check_run_files(run: Path) -> dict:
    """The files a killed run leaves are whole: the checkpoint loads, the JSON files parse."""
    state = load_checkpoint(run / "checkpoint.pt", kind="search")
    for name in ("theta.json", "history.json"):
        if (run / name).exists():
            json.loads((run / name).read_text())
    return state


def _weights(state: dict) -> dict[str, torch.Tensor]:
    return state["model"]


@pytest.mark.slow
def test_sigkill_anywhere_then_resume_ends_with_the_same_theta(tmp_path):
    ref_cfg = _config(tmp_path, "straight")
    _fbnas(tmp_path, ["train", "--config", str(ref_cfg)])
    straight = _check_run_files(tmp_path / "straight")

    cfg = _config(tmp_path, "killed")
    run = tmp_path / "killed"
    resume = ["train", "--resume", str(run)]
    lost: dict[str, int] = {}

    # 1. mid weight step 12 of epoch 1: the checkpoint of step 6 is the last; 7-11 are lost
    _, ev = _fbnas(tmp_path, ["train", "--config", str(cfg)], "w", 12)
    lost["weight step"] = _lost(ev)
    state = _check_run_files(run)
    assert (state["epoch"], state["phase"], state["step"]) == (0, "w", 6)
    assert lost["weight step"] == EVERY - 1

    # 2. mid θ step 4 of epoch 2 (the warm-up epoch 1 has none). The step counter restarts
    #    at each phase, so the switch from weight to θ steps is saved too: the last checkpoint
    #    is θ step 0 of epoch 2, and only θ steps 1-3 are lost
    _, ev = _fbnas(tmp_path, resume, "theta", N_THETA)
    lost["theta step"] = _lost(ev)
    state = _check_run_files(run)
    assert (state["epoch"], state["phase"], state["step"]) == (1, "theta", 0)
    assert lost["theta step"] == N_THETA - 1 < EVERY

    # 3. in the middle of writing a checkpoint: the resumed run's 3rd (its 1st is the end of
    #    epoch 2's θ steps, the 2nd the end of epoch 2, the 3rd weight step 6 of epoch 3); the
    #    one before is intact on disk
    before = (run / "checkpoint.pt").read_bytes()
    _, ev = _fbnas(tmp_path, resume, "ckpt", 3)
    lost["checkpoint write"] = _lost(ev)
    state = _check_run_files(run)
    assert (state["epoch"], state["phase"], state["step"]) == (2, "w", 0)
    assert (run / "checkpoint.pt").read_bytes() != before  # the 1st write went through
    leftovers = [p.name for p in run.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1 and leftovers[0].startswith(".checkpoint.pt.")  # never read
    assert lost["checkpoint write"] == EVERY

    # 4. resume to the end: the same θ and weights as the uninterrupted run, bit for bit
    _fbnas(tmp_path, resume)
    final = _check_run_files(run)
    assert final["epoch"] == straight["epoch"] == 3
    a, b = _weights(straight), _weights(final)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    key = "argmax_path_acc"
    assert [h[key] for h in straight["history"]] == [h[key] for h in final["history"]]
    assert (Architecture.load(tmp_path / "straight" / "arch_hard.yaml").hash()
            == Architecture.load(run / "arch_hard.yaml").hash())
    # the bound (docs/robustness.md): at most EVERY - 1 steps since the last checkpoint, or
    # EVERY if the kill hits the write of the next one (plus the step in flight and, at the
    # end of an epoch, its validation)
    assert max(lost.values()) <= EVERY


@pytest.mark.slow
def test_without_checkpoint_every_steps_a_kill_loses_at_most_one_epoch(tmp_path):
    cfg = _config(tmp_path, "epochs", checkpoint_every_steps=0)
    # the last θ step of epoch 2: everything since the end of epoch 1 is lost
    _, ev = _fbnas(tmp_path, ["train", "--config", str(cfg)], "theta", N_THETA)
    state = _check_run_files(tmp_path / "epochs")
    assert (state["epoch"], state["phase"], state["step"]) == (1, "w", 0)
    assert _lost(ev) == N_W + N_THETA - 1 < N_W + N_THETA


# ---- (b) a full disk ---------------------------------------------------------------------------
class _FullDisk:
    """A file whose writes fail with ENOSPC after `budget` bytes (some bytes do land)."""

    def __init__(self, f, budget: int):
        self._f, self._left = f, budget

    def write(self, data) -> int:
        if isinstance(data, memoryview):
            data = data.tobytes()
        if len(data) > self._left:
            self._f.write(data[: self._left])
            self._left = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._left -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


def _fill_disk_for(monkeypatch, target_name: str, budget: int = 100) -> None:
    """Make every atomic write of a file named `target_name` hit a full disk."""
    real_fdopen = os.fdopen

    def fdopen(fd, *a, **kw):
        f = real_fdopen(fd, *a, **kw)
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        return _FullDisk(f, budget) if name.startswith(f".{target_name}.") else f

    monkeypatch.setattr(os, "fdopen", fdopen)


def _one_error_line(err: str, command: str) -> str:
    """The one error line of `fbnas COMMAND` (`command` as "latency build", with its action)."""
    lines = [line for line in err.splitlines() if line.startswith(f"fbnas {command}: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def _searched_once(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("finished")
    d = copy.deepcopy(TINY)
    d["search"].update(epochs=2)
    d["data"].update(limit=120)
    d["run"].update(dir=str(tmp / "run"), checkpoint_every_steps=0)
    cfg = tmp / "c.yaml"
    cfg.write_text(yaml.safe_dump(d))
    assert main(["train", "--config", str(cfg)]) == 0
    return tmp / "run"


@pytest.fixture
def finished_run(_searched_once, tmp_path) -> Path:
    """A finished 2-epoch search run of its own (one search per module, copied per test)."""
    run = tmp_path / "finished"
    shutil.copytree(_searched_once, run)
    return run


def test_disk_full_while_writing_a_checkpoint(finished_run, tmp_path, monkeypatch, capsys):
    """A search whose checkpoint write fails: the CLI says so in one line, status 2; the
    previous checkpoint is intact and resumable; no temp file is left."""
    import shutil

    run = tmp_path / "again"
    shutil.copytree(finished_run, run)
    for f in ("checkpoint.pt", "arch_hard.yaml", "theta.json", "history.json"):
        (run / f).unlink()
    cfg = yaml.safe_load((finished_run / "config.yaml").read_text())
    cfg["run"]["dir"] = str(run)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    prev = (finished_run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(prev)  # a checkpoint from epoch 2 of 2 ...
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    state.update(epoch=1, phase="w", step=0, history=state["history"][:1])
    torch.save(state, run / "checkpoint.pt")  # ... rewound to the end of epoch 1
    prev = (run / "checkpoint.pt").read_bytes()
    _fill_disk_for(monkeypatch, "checkpoint.pt")
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 2
    line = _one_error_line(capsys.readouterr().err, "train")
    assert str(run / "checkpoint.pt") in line and "no space left on device" in line
    assert "previous file is unchanged" in line
    assert (run / "checkpoint.pt").read_bytes() == prev
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    assert main(["train", "--resume", str(run)]) == 0  # the disk has room again: it resumes


def test_disk_full_while_writing_a_latency_table(finished_run, tmp_path, monkeypatch, capsys):
    """`fbnas latency build` extending a table: the old table is intact, no temp file."""
    table = tmp_path / "flops.json"
    cfg = tmp_path / "wider.yaml"
    d = yaml.safe_load((finished_run / "config.yaml").read_text())
    table.write_bytes((finished_run / "cost_table.json").read_bytes())
    d["space"]["stages"][1]["channels"] = 24  # new signatures to add
    cfg.write_text(yaml.safe_dump(d))
    prev = table.read_bytes()
    _fill_disk_for(monkeypatch, "flops.json")
    capsys.readouterr()
    rc = main(["latency", "build", "--config", str(cfg), "--cost", "flops", "--table", str(table)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    line = _one_error_line(err, "latency build")
    assert str(table) in line and "no space left on device" in line
    assert table.read_bytes() == prev
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_disk_full_while_writing_an_architecture(finished_run, tmp_path, monkeypatch, capsys):
    """`fbnas sample`: a fresh file that cannot be written leaves nothing behind."""
    _fill_disk_for(monkeypatch, "arch_hard.yaml", budget=10)
    capsys.readouterr()
    assert main(["sample", str(finished_run), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    line = _one_error_line(err, "sample")
    assert "arch_hard.yaml" in line and "nothing was written" in line
    assert list((tmp_path / "s").iterdir()) == []


# ---- (c) non-finite losses -------------------------------------------------------------------
@pytest.mark.parametrize("check", ["step", "deferred"])
@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_an_infinite_weight_step_loss_is_caught_at_its_step(tmp_path, policy, check):
    """test_trainer covers a NaN in a θ step; this is an inf in a weight step (CE), checked
    at once or on the device (run.nan_check)."""
    from fbnas.config import config_from_dict
    from fbnas.trainer import SearchTrainer

    d = copy.deepcopy(TINY)
    d["search"].update(epochs=2, nan_policy=policy)
    d["data"].update(limit=120)
    d["run"].update(dir=str(tmp_path / "run"), checkpoint_every_steps=0, nan_check=check)
    t = SearchTrainer(config_from_dict(d), tmp_path / "run")
    orig, calls = t.loss.ce, {"n": 0}

    def ce(logits, y):
        calls["n"] += 1
        out = orig(logits, y)
        return out * float("inf") if calls["n"] == 3 else out

    t.loss.ce = ce
    fit_through_a_bad_step(t, policy, r"ce at epoch 1/2, w step 3", (0, "w", 2))


@pytest.mark.parametrize("bad", ["loss", "gradient"])
@pytest.mark.parametrize("check", ["step", "deferred"])
def test_a_non_finite_retrain_loss_stops_at_its_step(finished_run, tmp_path, monkeypatch,
                                                     capsys, check, bad):
    """`fbnas retrain` whose 3rd training loss is NaN (or finite with a NaN gradient): one
    error line naming the step, the last good state saved (finite), and the run resumable;
    checked at once or on the device."""
    import torch.nn.functional as F

    cfg = tmp_path / "c.yaml"
    d = yaml.safe_load((finished_run / "config.yaml").read_text())
    d["retrain"] = {"epochs": 1, "warmup_epochs": 0, "device": "cpu", "measure_latency": False}
    d["run"]["nan_check"] = check
    cfg.write_text(yaml.safe_dump(d))
    real, calls = F.cross_entropy, {"n": 0}

    def cross_entropy(logits, y, *a, **kw):
        out = real(logits, y, *a, **kw)
        if "label_smoothing" in kw:  # the training loss, not the evaluation's
            calls["n"] += 1
            if calls["n"] == 3:
                return out * float("nan") if bad == "loss" else nan_gradient(out)
        return out

    monkeypatch.setattr(F, "cross_entropy", cross_entropy)
    capsys.readouterr()
    rc = main(["retrain", "--arch", str(finished_run / "arch_hard.yaml"), "--config", str(cfg),
               "--out", str(tmp_path / "rt")])
    assert rc == 2
    line = _one_error_line(capsys.readouterr().err, "retrain")
    what = "loss" if bad == "loss" else "gradient (the loss was finite)"
    assert f"non-finite {what} at epoch 1/1 step 3" in line and "checkpoint.pt" in line
    state = load_checkpoint(tmp_path / "rt" / "checkpoint.pt", kind="child")
    assert (state["epoch"], state["step"]) == (0, 2)
    assert all(torch.isfinite(v).all() for v in state["model"].values()
               if v.is_floating_point())
    monkeypatch.undo()
    assert main(["retrain", "--resume", str(tmp_path / "rt")]) == 0
