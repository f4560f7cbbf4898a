"""Latency targets: parsing, the target losses, the FBNet scale reference, fitting the final
architecture onto the target, and warm-up path sampling."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import yaml
from conftest import digits_run_config

from fbnas.cli import main
from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.fit.onto_target import fit_to_target, predicted_cost
from fbnas.loss import FBNetLoss, HingeLoss, LossConfig, TargetLoss, parse_target, resolve_target
from fbnas.run import close_logger
from fbnas.trainer import SearchTrainer


def run_config(loss: dict | None = None, **sections: dict) -> dict:
    """The tiny digits run config with its loss section replaced by `loss`."""
    d = digits_run_config(**sections)
    if loss is not None:
        d["loss"] = dict(loss)
    return d


LOGITS = torch.tensor([[2.0, 0.5, -1.0], [0.1, 1.5, 0.3]])
LABELS = torch.tensor([0, 1])


@pytest.mark.parametrize("raw, bounds, want", [
    ("1.2ms", None, 1200.0), ("900us", None, 900.0), ("900µs", None, 900.0),
    ("0.002s", None, 2000.0), (" 1.5e3 us ", None, 1500.0), (750, None, 750.0),
    (0.25, None, 0.25), ("0.6x", (100.0, 200.0), 160.0), ("0x", (100.0, 200.0), 100.0),
    ("1x", (100.0, 200.0), 200.0),
])
def test_targets_resolve_to_the_tables_unit(raw, bounds, want):
    assert resolve_target(raw, bounds) == pytest.approx(want)


@pytest.mark.parametrize("raw", ["fast", "1.2 parsecs", "ms", "-1ms", "0ms", -3, 0, True,
                                 [1], "1.2.3ms", "nan ms", "inf"])
def test_malformed_targets_name_the_key(raw):
    with pytest.raises(FbnasError, match=r"^loss\.target: "):
        parse_target(raw, "loss.target")


def test_a_relative_target_needs_the_spaces_range():
    with pytest.raises(FbnasError, match="range"):
        resolve_target("0.5x", None)


def test_a_time_target_needs_a_latency_table():
    d = run_config(loss={"kind": "target", "target": "1ms"})
    with pytest.raises(FbnasError, match="loss.target: '1ms' is a time, but latency.cost is"):
        config_from_dict(d, "c.yaml")
    d = run_config(loss={"kind": "target", "target": "0.4x"})  # relative: any cost
    assert config_from_dict(d, "c.yaml").loss.to_dict()["target"] == "0.4x"


def test_the_resolved_loss_keeps_the_target_as_written():
    cfg = LossConfig.from_dict({"kind": "hinge", "target": "1.5ms"})
    assert cfg.to_dict() == {"kind": "hinge", "target": "1.5ms", "lambda": 1.0,
                             "label_smoothing": 0.0}
    assert LossConfig.from_dict(cfg.to_dict()) == cfg
    assert LossConfig.from_dict({"kind": "abs_target", "target": 3}).to_dict()["target"] == 3.0


def _total(loss, cost: float) -> float:
    return float(loss(LOGITS, LABELS, torch.tensor(cost)).total)


def test_target_loss_value_does_not_depend_on_the_unit():
    # the same latencies in µs and in ms, with the target in each unit
    us = LossConfig.from_dict({"kind": "target", "target": "1.2ms"}).build()
    ms = LossConfig.from_dict({"kind": "target", "target": 1.2}).build()
    for lat_us in (300.0, 1200.0, 5000.0):
        assert _total(us, lat_us) == pytest.approx(_total(ms, lat_us / 1e3))


def _grad(loss, cost: float) -> float:
    c = torch.tensor(cost, requires_grad=True)
    loss(LOGITS, LABELS, c).total.backward()
    return float(c.grad)


def test_target_loss_gradient_points_to_the_target_from_both_sides():
    t = TargetLoss(target=1000.0, lam=1.0)
    assert _grad(t, 1100.0) > 0 > _grad(t, 900.0)  # above T: cheaper; below T: dearer
    assert _grad(t, 1100.0) == pytest.approx(-_grad(t, 900.0))
    h = HingeLoss(target=1000.0, lam=1.0)
    assert _grad(h, 1100.0) > 0 and _grad(h, 900.0) == 0.0  # a budget: no push below T


@pytest.mark.parametrize("beta", [0.6, 4.0, 10.0, 16.0])
def test_fbnet_loss_is_well_scaled_and_the_same_search(beta):
    lo, hi = 150.0, 2500.0  # µs: a space's cheapest and dearest architecture
    scaled = LossConfig.from_dict({"kind": "fbnet", "alpha": 0.2, "beta": beta}).build((lo, hi))
    raw = FBNetLoss(0.2, beta)
    ce = float(torch.nn.functional.cross_entropy(LOGITS, LABELS))
    for lat in (lo, math.sqrt(lo * hi), hi):
        assert _total(scaled, lat) < 100 * ce  # (log LAT)^16 alone is ~1e14 here
    # a constant factor apart: same minimiser, and Adam steps alike
    ratios = [_total(raw, lat) / _total(scaled, lat) for lat in (lo, 700.0, hi)]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-6)  # float32 losses
    assert _total(scaled, math.sqrt(lo * hi)) == pytest.approx(0.2 * ce, rel=1e-6)


def test_fit_lands_in_the_band_with_the_likeliest_changes():
    rows = [[10.0, 20.0, 40.0], [10.0, 20.0, 40.0], [5.0, 6.0, 50.0]]
    # layer 0 and 1 prefer op 0; layer 2 is nearly indifferent between 0 and 2
    theta = [torch.tensor([3.0, 0.0, 0.0]), torch.tensor([3.0, 0.0, 0.0]),
             torch.tensor([0.1, -3.0, 0.0])]
    fit = fit_to_target(theta, rows, fixed=0.0, target=70.0, tol=0.03)
    assert fit.hit and fit.indices == [0, 0, 2] and fit.cost == 70.0 and fit.changes == 1
    # already in the band: nothing changes
    same = fit_to_target(theta, rows, 0.0, target=25.5, tol=0.03)
    assert same.changes == 0 and same.indices == [0, 0, 0]
    # above the dearest architecture: it moves as far as it can and says it missed
    far = fit_to_target(theta, rows, 0.0, target=1000.0, tol=0.03)
    assert not far.hit and far.cost == predicted_cost(rows, 0.0, far.indices) == 130.0


def test_fit_never_ends_further_from_the_target():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        rows = (torch.rand(5, 4, generator=g) * 100).tolist()
        theta = list(torch.randn(5, 4, generator=g))
        target = float(torch.rand(1, generator=g)) * 400 + 10
        start = [int(t.argmax()) for t in theta]
        fit = fit_to_target(theta, rows, 7.0, target, tol=0.05)
        before = abs(math.log(predicted_cost(rows, 7.0, start) / target))
        assert abs(math.log(fit.cost / target)) <= before + 1e-12
        reachable = any(abs(predicted_cost(rows, 7.0, c) / target - 1) <= 0.05
                        for c in itertools.product(range(4), repeat=5))
        assert fit.hit == reachable  # a small space is searched exhaustively when needed


def _trainer(tmp_path, loss=None, **sections):
    cfg = config_from_dict(run_config(loss, **sections), "test")
    return SearchTrainer(cfg, tmp_path / "run")


@pytest.mark.parametrize("mode", ["full", "single_path", "two_path"])
def test_sampled_modes_do_not_end_all_skip_under_a_target(tmp_path, mode):
    t = _trainer(tmp_path, loss={"kind": "target", "target": "0.6x", "lambda": 3.0},
                 search={"mode": mode, "epochs": 3, "warmup_epochs": 1, "theta_lr": 0.5})
    try:
        t.fit()
        arch = t.final_arch()
    finally:
        close_logger(t.log)
    lo, hi = t.model.cost_bounds()
    target = lo + 0.6 * (hi - lo)
    rows = [list(r.values()) for r in t.costs.rows]

    def in_band(c: float) -> bool:
        return abs(c / target - 1) <= 0.03

    reachable = any(in_band(t.costs.fixed + sum(r[i] for r, i in zip(rows, combo, strict=True)))
                    for combo in itertools.product(*(range(len(r)) for r in rows)))
    cost = t.costs.fixed + sum(r[o] for r, o in zip(t.costs.rows, arch.ops, strict=True))
    assert in_band(cost) == reachable
    all_skip = t.costs.fixed + sum(r["skip"] for r in t.costs.rows)
    assert all_skip < target * 0.97 and any(op != "skip" for op in arch.ops)
    saved = yaml.safe_load((tmp_path / "run" / "arch_hard.yaml").read_text())
    assert saved["meta"]["target"] == pytest.approx(target)


def test_a_target_outside_the_range_is_one_warning_line(tmp_path, caplog):
    t = _trainer(tmp_path, loss={"kind": "target", "target": 1e12})
    try:
        lines = [ln for ln in (tmp_path / "run" / "train.log").read_text().splitlines()
                 if "outside this space's range" in ln]
    finally:
        close_logger(t.log)
    assert len(lines) == 1 and "loss.target: 1000000000000.0" in lines[0]


def test_a_malformed_target_on_the_command_line_exits_2_and_writes_nothing(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(run_config({"kind": "target", "target": "soon"},
                                             run={"dir": str(tmp_path / "run")})))
    rc = main(["train", "--config", str(cfg)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "loss.target" in err[0]
    assert not (tmp_path / "run").exists()


def test_fair_warmup_trains_every_candidate_once_per_step(tmp_path):
    t = _trainer(tmp_path, search={"warmup_sampling": "fair", "epochs": 2, "warmup_epochs": 1})
    try:
        paths = t._warmup_paths()
        sizes = [len(th) for th in t.net.theta]
        assert len(paths) == max(sizes)
        for layer, n in enumerate(sizes):
            assert sorted(p[layer][0] for p in paths[:n]) == list(range(n))
        theta0 = [th.detach().clone() for th in t.net.theta]
        w0 = [p.detach().clone() for p in t.net.weight_parameters()]
        x, y = next(iter(t.data.w_loader))
        out = t.weight_step(x, y)
        assert set(out) == {"ce", "acc", "cost"} and math.isfinite(out["ce"])
        assert all(torch.equal(a, b) for a, b in zip(theta0, t.net.theta, strict=True))
        assert any(not torch.equal(a, b) for a, b in zip(w0, t.net.weight_parameters(),
                                                           strict=True))
        t.epoch = 1  # after the warm-up: the search mode's own sampling
        assert t._warmup_paths() is None
    finally:
        close_logger(t.log)


def test_sample_hard_fits_as_the_search_did(tmp_path):
    t = _trainer(tmp_path, loss={"kind": "target", "target": "0.3x", "lambda": 3.0},
                 search={"epochs": 2, "warmup_epochs": 1, "theta_lr": 0.5})
    try:
        t.fit()
    finally:
        close_logger(t.log)
    run = tmp_path / "run"
    assert main(["sample", str(run), "--hard", "--out", str(tmp_path / "s")]) == 0
    searched = yaml.safe_load((run / "arch_hard.yaml").read_text())
    sampled = yaml.safe_load((tmp_path / "s" / "arch_hard.yaml").read_text())
    assert searched["meta"]["fitted_layers"] > 0  # the plain argmax would differ
    assert sampled["ops"] == searched["ops"]
