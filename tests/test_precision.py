"""search/retrain precision (bf16 / fp16 autocast) and channels_last: equal within tolerance."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import digits_run_config

from fbnas.arch import arch_from_indices
from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.retrain import ChildTrainer
from fbnas.trainer import SearchTrainer
from fbnas.training.checkpoint import load_checkpoint
from fbnas.training.logs import close_logger
from fbnas.training.precision import Precision

TINY = digits_run_config(
    search={"w_lr": 0.05, "theta_lr": 0.05, "bn_calib_samples": 64},
    retrain={"epochs": 2, "warmup_epochs": 0, "device": "cpu", "measure_latency": False})


def make_cfg(tmp_path, name="run", search=None, retrain=None, data=None):
    d = copy.deepcopy(TINY)
    d["data"].update(data or {})
    d["search"].update(search or {})
    d["retrain"].update(retrain or {})
    d["run"]["dir"] = str(tmp_path / name)
    return config_from_dict(d, "tiny.yaml")


def trainer(tmp_path, name="run", data=None, **search):
    cfg = make_cfg(tmp_path, name, search, data=data)
    return SearchTrainer(cfg, cfg.run.dir)


def batch(tr):
    x, y = next(iter(tr.data.w_loader))
    return x, y


def same_state(a: SearchTrainer, b: SearchTrainer) -> None:
    b.model.load_state_dict(a.model.state_dict())


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# ---- configuration ------------------------------------------------------------------------------
@pytest.mark.parametrize("section", ["search", "retrain"])
def test_unknown_precision_names_the_key(tmp_path, section):
    d = copy.deepcopy(TINY)
    d[section]["precision"] = "fp8"
    with pytest.raises(FbnasError, match=rf"{section}\.precision.*fp8"):
        config_from_dict(d, "tiny.yaml")


def test_fp16_on_cpu_is_refused_before_anything_is_written(tmp_path):
    cfg = make_cfg(tmp_path, search={"precision": "fp16"})
    with pytest.raises(FbnasError, match=r"search\.precision: fp16 needs a CUDA device"):
        SearchTrainer(cfg, cfg.run.dir)
    assert not (tmp_path / "run").exists()
    arch = arch_from_indices(cfg.space, [0] * cfg.space.num_layers)
    cfg = make_cfg(tmp_path, retrain={"precision": "fp16"})
    with pytest.raises(FbnasError, match=r"retrain\.precision: fp16 needs a CUDA device"):
        ChildTrainer(cfg, arch, tmp_path / "child")
    assert not (tmp_path / "child").exists()


def test_float32_is_a_no_op():
    p = Precision("float32", False, torch.device("cpu"))
    x = torch.randn(2, 3, 4, 4)
    with p.autocast():
        assert (x @ x.transpose(-1, -2)).dtype == torch.float32
    assert p.input(x) is x and p.state_dict() == [] and p.dtype is None


# ---- bf16 ---------------------------------------------------------------------------------------
def test_bf16_forward_and_gradients_match_float32(tmp_path):
    a = trainer(tmp_path, "a")
    b = trainer(tmp_path, "b", precision="bf16")
    same_state(a, b)
    x, y = batch(a)
    grads = {}
    for name, tr in (("f32", a), ("bf16", b)):
        tr.model.train()
        torch.manual_seed(5)
        p = tr.model.sample_path(1.0)
        with tr.prec.autocast():
            logits, cost = tr.model(tr.prec.input(x), m=p.m, cost_m=p.cost_m)
        assert logits.dtype == (torch.bfloat16 if name == "bf16" else torch.float32)
        terms = tr.loss(logits.float(), y, cost.float())
        gw = torch.autograd.grad(terms.total, tr.model.weight_parameters()[:4], retain_graph=True)
        gt = torch.autograd.grad(terms.total, tr.model.arch_parameters())
        grads[name] = (logits.float().detach(), terms.total.detach(), gw, gt)
    lf, tf, gwf, gtf = grads["f32"]
    lb, tb, gwb, gtb = grads["bf16"]
    assert rel_err(lb, lf) < 0.03  # bf16 has an 8-bit mantissa: ~0.4% per rounding
    assert abs(float(tb - tf)) / abs(float(tf)) < 0.02
    for g32, g16 in zip(gwf, gwb, strict=True):
        assert g16.dtype == torch.float32  # master weights stay float32
        # the stem's gradient went back through every layer in bf16: same direction, not digits
        # (over 6 path draws these cosines range 0.977-0.999 on this tiny network)
        assert F.cosine_similarity(g16.flatten(), g32.flatten(), dim=0) > 0.97
    flat32, flat16 = torch.cat(gtf), torch.cat(gtb)
    assert F.cosine_similarity(flat32, flat16, dim=0) > 0.98
    for tr in (a, b):
        close_logger(tr.log)


def test_bf16_search_runs_resumes_bitwise_and_stays_near_float32(tmp_path):
    small = {"limit": 100, "batch_size": 40}  # bf16 kernels are slow on CPUs without bf16
    full = trainer(tmp_path, "full", small, precision="bf16")
    full.train()
    close_logger(full.log)
    ref = trainer(tmp_path, "f32", small)
    ref.train()
    close_logger(ref.log)
    # interrupted after the first epoch, resumed: the same θ, bit for bit
    cut = trainer(tmp_path, "cut", small, precision="bf16")
    cut.train_epoch()
    cut.save()
    close_logger(cut.log)
    cfg = make_cfg(tmp_path, "cut", {"precision": "bf16"}, data=small)
    res = SearchTrainer(cfg, cfg.run.dir, resume=True)
    res.train()
    close_logger(res.log)
    for t_full, t_res, t_ref in zip(full.net.theta, res.net.theta, ref.net.theta, strict=True):
        assert torch.isfinite(t_full).all()
        assert torch.equal(t_full, t_res)
        # one θ epoch of Adam at lr 0.05: θ moved by ~0.2; bf16 keeps it within a quarter of it
        assert (t_full - t_ref).abs().max() < 0.05
    key = "argmax_path_acc"
    assert full.history[-1][key] == pytest.approx(ref.history[-1][key], abs=0.1)


def test_precision_cannot_change_on_resume_but_layout_can(tmp_path):
    tr = trainer(tmp_path)
    tr.train_epoch()
    tr.save()
    close_logger(tr.log)
    cfg = make_cfg(tmp_path, search={"precision": "bf16"})
    with pytest.raises(FbnasError, match=r"search\.precision was 'float32'.*now 'bf16'"):
        SearchTrainer(cfg, cfg.run.dir, resume=True)
    cfg = make_cfg(tmp_path, search={"channels_last": True})
    res = SearchTrainer(cfg, cfg.run.dir, resume=True)
    res.train()
    close_logger(res.log)
    assert res.epoch == 2


def test_old_checkpoints_without_the_keys_resume(tmp_path):
    tr = trainer(tmp_path)
    tr.train_epoch()
    state = tr.state_dict()
    for key in ("precision", "channels_last"):
        del state["config"]["search"][key]
    del state["scalers"]
    from fbnas.training.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "run" / "checkpoint.pt", state)
    close_logger(tr.log)
    cfg = make_cfg(tmp_path)
    res = SearchTrainer(cfg, cfg.run.dir, resume=True)
    assert res.history == tr.history and res.phase == tr.phase and res.step == tr.step
    close_logger(res.log)


# ---- channels_last ------------------------------------------------------------------------------
def test_channels_last_layout_and_equal_results(tmp_path):
    a = trainer(tmp_path, "a")
    b = trainer(tmp_path, "b", channels_last=True)
    convs = [p for p in b.model.parameters() if p.dim() == 4]
    assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    x = torch.randn(2, 3, 4, 4)
    assert b.prec.input(x).is_contiguous(memory_format=torch.channels_last)
    assert not x.is_contiguous(memory_format=torch.channels_last)
    a.train()
    b.train()
    for ta, tb in zip(a.net.theta, b.net.theta, strict=True):
        torch.testing.assert_close(tb, ta, atol=1e-4, rtol=1e-4)
    key = "argmax_path_acc"
    assert b.history[-1][key] == pytest.approx(a.history[-1][key], abs=0.02)
    # the checkpoint loads into a contiguous network with the same values
    st = load_checkpoint(tmp_path / "b" / "checkpoint.pt", kind="search")
    a.model.load_state_dict(st["model"])
    for (n, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), n
    for tr in (a, b):
        close_logger(tr.log)


# ---- retrain -------------------------------------------------------------------------------------
@pytest.mark.parametrize("opts,tol", [({"precision": "bf16"}, 0.02),
                                      ({"channels_last": True}, 1e-5),
                                      ({"precision": "bf16", "channels_last": True}, 0.02)])
def test_retrain_step_matches_float32(tmp_path, opts, tol):
    cfg32 = make_cfg(tmp_path)
    arch = arch_from_indices(cfg32.space, [1] * cfg32.space.num_layers)
    a = ChildTrainer(cfg32, arch, tmp_path / "a")
    b = ChildTrainer(make_cfg(tmp_path, retrain=opts), arch, tmp_path / "b")
    b.model.load_state_dict(a.model.state_dict())
    x, y = next(iter(a.data.train_loader))
    losses = [tr.train_step(x, y)["loss"] for tr in (a, b)]
    assert abs(losses[1] - losses[0]) / losses[0] < tol
    for (n, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert pb.dtype == torch.float32
        torch.testing.assert_close(pb, pa, atol=max(tol, 1e-5) * 0.1, rtol=0.05, msg=n)
    b.train()
    res = b.finish()
    assert 0.0 <= res["top1"] <= 1.0
    assert ChildTrainer(make_cfg(tmp_path, retrain=opts), None, tmp_path / "b",
                        resume=True).epoch == 2
    for tr in (a, b):
        close_logger(tr.log)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast needs CUDA")
def test_fp16_on_cuda_scales_and_saves_the_scalers(tmp_path):
    tr = trainer(tmp_path, precision="fp16", device="cuda")
    tr.train()
    st = load_checkpoint(tmp_path / "run" / "checkpoint.pt", kind="search")
    assert len(st["scalers"]) == 2 and all(s["scale"] > 0 for s in st["scalers"])
    assert all(torch.isfinite(t).all() for t in tr.net.theta)
    close_logger(tr.log)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_without_native_bf16_warns(monkeypatch, native):
    from fbnas.training import precision as precision_mod

    monkeypatch.setattr(precision_mod, "cpu_has_bf16", lambda: native)
    warn = Precision("bf16", False, torch.device("cpu")).warning("retrain")
    assert (warn is None) == native
    if warn is not None:
        assert warn.startswith("retrain.precision bf16: this CPU has no native bf16")
    assert Precision("float32", True, torch.device("cpu")).warning() is None


def test_a_channels_last_model_is_timed_in_the_timer_layout():
    """retrain.channels_last trains NHWC; the latency timer must still time it in its own
    layout (the table's), or measured and predicted latency would not be comparable."""
    from fbnas.latency import make_timer

    net = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.ReLU())
    Precision("float32", True, torch.device("cpu")).model(net)
    assert not net[0].weight.is_contiguous()  # trained NHWC
    timer = make_timer("cpu", threads=1, batch=1, dtype="float32", channels_last=False)
    timer.prepare(net, (4, 8, 8), "child")
    assert net[0].weight.is_contiguous()
    timer = make_timer("cpu", threads=1, batch=1, dtype="float32", channels_last=True)
    timer.prepare(net, (4, 8, 8), "child")
    assert net[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_channels_last_auto_is_nhwc_on_cuda_and_nchw_on_the_cpu():
    """search.channels_last / retrain.channels_last: auto by default (issue 52), true and false
    as before; anything else is one line naming the key."""
    from fbnas.config import RetrainConfig, SearchConfig
    from fbnas.errors import FbnasError
    from fbnas.training.precision import Precision, resolve_channels_last

    assert SearchConfig().channels_last == "auto" and RetrainConfig().channels_last == "auto"
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_channels_last("auto", cuda) is True
    assert resolve_channels_last("auto", cpu) is False
    assert resolve_channels_last(True, cpu) is True and resolve_channels_last(False, cuda) is False
    assert Precision("float32", "auto", cpu).channels_last is False
    assert Precision("float32", True, cpu).channels_last is True
    for v in (True, False, "auto"):
        assert SearchConfig.from_dict({"channels_last": v}).channels_last == v
    for bad in ("yes", 1, 0):
        with pytest.raises(FbnasError, match=r"search.channels_last: expected true, false or "
                                             "auto"):
            SearchConfig.from_dict({"channels_last": bad})
