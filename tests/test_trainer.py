"""The search workflow on a tiny space: end to end, phase separation, exact resume, errors."""

import copy
from pathlib import Path

import pytest
import torch
import yaml
from conftest import digits_run_config, fit_through_a_bad_step

from fbnas._cli import main
from fbnas.arch import Architecture, build_child
from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.trainer import SearchTrainer
from fbnas.training.checkpoint import load_checkpoint
from fbnas.training.logs import close_logger
from fbnas.training.loop import Interrupted

TINY = digits_run_config(data={"limit": 300},
                         search={"epochs": 4, "w_lr": 0.05, "theta_lr": 0.05})


def make_cfg(tmp_path: Path, name: str = "run", **sections):
    d = copy.deepcopy(TINY)
    for k, v in sections.items():
        d[k].update(v)
    d["run"]["dir"] = str(tmp_path / name)
    return config_from_dict(d, "tiny.yaml")


def trainer_for(cfg, resume=False) -> SearchTrainer:
    return SearchTrainer(cfg, cfg.run.dir, resume=resume)


def run_to_end(cfg, resume=False) -> SearchTrainer:
    t = trainer_for(cfg, resume)
    try:
        t.train()
    finally:
        close_logger(t.log)
    return t


def test_cli_search_end_to_end(tmp_path, capsys):
    cfg_path = tmp_path / "tiny.yaml"
    d = copy.deepcopy(TINY)
    d["run"]["dir"] = str(tmp_path / "run")
    d["run"]["tensorboard"] = True
    cfg_path.write_text(yaml.safe_dump(d))
    assert main(["train", "--config", str(cfg_path), "--set", "search.epochs=3"]) == 0
    run = tmp_path / "run"
    for f in ("checkpoint.pt", "config.yaml", "history.json", "train.log", "arch_hard.yaml",
              "theta.json", "cost_table.json"):
        assert (run / f).is_file(), f
    assert list((run / "tb").iterdir())
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["search"]["epochs"] == 3 and saved["search"]["tau0"] == 5.0
    assert main(["sample", str(run), "--hard"]) == 0
    hard = Architecture.load(run / "samples/arch_hard.yaml")
    assert hard.ops == Architecture.load(run / "arch_hard.yaml").ops
    assert hard.meta["flops"] > 0 and 0 < hard.meta["probability"] <= 1
    net = build_child(hard)
    assert net(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    assert main(["sample", str(run), "--soft", "-n", "6", "--seed", "1"]) == 0
    soft = sorted((run / "samples").glob("arch_soft_*.yaml"))
    assert 1 <= len(soft) <= 6
    probs = [Architecture.load(p).meta["probability"] for p in soft]
    assert probs == sorted(probs, reverse=True)
    assert len({Architecture.load(p).hash() for p in soft}) == len(soft)
    pytest.importorskip("matplotlib")
    assert main(["plot", str(run)]) == 0
    for f in ("theta_final.png", "theta_evolution.png", "curves.png"):
        assert (run / "plots" / f).stat().st_size > 1000


def interrupt_after_first_epoch(cfg) -> None:
    """Run `cfg`'s search until a Ctrl-C at the end of epoch 1 saves and interrupts it."""
    t = trainer_for(cfg)
    stop_after_epoch(t, 1)
    with pytest.raises(Interrupted):
        t.train()
    close_logger(t.log)


def stop_after_epoch(t: SearchTrainer, n: int) -> None:
    """Make `t` stop (as Ctrl-C would) at the end of its n-th epoch (1-based)."""
    orig = t.train_epoch

    def epoch():
        rec = orig()
        if t.epoch + 1 == n:
            t.request_stop()
        return rec
    t.train_epoch = epoch


def same(xs, ys) -> bool:
    return all(torch.equal(a, b) for a, b in zip(xs, ys, strict=True))


def some_changed(xs, ys) -> bool:
    """Some tensor changed."""
    return any(not torch.equal(a, b) for a, b in zip(xs, ys, strict=True))


def test_phases_update_only_their_parameters(tmp_path):
    t = trainer_for(make_cfg(tmp_path))
    try:
        x, y = next(iter(t.data.w_loader))
        theta0 = [p.detach().clone() for p in t.model.arch_parameters()]
        w0 = [p.detach().clone() for p in t.model.weight_parameters()]
        t.weight_step(x, y)
        assert all(p.grad is None for p in t.model.arch_parameters())
        assert same(theta0, t.model.arch_parameters())
        assert some_changed(w0, t.model.weight_parameters())
        w1 = [p.detach().clone() for p in t.model.weight_parameters()]
        t.w_opt.zero_grad(set_to_none=True)
        t.theta_step(x, y)
        assert all(p.grad is None for p in t.model.weight_parameters())
        assert same(w1, t.model.weight_parameters())
        assert some_changed(theta0, t.model.arch_parameters())
    finally:
        close_logger(t.log)


def test_warmup_epochs_leave_theta_untouched(tmp_path):
    cfg = make_cfg(tmp_path, search={"epochs": 3, "warmup_epochs": 2})
    t = trainer_for(cfg)
    try:
        t.train_epoch()
        assert all(p.detach().abs().sum().item() == 0 for p in t.model.arch_parameters())
    finally:
        close_logger(t.log)


# 6 weight steps and 1 θ step per epoch: stop mid-phase in epoch 2 (w), in epoch 3 (θ), or
# at the end of epoch 2.
@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    return run_to_end(make_cfg(tmp_path_factory.mktemp("straight")))


@pytest.mark.parametrize("stop_at", [  # mid weight phase in the fast tier, the others slow
    ("w", 9), pytest.param(("theta", 2), marks=pytest.mark.slow),
    pytest.param(("epoch_end", 2), marks=pytest.mark.slow)])
def test_resume_gives_the_same_theta_as_an_uninterrupted_run(tmp_path, stop_at, straight_run):
    straight = straight_run
    cfg = make_cfg(tmp_path, "interrupted")
    t = trainer_for(cfg)
    phase, when = stop_at
    calls = {"w": 0, "theta": 0}
    orig_w, orig_t = t.weight_step, t.theta_step

    def wrap(kind, fn):
        def step(x, y):
            calls[kind] += 1
            if phase == kind and calls[kind] == when:
                t.request_stop()
            return fn(x, y)
        return step

    t.weight_step, t.theta_step = wrap("w", orig_w), wrap("theta", orig_t)
    if phase == "epoch_end":
        stop_after_epoch(t, when)
    with pytest.raises(Interrupted):
        t.train()
    close_logger(t.log)
    assert len(t.data.w_loader) == 6 and len(t.data.theta_loader) == 1
    assert t.epoch < cfg.search.epochs
    if phase != "epoch_end":
        assert (t.phase, t.step) == (phase, when - 6 * (when // 6) if phase == "w" else 1)
        # the running sums, kept on the device while stepping, are saved as plain floats
        sums = load_checkpoint(t.run_dir / "checkpoint.pt")["partial"]["sums"]
        assert sums and all(type(v) is float for v in sums.values())
    resumed = run_to_end(cfg, resume=True)
    for a, b in zip(straight.model.arch_parameters(), resumed.model.arch_parameters(),
                    strict=True):
        assert torch.equal(a, b)
    for key in ("argmax_path_acc", "w_ce", "w_acc", "w_cost", "theta_loss", "theta_cost_term"):
        assert [h.get(key) for h in straight.history] == [h.get(key) for h in resumed.history]


def test_a_run_dir_is_not_silently_overwritten(tmp_path):
    cfg = make_cfg(tmp_path, search={"epochs": 2})
    run_to_end(cfg)
    with pytest.raises(FbnasError, match="already holds a search checkpoint"):
        trainer_for(cfg)


def test_resume_refuses_another_space_or_table(tmp_path):
    cfg = make_cfg(tmp_path, search={"epochs": 2})
    run_to_end(cfg)
    d = cfg.resolved()
    d["space"]["stages"][1]["channels"] = 24
    other = config_from_dict(d, "changed.yaml")
    with pytest.raises(FbnasError, match="another search space"):
        trainer_for(other, resume=True)
    d = cfg.resolved()
    d["latency"]["cost"] = "params"
    with pytest.raises(FbnasError, match="latency.cost was 'flops' in this run"):
        trainer_for(config_from_dict(d, "changed.yaml"), resume=True)


def test_resume_refuses_a_table_file_whose_values_changed(tmp_path):
    from fbnas.latency import LatencyTable, build_cost_table

    table_path = tmp_path / "flops.json"
    build_cost_table(config_from_dict(copy.deepcopy(TINY)).space, "flops").save(table_path)
    cfg = make_cfg(tmp_path, search={"epochs": 2},
                   latency={"cost": "flops", "table": str(table_path)})
    run_to_end(cfg)
    table = LatencyTable.load(table_path)
    key = next(iter(table.entries))
    table.entries[key].value *= 2
    table.save(table_path)
    with pytest.raises(FbnasError, match="another cost table"):
        trainer_for(cfg, resume=True)


def test_corrupted_checkpoint_is_a_clear_error(tmp_path, capsys):
    cfg = make_cfg(tmp_path, search={"epochs": 2})
    run_to_end(cfg)
    ck = Path(cfg.run.dir) / "checkpoint.pt"
    ck.write_bytes(ck.read_bytes()[: ck.stat().st_size // 2])
    capsys.readouterr()
    assert main(["train", "--resume", cfg.run.dir]) == 2
    err = capsys.readouterr().err
    assert "checkpoint.pt: corrupted" in err and err.count("\n") == 1
    assert main(["sample", cfg.run.dir]) == 2


def test_missing_latency_table_is_a_clear_error(tmp_path, capsys):
    cfg_path = tmp_path / "c.yaml"
    d = copy.deepcopy(TINY)
    d["latency"] = {"cost": "latency", "table": str(tmp_path / "nope.json")}
    d["run"]["dir"] = str(tmp_path / "r")
    cfg_path.write_text(yaml.safe_dump(d))
    assert main(["train", "--config", str(cfg_path)]) == 2
    err = capsys.readouterr().err
    assert "nope.json" in err and err.count("\n") == 1
    assert not (tmp_path / "r" / "checkpoint.pt").exists()


@pytest.mark.parametrize("policy, check", [  # two in the fast tier, the other two slow
    ("stop", "step"), ("skip", "deferred"),
    pytest.param("stop", "deferred", marks=pytest.mark.slow),
    pytest.param("skip", "step", marks=pytest.mark.slow)])
def test_non_finite_loss_is_caught_at_its_step(tmp_path, policy, check):
    """Read at once (`step`) or on the device and polled later (`deferred`, fbnas.training._guard):
    the same step named, the same position saved, nothing non-finite applied."""
    cfg = make_cfg(tmp_path, search={"epochs": 3, "nan_policy": policy},
                   run={"nan_check": check})
    t = trainer_for(cfg)
    orig = t.loss.cost_term
    count = {"n": 0}

    def bad_term(cost):
        count["n"] += 1
        out = orig(cost)
        return out * float("nan") if count["n"] == 2 else out

    t.loss.cost_term = bad_term
    # warm-up epoch 1 has no θ step; epoch 2's θ step is call 1, epoch 3's call 2
    fit_through_a_bad_step(t, policy, r"cost_term.* at epoch 3/3, theta step 1",
                           (2, "theta", 0))


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_real_signal_saves_and_the_run_resumes(tmp_path, sig):
    import signal
    import subprocess
    import sys
    import time

    d = copy.deepcopy(TINY)
    d["run"]["dir"] = str(tmp_path / "run")
    d["search"]["epochs"] = 200
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(d))
    proc = subprocess.Popen([sys.executable, "-m", "fbnas", "train", "--config", str(cfg_path)],
                            cwd=Path(__file__).parents[1], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    history = tmp_path / "run" / "history.json"
    deadline = time.time() + 120
    while not history.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "--resume" in err
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert 1 <= state["epoch"] < 200
    # the run resumes where it stopped (one more epoch here, not all 200)
    cfg = config_from_dict(yaml.safe_load((tmp_path / "run" / "config.yaml").read_text()))
    t = trainer_for(cfg, resume=True)
    try:
        assert (t.epoch, t.phase) == (state["epoch"], state["phase"])
        rec = t.train_epoch()
        assert rec["epoch"] == state["epoch"] + 1
    finally:
        close_logger(t.log)


def test_resume_uses_the_runs_own_latency_table(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cfg = make_cfg(tmp_path, search={"epochs": 2},
                   latency={"cost": "latency", "device": "fake", "cache_dir": str(cache)})
    t = trainer_for(cfg)
    close_logger(t.log)
    assert t.costs.table.meta["backend"] == "fake" and list(cache.iterdir())
    t.save()
    for f in cache.iterdir():  # the cache is gone: resuming must not measure again
        f.unlink()

    def no_build(*a, **k):
        raise AssertionError("resume re-measured the latency table")

    monkeypatch.setattr("fbnas.latency.build_table", no_build)
    resumed = trainer_for(cfg, resume=True)
    close_logger(resumed.log)
    assert resumed.costs.fingerprint == t.costs.fingerprint


def test_resume_refuses_changed_settings_but_allows_where_it_runs(tmp_path, capsys):
    cfg = make_cfg(tmp_path, search={"epochs": 2})
    run_to_end(cfg)
    capsys.readouterr()
    assert main(["train", "--resume", cfg.run.dir, "--set", "search.w_lr=1.0"]) == 2
    err = capsys.readouterr().err
    assert "search.w_lr was 0.05 in this run, now 1.0" in err
    assert main(["train", "--resume", cfg.run.dir, "--set", "data.w_fraction=0.5"]) == 2
    assert main(["train", "--resume", cfg.run.dir, "--set", "run.progress=true",
                 "--set", "data.workers=0"]) == 0


def test_resume_does_not_overwrite_the_runs_table_when_refused(tmp_path):
    cfg = make_cfg(tmp_path, search={"epochs": 2})
    run_to_end(cfg)
    table = Path(cfg.run.dir) / "cost_table.json"
    before = table.read_bytes()
    assert main(["train", "--resume", cfg.run.dir, "--set", "latency.cost=params"]) == 2
    assert table.read_bytes() == before


def test_no_validation_split_runs(tmp_path):
    t = run_to_end(make_cfg(tmp_path, search={"epochs": 2}, data={"val_fraction": 0.0}))
    assert "argmax_path_acc" not in t.history[-1] and "predicted" in t.history[-1]


def test_null_means_default_and_grad_clip_null_disables(tmp_path):
    d = copy.deepcopy(TINY)
    d["search"].update(epochs=None, tau0=None, grad_clip=None)
    cfg = config_from_dict(d)
    assert cfg.search.epochs == 90 and cfg.search.tau0 == 5.0 and cfg.search.grad_clip is None
    d["search"]["seed"] = 2**64
    with pytest.raises(FbnasError, match="search.seed: must be <="):
        config_from_dict(d)


def test_same_seed_same_theta_whether_the_table_is_measured_or_cached(tmp_path):
    cache = str(tmp_path / "cache")
    runs = [run_to_end(make_cfg(tmp_path, f"r{i}", search={"epochs": 2},
                                latency={"cost": "latency", "device": "fake",
                                         "cache_dir": cache})) for i in range(2)]
    assert "measured now" in runs[0].costs.description
    assert "cached" in runs[1].costs.description
    assert same(runs[0].model.arch_parameters(), runs[1].model.arch_parameters())


@pytest.mark.slow
def test_resume_is_exact_with_worker_processes(tmp_path):
    sections = {"search": {"epochs": 3}, "data": {"workers": 2}}
    straight = run_to_end(make_cfg(tmp_path, "straight", **sections))
    cfg = make_cfg(tmp_path, "stopped", **sections)
    interrupt_after_first_epoch(cfg)
    resumed = run_to_end(cfg, resume=True)
    assert same(straight.model.arch_parameters(), resumed.model.arch_parameters())


def test_output_path_that_is_a_file_is_a_clear_error(tmp_path, capsys):
    cfg = make_cfg(tmp_path, search={"epochs": 2})
    run_to_end(cfg)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    capsys.readouterr()
    assert main(["sample", cfg.run.dir, "--out", str(blocker)]) == 2
    assert "cannot create directory" in capsys.readouterr().err


def test_runs_from_before_search_mode_existed_still_resume(tmp_path):
    cfg = make_cfg(tmp_path, search={"epochs": 2})
    interrupt_after_first_epoch(cfg)
    ck = Path(cfg.run.dir) / "checkpoint.pt"
    state = torch.load(ck, weights_only=True)
    for key in ("mode", "checkpoint_activations"):
        del state["config"]["search"][key]
    del state["config"]["run"]["ddp_sync_every"]
    torch.save(state, ck)
    assert run_to_end(cfg, resume=True).epoch == 2


def test_resume_may_switch_activation_checkpointing_but_not_the_mode(tmp_path):
    cfg = make_cfg(tmp_path, search={"epochs": 2})
    interrupt_after_first_epoch(cfg)
    with pytest.raises(FbnasError, match="search.mode was 'full' in this run"):
        trainer_for(make_cfg(tmp_path, search={"epochs": 2, "mode": "two_path"}), True)
    on = make_cfg(tmp_path, search={"epochs": 2, "checkpoint_activations": True})
    assert run_to_end(on, resume=True).model.checkpoint_activations


def test_lines_logged_before_the_run_folder_exists_reach_train_log(tmp_path):
    from fbnas.retrain import ChildTrainer

    t = run_to_end(make_cfg(tmp_path, "search"))
    cfg = config_from_dict({**copy.deepcopy(TINY), "retrain": {"epochs": 1, "warmup_epochs": 0,
                                                               "device": "cpu"}}, "tiny.yaml")
    child = ChildTrainer(cfg, t.final_arch(), tmp_path / "child", init_from=tmp_path / "search")
    try:
        # logged while the supernet checkpoint was read, before the folder was made
        assert "initialised" in (tmp_path / "child" / "train.log").read_text()
    finally:
        close_logger(child.log)


def test_a_refused_trainer_leaves_a_live_one_on_the_same_folder_logging(tmp_path):
    cfg = make_cfg(tmp_path)
    live = trainer_for(cfg)
    try:
        with pytest.raises(FbnasError, match="fp16 needs a CUDA device"):
            trainer_for(make_cfg(tmp_path, search={"precision": "fp16"}))
        live.log.info("still logging")
        assert "still logging" in (tmp_path / "run" / "train.log").read_text()
    finally:
        close_logger(live.log)


def test_a_search_with_its_data_on_the_device_resumes_exactly(tmp_path):
    """data.placement: device (forced here on the CPU): the search runs on batches held on
    the device and a run stopped mid-phase resumes to the same θ as an uninterrupted one."""
    sections = {"data": {"placement": "device"}, "search": {"epochs": 3}}
    straight = run_to_end(make_cfg(tmp_path, "straight", **sections))
    assert type(straight.data.w_loader).__name__ == "DeviceBatches"
    cfg = make_cfg(tmp_path, "interrupted", **sections)
    t = trainer_for(cfg)
    orig, calls = t.weight_step, [0]

    def step(x, y):
        calls[0] += 1
        if calls[0] == 8:
            t.request_stop()
        return orig(x, y)

    t.weight_step = step
    with pytest.raises(Interrupted):
        t.train()
    close_logger(t.log)
    resumed = run_to_end(cfg, resume=True)
    for a, b in zip(straight.model.arch_parameters(), resumed.model.arch_parameters(),
                    strict=True):
        assert torch.equal(a, b)
    assert [h["w_ce"] for h in straight.history] == [h["w_ce"] for h in resumed.history]
