import math

import pytest
import torch
import torch.nn.functional as F

from fbnas.errors import FbnasError
from fbnas.loss import (
    AbsTargetLoss,
    AdditiveLoss,
    CELoss,
    FBNetLoss,
    NormalizedLoss,
    build_loss,
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
