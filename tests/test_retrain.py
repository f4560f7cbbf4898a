"""`fbnas retrain` / `fbnas eval`: a tiny child trained for a few steps, resumed exactly,
initialised from a supernet, evaluated with its own BN statistics, reported in results.json."""

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import digits_run_config

from fbnas._cli import main
from fbnas.arch import arch_from_indices
from fbnas.config import RetrainConfig, config_from_dict
from fbnas.errors import FbnasError
from fbnas.retrain import ChildTrainer
from fbnas.supernet import supernet_child_state
from fbnas.training.checkpoint import load_child
from fbnas.training.logs import close_logger
from fbnas.training.loop import Interrupted

TINY = digits_run_config(
    latency={"cost": "latency", "device": "fake"},
    retrain={"epochs": 3, "warmup_epochs": 1, "lr": 0.05, "device": "cpu",
             "measure_latency": False})


def make_cfg(tmp_path: Path, **sections):
    d = copy.deepcopy(TINY)
    for k, v in sections.items():
        d[k].update(v)
    d["run"]["dir"] = str(tmp_path / "runs")
    d["latency"]["cache_dir"] = str(tmp_path / "cache")
    return config_from_dict(d, "tiny.yaml")


def tiny_arch(cfg, idx=(1, 0)):
    return arch_from_indices(cfg.space, list(idx), "tiny_child")


def train_and_close(t: ChildTrainer):
    try:
        return t.train()
    finally:
        close_logger(t.log)


def stop_after_steps(t: ChildTrainer, epoch: int, step: int) -> None:
    """Make `t` stop (as Ctrl-C would) after `step` steps of 0-based `epoch`."""
    orig = t.train_step

    def step_fn(x, y):
        out = orig(x, y)
        if t.epoch == epoch and t.step + 1 == step:
            t.request_stop()
        return out
    t.train_step = step_fn


def test_lr_schedule_warms_up_then_decays_to_lr_min():
    r = RetrainConfig(epochs=4, warmup_epochs=1, lr=0.1, lr_min=0.01)
    lrs = [r.lr_at(s, 10) for s in range(40)]
    assert lrs[0] == pytest.approx(0.01) and lrs[9] == pytest.approx(0.1)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10], strict=False))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lrs[-1] == pytest.approx(0.01, abs=1e-3)
    assert RetrainConfig(epochs=2, warmup_epochs=0, schedule="constant").lr_at(7, 5) == 0.05


def test_retrain_threads_hold_while_training_and_testing_then_are_restored(tmp_path,
                                                                           monkeypatch):
    """retrain.threads (issue 51): the figures of a CPU training depend on the thread count,
    so a config that sets it trains and tests at that count, whatever the process had."""
    seen = []
    real_epoch, real_eval = ChildTrainer.train_epoch, ChildTrainer._evaluate
    monkeypatch.setattr(ChildTrainer, "train_epoch",
                        lambda t: seen.append(("epoch", torch.get_num_threads())) or real_epoch(t))
    monkeypatch.setattr(ChildTrainer, "_evaluate",
                        lambda t, ld: seen.append(("eval", torch.get_num_threads()))
                        or real_eval(t, ld))
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cfg = make_cfg(tmp_path, retrain={"epochs": 2, "threads": 1})
        train_and_close(ChildTrainer(cfg, tiny_arch(cfg), tmp_path / "r"))
        assert seen and all(n == 1 for _, n in seen) and ("eval", 1) in seen[-1:]
        assert torch.get_num_threads() == 2  # restored
        seen.clear()
        cfg = make_cfg(tmp_path, retrain={"epochs": 1, "warmup_epochs": 0})  # unset: as it was
        train_and_close(ChildTrainer(cfg, tiny_arch(cfg), tmp_path / "r2"))
        assert seen and all(n == 2 for _, n in seen)
    finally:
        torch.set_num_threads(saved)
    with pytest.raises(FbnasError, match="retrain.threads: must be >= 1"):
        make_cfg(tmp_path, retrain={"threads": 0})


def test_bad_retrain_settings_name_the_key(tmp_path):
    with pytest.raises(FbnasError, match="retrain.optimizer"):
        make_cfg(tmp_path, retrain={"optimizer": "lion"})
    with pytest.raises(FbnasError, match="retrain.warmup_epochs"):
        make_cfg(tmp_path, retrain={"epochs": 2, "warmup_epochs": 2})
    with pytest.raises(FbnasError, match="retrain: unknown key 'epoch'"):
        make_cfg(tmp_path, retrain={"epoch": 2})


def test_retrain_trains_and_writes_results(tmp_path):
    cfg = make_cfg(tmp_path, retrain={"epochs": 4})
    arch = tiny_arch(cfg)
    t = ChildTrainer(cfg, arch, tmp_path / "r")
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    res = train_and_close(t)
    run = tmp_path / "r"
    for f in ("arch.yaml", "config.yaml", "checkpoint.pt", "history.json", "results.json"):
        assert (run / f).is_file(), f
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["arch"]["hash"] == arch.hash()
    assert saved["retrain"]["epochs"] == 4
    on_disk = json.loads((run / "results.json").read_text())
    assert on_disk["arch"]["hash"] == arch.hash() and on_disk["fbnas_results"] == 2
    assert on_disk["epochs"] == 4 and 0 <= on_disk["top1"] <= on_disk["top5"] <= 1
    assert on_disk["params"] == sum(p.numel() for p in t.model.parameters())
    assert on_disk["flops"] > 0 and on_disk["measured_us"] is None
    assert res["top1"] == on_disk["top1"]
    # it learned something: 10 classes, chance is 10%
    hist = json.loads((run / "history.json").read_text())
    assert len(hist) == 4 and hist[-1]["train_loss"] < hist[0]["train_loss"]
    after = t.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("stop_epoch,stop_step", [(0, 3), (1, 5)])
def test_resume_mid_epoch_is_exact(tmp_path, stop_epoch, stop_step):
    cfg = make_cfg(tmp_path)
    arch = tiny_arch(cfg)
    straight = ChildTrainer(cfg, arch, tmp_path / "a")
    train_and_close(straight)
    t = ChildTrainer(cfg, arch, tmp_path / "b")
    stop_after_steps(t, stop_epoch, stop_step)
    with pytest.raises(Interrupted):
        train_and_close(t)
    state = torch.load(tmp_path / "b/checkpoint.pt", weights_only=True)
    assert (state["epoch"], state["step"]) == (stop_epoch, stop_step)
    resumed = ChildTrainer(cfg, None, tmp_path / "b", resume=True)
    train_and_close(resumed)
    for k, v in straight.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    a = json.loads((tmp_path / "a/results.json").read_text())
    b = json.loads((tmp_path / "b/results.json").read_text())
    assert a["top1"] == b["top1"] and a["epochs"] == b["epochs"] == 3


def test_cli_retrain_eval_and_resume_refusals(tmp_path, capsys):
    d = copy.deepcopy(TINY)
    d["run"]["dir"] = str(tmp_path / "runs")
    d["latency"]["cache_dir"] = str(tmp_path / "cache")
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(d))
    arch = tiny_arch(config_from_dict(d))
    arch.save(tmp_path / "a.yaml")
    assert main(["retrain", "--arch", str(tmp_path / "a.yaml"), "--config", str(cfg_path),
                 "--set", "retrain.epochs=2", "--set", "run.tensorboard=true"]) == 0
    run = tmp_path / "runs" / f"retrain-{arch.short_hash}"
    assert (run / "results.json").is_file() and list((run / "tb").iterdir())
    res = json.loads((run / "results.json").read_text())
    # eval reproduces the test accuracy of results.json from the checkpoint alone
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--split", "test",
                 "--json", str(tmp_path / "e.json")]) == 0
    ev = json.loads((tmp_path / "e.json").read_text())
    assert ev["top1"] == pytest.approx(res["top1"]) and ev["arch_hash"] == arch.hash()
    assert "top-1" in capsys.readouterr().out
    assert main(["eval", "--checkpoint", str(run), "--split", "val"]) == 0
    # a second run into the same directory is refused; a resume with other settings too
    assert main(["retrain", "--arch", str(tmp_path / "a.yaml"), "--config", str(cfg_path),
                 "--set", "retrain.epochs=2"]) == 2
    assert "already holds a retrain checkpoint" in capsys.readouterr().err
    assert main(["retrain", "--resume", str(run), "--set", "retrain.lr=0.2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "retrain.lr was 0.05" in err and len(err.splitlines()) == 1
    # resuming a finished run re-evaluates and writes the same results
    assert main(["retrain", "--resume", str(run)]) == 0
    assert json.loads((run / "results.json").read_text())["top1"] == res["top1"]
    other = arch_from_indices(config_from_dict(d).space, [2, 2], "other")
    other.save(tmp_path / "b.yaml")
    assert main(["retrain", "--resume", str(run), "--arch", str(tmp_path / "b.yaml")]) == 2
    assert "trains architecture" in capsys.readouterr().err


def test_eval_errors_are_one_line(tmp_path, capsys):
    assert main(["eval", "--checkpoint", str(tmp_path / "nope.pt")]) == 2
    assert "no checkpoint there" in capsys.readouterr().err
    cfg = make_cfg(tmp_path, search={"epochs": 2})
    from fbnas.trainer import SearchTrainer

    s = SearchTrainer(cfg, tmp_path / "search")
    s.train()
    close_logger(s.log)
    assert main(["eval", "--checkpoint", str(tmp_path / "search/checkpoint.pt")]) == 2
    assert "is a 'search' checkpoint, expected 'child'" in capsys.readouterr().err


def test_init_from_supernet_copies_the_chosen_paths(tmp_path):
    cfg = make_cfg(tmp_path)
    from fbnas.trainer import SearchTrainer

    s = SearchTrainer(cfg, tmp_path / "search")
    s.train()
    close_logger(s.log)
    arch = tiny_arch(cfg, (1, 0))
    t = ChildTrainer(cfg, arch, tmp_path / "r", init_from=tmp_path / "search")
    sd = s.model.state_dict()
    child = t.model.state_dict()
    assert set(child) == set(supernet_child_state(torch.load(
        tmp_path / "search/checkpoint.pt", weights_only=True), arch))
    for k, v in child.items():
        if k.startswith("blocks.0."):
            assert torch.equal(v, sd["mixed.0.candidates.1." + k[len("blocks.0."):]])
        elif k.startswith("blocks.1."):
            assert torch.equal(v, sd["mixed.1.candidates.0." + k[len("blocks.1."):]])
        else:
            assert torch.equal(v, sd[k])
    close_logger(t.log)
    saved = yaml.safe_load((tmp_path / "r/config.yaml").read_text())
    assert saved["init_from"] == str(tmp_path / "search")
    # an architecture outside the search's space is refused, naming the layer
    wide = copy.deepcopy(TINY)
    wide["space"]["candidates"] = ["ir_k3_e6", "skip"]
    outside = arch_from_indices(config_from_dict(wide).space, [0, 0], "outside")
    with pytest.raises(FbnasError, match="layer 0 op 'ir_k3_e6' is not a candidate"):
        ChildTrainer(cfg, outside, tmp_path / "r2", init_from=tmp_path / "search")


def test_results_report_predicted_and_measured_latency(tmp_path):
    from fbnas.latency import build_table, make_timer
    from fbnas.latency.measure import Protocol

    cfg = make_cfg(tmp_path, retrain={"epochs": 2, "measure_latency": True})
    table_path = tmp_path / "table.json"
    build_table(cfg.space, make_timer("fake"), Protocol(rounds=3), out=table_path)
    cfg = make_cfg(tmp_path, retrain={"epochs": 2, "measure_latency": True},
                   latency={"table": str(table_path)})
    arch = tiny_arch(cfg)
    res = train_and_close(ChildTrainer(cfg, arch, tmp_path / "r"))
    assert res["predicted_us"] > 0 and res["latency_table"] == str(table_path)
    assert res["measured_us"] > 0 and "fake" in res["latency_device"]


def test_load_child_rejects_weights_of_another_architecture(tmp_path):
    cfg = make_cfg(tmp_path, retrain={"epochs": 2})
    train_and_close(ChildTrainer(cfg, tiny_arch(cfg), tmp_path / "r"))
    state = torch.load(tmp_path / "r/checkpoint.pt", weights_only=True)
    state["arch"] = tiny_arch(cfg, (0, 1)).to_dict()
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(FbnasError, match="weights do not fit architecture"):
        load_child(tmp_path / "bad.pt")


def test_latency_measure_times_the_trained_child_and_its_export(tmp_path, capsys):
    cfg = make_cfg(tmp_path, retrain={"epochs": 2})
    arch = tiny_arch(cfg)
    train_and_close(ChildTrainer(cfg, arch, tmp_path / "r"))
    assert main(["export", "--checkpoint", str(tmp_path / "r"), "--format", "torchscript",
                 "--out", str(tmp_path / "exp")]) == 0
    js = tmp_path / "lat.json"
    assert main(["latency", "measure", "--device", "fake", "--rounds", "3", "--json", str(js),
                 "--model", str(tmp_path / "r"), str(tmp_path / "exp" / "model.ts")]) == 0
    res = json.loads(js.read_text())["results"]
    assert [r["model"] for r in res] == [str(tmp_path / "r"),
                                         str(tmp_path / "exp" / "model.ts")]
    assert all(r["hash"] == arch.hash() and r["median_us"] > 0 for r in res)
    capsys.readouterr()
    assert main(["latency", "measure", "--device", "fake", "--model", str(tmp_path / "x.onnx")
                 ]) == 2
    assert "onnxruntime's own tools" in capsys.readouterr().err
    assert main(["latency", "measure", "--device", "fake"]) == 2


def test_what_the_search_spent_reaches_results_and_fbnas_runs(tmp_path, capsys):
    """A searched architecture's meta `search_cost` (what `fbnas train` spent) is copied into
    results.json and shown in `fbnas runs`' search R column; an architecture without one
    leaves both empty."""
    cfg = make_cfg(tmp_path, retrain={"epochs": 2})
    arch = tiny_arch(cfg)
    spent = {**arch.meta, "search_cost": {"seconds": 42.5, "trainings": 1.75, "budget": 2}}
    searched = arch.__class__(arch.macro, arch.ops, arch.name, arch.space, spent)
    train_and_close(ChildTrainer(cfg, searched, tmp_path / "runs" / "searched"))
    train_and_close(ChildTrainer(cfg, arch, tmp_path / "runs" / "plain"))
    got = {p: json.loads((tmp_path / "runs" / p / "results.json").read_text())
           for p in ("searched", "plain")}
    assert (got["searched"]["search_seconds"], got["searched"]["search_trainings"]) == (42.5, 1.75)
    assert got["plain"]["search_seconds"] is None and got["plain"]["search_trainings"] is None
    assert main(["runs", str(tmp_path / "runs"), "--columns", "run,search_R,search_s"]) == 0
    out = capsys.readouterr().out
    assert "search R" in out and "1.75" in out and "42" in out
