import math

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import digits_run_config

from fbnas._cli import main
from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.loss import (
    AbsTargetLoss,
    AdditiveLoss,
    CELoss,
    FBNetLoss,
    HingeLoss,
    LossConfig,
    NormalizedLoss,
    TargetLoss,
    build_loss,
    parse_target,
    resolve_target,
)

LOGITS = torch.tensor([[2.0, 0.5, -1.0], [0.1, 0.2, 3.0]])
TARGETS = torch.tensor([0, 1])
CE = float(F.cross_entropy(LOGITS, TARGETS))


def test_fbnet_loss_is_ce_times_alpha_times_log_lat_to_the_beta():
    lat = torch.tensor(5000.0)
    out = FBNetLoss(alpha=0.2, beta=0.6)(LOGITS, TARGETS, lat)
    assert float(out.total) == pytest.approx(CE * 0.2 * math.log(5000.0) ** 0.6)
    assert float(out.ce) == pytest.approx(CE)
    # β is an exponent, not a factor: the reference's α·β·CE·log LAT differs.
    assert float(out.total) != pytest.approx(0.2 * 0.6 * CE * math.log(5000.0))


def test_fbnet_loss_grows_with_latency_and_beta():
    loss = FBNetLoss(0.2, 0.6)
    a = float(loss(LOGITS, TARGETS, torch.tensor(1000.0)).total)
    b = float(loss(LOGITS, TARGETS, torch.tensor(4000.0)).total)
    assert b > a
    c = float(FBNetLoss(0.2, 1.2)(LOGITS, TARGETS, torch.tensor(4000.0)).total)
    assert c > b


def test_fbnet_loss_refuses_lat_below_e():
    with pytest.raises(FbnasError, match="LAT > e"):
        FBNetLoss()(LOGITS, TARGETS, torch.tensor(2.0))
    with pytest.raises(FbnasError, match="cheapest architecture"):
        FBNetLoss().check_range(1.5, 100.0)
    FBNetLoss().check_range(10.0, 100.0)
    # off the host the value is not read (it would stall a GPU step): check_range guards it
    meta = torch.tensor(2.0, device="meta")
    assert FBNetLoss().cost_term(meta).device.type == "meta"
    assert NormalizedLoss(target=2000.0).cost_term(meta).device.type == "meta"
    with pytest.raises(FbnasError, match="LAT > 1"):
        NormalizedLoss(target=2000.0).cost_term(torch.tensor(0.5))


def test_normalized_loss():
    out = NormalizedLoss(target=2000.0, beta=0.5)(LOGITS, TARGETS, torch.tensor(3000.0))
    assert float(out.total) == pytest.approx(CE * (math.log(3000) / math.log(2000)) ** 0.5)


def test_additive_loss():
    out = AdditiveLoss(target=2000.0, lam=0.3)(LOGITS, TARGETS, torch.tensor(2500.0))
    assert float(out.total) == pytest.approx(CE + 0.3 * 500 / 2000)


def test_abs_target_loss_penalises_both_sides():
    loss = AbsTargetLoss(target=2000.0, lam=0.5)
    lo = float(loss(LOGITS, TARGETS, torch.tensor(1500.0)).total)
    hi = float(loss(LOGITS, TARGETS, torch.tensor(2500.0)).total)
    assert lo == pytest.approx(CE + 0.5 * 0.25) and hi == pytest.approx(lo)


def test_ce_loss_ignores_cost():
    assert float(CELoss()(LOGITS, TARGETS, torch.tensor(9e9)).total) == pytest.approx(CE)


def test_gradient_flows_to_cost():
    lat = torch.tensor(3000.0, requires_grad=True)
    FBNetLoss()(LOGITS, TARGETS, lat).total.backward()
    assert float(lat.grad) > 0


def test_build_loss_from_config():
    assert isinstance(build_loss({"kind": "additive", "target": 100, "lambda": 0.2}), AdditiveLoss)
    assert isinstance(build_loss(None), FBNetLoss)
    with pytest.raises(FbnasError, match="loss.alpha: must be > 0"):
        build_loss({"alpha": -1})
    with pytest.raises(FbnasError, match="loss.beta"):
        build_loss({"beta": 0})
    with pytest.raises(FbnasError, match="loss.target.*missing|missing key 'target'"):
        build_loss({"kind": "abs_target"})
    with pytest.raises(FbnasError, match="unknown key 'gamma'"):
        build_loss({"gamma": 1})
    with pytest.raises(FbnasError, match="loss.kind: must be one of"):
        build_loss({"kind": "magic"})


# ---- cost targets (loss.target): parsing, the target losses, the FBNet scale --------------
def run_config(loss: dict | None = None, **sections: dict) -> dict:
    """The tiny digits run config with its loss section replaced by `loss`."""
    d = digits_run_config(**sections)
    if loss is not None:
        d["loss"] = dict(loss)
    return d


T_LOGITS = torch.tensor([[2.0, 0.5, -1.0], [0.1, 1.5, 0.3]])
T_LABELS = torch.tensor([0, 1])


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
    return float(loss(T_LOGITS, T_LABELS, torch.tensor(cost)).total)


def test_target_loss_value_does_not_depend_on_the_unit():
    # the same latencies in µs and in ms, with the target in each unit
    us = LossConfig.from_dict({"kind": "target", "target": "1.2ms"}).build()
    ms = LossConfig.from_dict({"kind": "target", "target": 1.2}).build()
    for lat_us in (300.0, 1200.0, 5000.0):
        assert _total(us, lat_us) == pytest.approx(_total(ms, lat_us / 1e3))


def _grad(loss, cost: float) -> float:
    c = torch.tensor(cost, requires_grad=True)
    loss(T_LOGITS, T_LABELS, c).total.backward()
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
    ce = float(torch.nn.functional.cross_entropy(T_LOGITS, T_LABELS))
    for lat in (lo, math.sqrt(lo * hi), hi):
        assert _total(scaled, lat) < 100 * ce  # (log LAT)^16 alone is ~1e14 here
    # a constant factor apart: same minimiser, and Adam steps alike
    ratios = [_total(raw, lat) / _total(scaled, lat) for lat in (lo, 700.0, hi)]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-6)  # float32 losses
    assert _total(scaled, math.sqrt(lo * hi)) == pytest.approx(0.2 * ce, rel=1e-6)


def test_a_malformed_target_on_the_command_line_exits_2_and_writes_nothing(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(run_config({"kind": "target", "target": "soon"},
                                             run={"dir": str(tmp_path / "run")})))
    rc = main(["train", "--config", str(cfg)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "loss.target" in err[0]
    assert not (tmp_path / "run").exists()
