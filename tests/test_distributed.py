"""Distributed search and retrain under a real `torchrun --nproc-per-node 2` (gloo, CPU).

Each launch runs `fbnas train` / `fbnas retrain` through a small driver script that only
observes: it records every rank's Gumbel samples, dumps each rank's θ / weights at the end, logs
(through a Python audit hook) every file a rank opens for writing, and — to interrupt a run —
sends rank 1 a real SIGTERM at a chosen step. The checks: the ranks end bitwise equal, sampled
the same architectures, only rank 0 wrote run files, and an interrupted distributed run resumed
with torchrun ends exactly where the uninterrupted run did.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from conftest import digits_run_config

from fbnas.errors import FbnasError
from fbnas.training.distributed import (
    DistContext,
    PeriodicAverager,
    init_from_env,
    rank_entry,
    seed_from,
    shared_random,
)

REPO = Path(__file__).resolve().parents[1]

CONFIG = digits_run_config(
    data={"batch_size": 16},
    search={"epochs": 3, "theta_lr": 0.05, "bn_calib_samples": 64},
    retrain={"epochs": 2, "warmup_epochs": 0, "lr": 0.05, "device": "cpu",
             "measure_latency": False},
    run={"tensorboard": True})

DRIVER = textwrap.dedent('''
    """Runs `fbnas ARGS` as one torchrun rank, observing it (tests/test_distributed.py)."""
    import json, os, signal, sys

    import torch

    OUT = os.environ["FBNAS_TEST_OUT"]
    RANK = int(os.environ["RANK"])
    WATCH = os.path.realpath(os.environ["FBNAS_TEST_WATCH"])
    STOP_AT = os.environ.get("FBNAS_TEST_STOP_AT")  # "EPOCH:STEP": rank 1 gets a SIGTERM
    NAN_AT = os.environ.get("FBNAS_TEST_NAN_AT")  # "EPOCH:STEP": rank 1's CE is inf
    writes = []

    def audit(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (any(c in mode for c in "wax+") if isinstance(mode, str)
                       else isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR))
        elif event in ("os.rename", "os.replace"):
            path, writing = args[:2], True
        elif event in ("os.mkdir", "os.remove"):
            path, writing = args[0], True
        else:
            return
        for q in path if isinstance(path, tuple) else (path,):
            if writing and isinstance(q, (str, bytes, os.PathLike)):
                p = os.path.realpath(os.fsdecode(q))
                if p.startswith(WATCH):
                    writes.append(p)

    sys.addaudithook(audit)

    from fbnas.retrain import ChildTrainer
    from fbnas.supernet import Supernet
    from fbnas.trainer import SearchTrainer

    samples = []
    orig_sample = Supernet.sample_path

    def sample_path(self, *a, **k):
        p = orig_sample(self, *a, **k)
        samples.append([t.detach().tolist() for t in p.m])
        return p

    Supernet.sample_path = sample_path

    orig_weight_step = SearchTrainer.weight_step

    def weight_step(self, x, y):
        if STOP_AT and RANK == 1 and f"{self.epoch}:{self.step}" == STOP_AT:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal, to this rank only
        if NAN_AT and RANK == 1 and f"{self.epoch}:{self.step}" == NAN_AT:
            ce = self.loss.ce  # an inf CE on this rank alone
            self.loss.ce = lambda *a: ce(*a) * float("inf")
            try:
                return orig_weight_step(self, x, y)
            finally:
                del self.loss.ce
        return orig_weight_step(self, x, y)

    SearchTrainer.weight_step = weight_step

    def dumping(cls, kind, what):
        orig = cls.train

        def train(self):
            try:
                return orig(self)
            finally:
                torch.save(what(self), os.path.join(OUT, f"{kind}_rank{RANK}.pt"))

        cls.train = train

    dumping(SearchTrainer, "search", lambda t: {
        "theta": [p.detach().clone() for p in t.net.theta], "model": t.net.state_dict()})
    dumping(ChildTrainer, "retrain", lambda t: {"model": t.model.state_dict()})

    import torch.distributed as dist

    import fbnas.training.distributed
    from fbnas._cli import main

    # several commands, separated by "++", run one after the other in this process and in one
    # process group (this driver owns it: re-creating a group under torchrun's store is unsafe)
    fbnas.training.distributed.DistContext.close = lambda self: None
    commands, rcs = [[]], []
    for a in sys.argv[1:]:
        if a == "++":
            commands.append([])
        else:
            commands[-1].append(a)
    for c in commands:
        rcs.append(main(c))
        if rcs[-1]:
            break
    if dist.is_initialized():
        dist.destroy_process_group()
    with open(os.path.join(OUT, f"observed_rank{RANK}.json"), "w") as f:
        json.dump({"writes": writes, "samples": samples, "rcs": rcs}, f)
    sys.exit(max(rcs))
''')


def torchrun(tmp: Path, out: Path, args: list[str], stop_at: str | None = None,
             nproc: int = 2, nan_at: str | None = None) -> subprocess.CompletedProcess:
    driver = tmp / "driver.py"
    driver.write_text(DRIVER)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FBNAS_TEST_OUT": str(out),
           "FBNAS_TEST_WATCH": str(tmp / "runs"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    for key, value in (("FBNAS_TEST_STOP_AT", stop_at), ("FBNAS_TEST_NAN_AT", nan_at)):
        env.pop(key, None)
        if value:
            env[key] = value
    # --standalone: the rendezvous store binds a free port itself, so no other process can take
    # a port between our choosing it and torchrun binding it
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), str(driver), *args]
    return subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=240)


def observed(out: Path, rank: int) -> dict:
    return json.loads((out / f"observed_rank{rank}.json").read_text())


def state(out: Path, rank: int, kind: str = "search") -> dict:
    return torch.load(out / f"{kind}_rank{rank}.pt", weights_only=True)


def assert_same_tensors(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
    else:
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)


def write_config(tmp: Path, name: str, **sections) -> Path:
    d = copy.deepcopy(CONFIG)
    for k, v in sections.items():
        d[k].update(v)
    d["run"]["dir"] = str(tmp / "runs" / name)
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def check_ranks_agree(out: Path, run_dir: Path) -> tuple[dict, dict]:
    s0, s1 = state(out, 0), state(out, 1)
    o0, o1 = observed(out, 0), observed(out, 1)
    assert_same_tensors(s0["theta"], s1["theta"])  # θ bitwise equal on every rank
    assert_same_tensors(s0["model"], s1["model"])  # and the weights and BN statistics
    assert o0["samples"] and o0["samples"] == o1["samples"]  # the same Gumbel samples
    assert len({json.dumps(s) for s in o0["samples"]}) > 1  # which do vary step to step
    assert o1["writes"] == []  # rank 1 wrote nothing in the run directory ...
    assert any(p.endswith("checkpoint.pt") for p in o0["writes"])  # ... rank 0 did
    return s0, o0


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One torchrun launch: a 3-epoch 2-process search, then (same processes, a new process
    group) a 2-epoch retrain with run.ddp_sync_every 2 (local steps, periodic averaging)."""
    from fbnas.arch import arch_from_indices
    from fbnas.config import load_config

    tmp = tmp_path_factory.mktemp("ddp")
    cfg = write_config(tmp, "full")
    rt_cfg = write_config(tmp, "rt", run={"ddp_sync_every": 2, "tensorboard": False})
    arch = tmp / "arch.yaml"
    arch_from_indices(load_config(rt_cfg).space, [1, 0], "tiny_child").save(arch)
    out = tmp / "out_full"
    r = torchrun(tmp, out, ["train", "--config", str(cfg), "++", "retrain", "--arch",
                            str(arch), "--config", str(rt_cfg), "--out",
                            str(tmp / "runs" / "rt" / "child")])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return tmp, out, r


@pytest.mark.slow
def test_two_process_search_ranks_agree_and_only_rank_0_writes(full_run):
    tmp, out, r = full_run
    run = tmp / "runs" / "full"
    s_full, _ = check_ranks_agree(out, run)
    assert r.stdout.count("architecture:") == 1  # only rank 0 prints and logs
    log = (run / "train.log").read_text()
    for e in (1, 2, 3):
        assert log.count(f"epoch {e}/3 ") == 1
    assert len(json.loads((run / "history.json").read_text())) == 3
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 1
    ck = torch.load(run / "checkpoint.pt", weights_only=True)
    assert ck["world_size"] == 2 and len(ck["ranks"]) == 2
    assert_same_tensors(ck["model"], s_full["model"])


@pytest.mark.slow
def test_two_process_retrain_with_local_steps_ends_with_equal_weights(full_run):
    tmp, out, r = full_run
    s0, s1 = state(out, 0, "retrain"), state(out, 1, "retrain")
    assert_same_tensors(s0["model"], s1["model"])  # averaged at the epoch's end
    out_dir = tmp / "runs" / "rt" / "child"
    res = json.loads((out_dir / "results.json").read_text())
    assert res["epochs"] == 2 and 0.0 <= res["top1"] <= 1.0
    assert len(json.loads((out_dir / "history.json").read_text())) == 2
    assert r.stdout.count("written:") == 2  # train's and retrain's, by rank 0 only
    ck = torch.load(out_dir / "checkpoint.pt", weights_only=True)
    assert_same_tensors(ck["model"], s0["model"])


@pytest.mark.slow
def test_interrupted_two_process_search_resumes_exactly(full_run):
    tmp, out_full, _ = full_run
    s_full = state(out_full, 0)
    # the same search; rank 1 alone gets a SIGTERM in epoch 2: both ranks stop together
    cut = write_config(tmp, "cut")
    r = torchrun(tmp, tmp / "out_cut", ["train", "--config", str(cut)], stop_at="1:2")
    assert r.returncode != 0
    assert observed(tmp / "out_cut", 0)["rcs"] == observed(tmp / "out_cut", 1)["rcs"] == [130]
    run = tmp / "runs" / "cut"
    ck = torch.load(run / "checkpoint.pt", weights_only=True)
    assert (ck["epoch"], ck["phase"], ck["step"]) == (1, "w", 3)
    assert_same_tensors(state(tmp / "out_cut", 0)["theta"], state(tmp / "out_cut", 1)["theta"])
    assert observed(tmp / "out_cut", 1)["writes"] == []

    # resumed by torchrun: it ends with exactly the uninterrupted run's θ and weights
    r = torchrun(tmp, tmp / "out_resume", ["train", "--resume", str(run)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s_res, _ = check_ranks_agree(tmp / "out_resume", run)
    assert_same_tensors(s_res["theta"], s_full["theta"])
    assert_same_tensors(s_res["model"], s_full["model"])
    from fbnas.arch import Architecture

    assert Architecture.load(run / "arch_hard.yaml").ops == Architecture.load(
        tmp / "runs" / "full" / "arch_hard.yaml").ops


@pytest.mark.slow
def test_an_inf_on_one_rank_stops_every_rank_at_its_step_under_the_deferred_check(full_run):
    """run.nan_check: deferred under torchrun: the flags are all-reduced on the device and read
    at the same step on every rank, so both ranks stop together, naming rank 1's bad step,
    with the state from before it saved once."""
    tmp, _, _ = full_run
    cfg = write_config(tmp, "nan", run={"nan_check": "deferred", "tensorboard": False})
    r = torchrun(tmp, tmp / "out_nan", ["train", "--config", str(cfg)], nan_at="1:2")
    assert observed(tmp / "out_nan", 0)["rcs"] == observed(tmp / "out_nan", 1)["rcs"] == [2]
    # each rank's error line names the step rank 1 alone saw
    assert r.stderr.count("non-finite loss term ce at epoch 2/3, w step 3") == 2, r.stderr
    ck = torch.load(tmp / "runs" / "nan" / "checkpoint.pt", weights_only=True)
    assert (ck["epoch"], ck["phase"], ck["step"]) == (1, "w", 2)
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())
    s0, s1 = state(tmp / "out_nan", 0), state(tmp / "out_nan", 1)
    assert_same_tensors(s0["theta"], s1["theta"])
    weights = [{k: v for k, v in s["model"].items() if "running" not in k  # BN statistics are
                and "num_batches" not in k} for s in (s0, s1)]  # per rank until a phase ends
    assert_same_tensors(*weights)
    assert observed(tmp / "out_nan", 1)["writes"] == []


@pytest.mark.slow
def test_under_the_deferred_check_ranks_agree_on_a_stop_at_the_poll_steps(full_run):
    """A SIGTERM to rank 1 alone under run.nan_check deferred: agreeing on it is a collective
    read, so it waits for the next poll step (every 32 steps or a checkpoint) or the epoch's
    end, and both ranks stop and save there together."""
    tmp, _, _ = full_run
    cfg = write_config(tmp, "cut_deferred", run={"nan_check": "deferred", "tensorboard": False})
    r = torchrun(tmp, tmp / "out_cut_d", ["train", "--config", str(cfg)], stop_at="1:2")
    assert r.returncode != 0
    assert observed(tmp / "out_cut_d", 0)["rcs"] == observed(tmp / "out_cut_d", 1)["rcs"] \
        == [130]
    ck = torch.load(tmp / "runs" / "cut_deferred" / "checkpoint.pt", weights_only=True)
    # sent in epoch 2's w phase; a phase here is under 32 steps: agreed at the epoch's end
    assert (ck["epoch"], ck["phase"], ck["step"]) == (2, "w", 0)
    assert_same_tensors(state(tmp / "out_cut_d", 0)["theta"], state(tmp / "out_cut_d", 1)["theta"])


# ---- single-process pieces (no process group) -------------------------------------------------
def test_single_process_context_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = init_from_env(device="cpu")
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.distributed) == (0, 1, True, False)
    t = torch.arange(3.0)
    ctx.all_reduce_mean([t])
    ctx.broadcast_tensors([t])
    assert torch.equal(t, torch.arange(3.0))
    assert ctx.any_true(True) and not ctx.any_true(False)
    assert ctx.broadcast_object({"a": 1}) == {"a": 1}
    assert ctx.all_gather_object(5) == [5]
    assert ctx.sum_floats([1.0, 2.0]) == [1.0, 2.0]
    ctx.barrier()
    ctx.close()


def test_init_from_env_needs_the_rendezvous_variables(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(FbnasError, match="MASTER_ADDR"):
        init_from_env(device="cpu")
    with pytest.raises(FbnasError, match="ddp_backend"):
        init_from_env(device="cpu", backend="mpi")


def test_shared_random_is_reproducible_and_leaves_the_global_stream_alone():
    torch.manual_seed(1)
    before = torch.get_rng_state()
    with shared_random(torch.device("cpu"), seed_from(3, 1, 0)):
        a = torch.rand(4)
    with shared_random(torch.device("cpu"), seed_from(3, 1, 0)):
        b = torch.rand(4)
    with shared_random(torch.device("cpu"), seed_from(3, 1, 1)):
        c = torch.rand(4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.get_rng_state(), before)


def test_resuming_with_another_number_of_processes_only_at_an_epoch_start():
    two = {"world_size": 2, "ranks": [{"rng": {"r": 0}}, {"rng": {"r": 1}}]}
    one = DistContext()
    with pytest.raises(FbnasError, match="resume it with 2"):
        rank_entry(one, two, at_epoch_start=False, where="ck")
    assert rank_entry(one, two, at_epoch_start=True, where="ck") is None
    assert rank_entry(DistContext(rank=1, world_size=2), two, at_epoch_start=False,
                      where="ck") == {"rng": {"r": 1}}
    assert rank_entry(one, {"rng": 0}, at_epoch_start=False, where="ck") is None
    with pytest.raises(FbnasError, match="damaged"):
        rank_entry(one, {"world_size": 2, "ranks": [{"rng": {}}]}, at_epoch_start=True,
                   where="ck")


def test_periodic_averager_is_inactive_in_one_process():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    avg = PeriodicAverager(DistContext(), [p], opt, every=4)
    assert not avg.active
    avg.after_step()
    avg.sync()
    assert avg.pending == 0
