"""Width search (issue 40): stage widths as decisions, masked candidates, coupled costs."""

import itertools
import json

import pytest
import torch
import yaml
from conftest import digits_run_config, randomise_bn
from torch import nn

from fbnas._cli import main
from fbnas.arch import Architecture, arch_from_indices, arch_indices, build_child
from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.fit.onto_target import fit_with_widths
from fbnas.fit.search_run import SearchRun
from fbnas.fit.select import refit
from fbnas.latency import build_cost_table
from fbnas.latency.resolve import width_costs
from fbnas.latency.signature import space_signatures
from fbnas.latency.table import space_hash
from fbnas.latency.width_costs import WidthCosts
from fbnas.search.modes import MODES
from fbnas.search_space import SearchSpace
from fbnas.supernet import Supernet, supernet_child_state

# stem 8 -> [8, s1] -> [16 x2, s2, widths] -> [24, s2, widths] -> head
WSPACE = {
    "name": "wtiny", "input_size": 16, "in_channels": 3, "num_classes": 5,
    "stem": {"channels": 8, "stride": 2}, "width_divisor": 4,
    "candidates": ["ir_k3_e1", "ir_k5_e3", "ir_k3_e6", "skip"],
    "stages": [{"channels": 8, "repeats": 1, "stride": 1},
               {"channels": 16, "repeats": 2, "stride": 2, "widths": [0.5, 0.75, 1.0]},
               {"channels": 24, "repeats": 1, "stride": 2, "widths": [0.5, 1.0]}],
    "head": {"channels": 32},
}


def _space(**over) -> SearchSpace:
    return SearchSpace.from_dict({**WSPACE, **over})


def test_width_choices_are_decisions_after_the_ops():
    s = _space()
    assert s.width_stages() == [1, 2]
    assert s.width_choices(1) == (8, 12, 16) and s.width_choices(2) == (12, 24)
    assert s.decision_candidates()[-2:] == [("c8", "c12", "c16"), ("c12", "c24")]
    assert s.size() == 4 ** 4 * 3 * 2
    assert SearchSpace.from_dict(s.to_dict()) == s
    a = arch_from_indices(s, [0, 1, 2, 3, 1, 0], "a")
    assert [st.channels for st in a.macro.stages] == [8, 12, 12]
    assert arch_indices(s, a) == [0, 1, 2, 3, 1, 0]
    # written and read back as a plain architecture whose macro has those widths
    b = Architecture.from_dict(a.to_dict())
    assert b == a and b.hash() == a.hash()
    b.check_fits(s)
    # an op-only architecture's hash is what it was (widths live in the macro)
    assert arch_from_indices(s, [0, 0, 0, 0, 2, 1]).macro == s.macro


def test_a_width_outside_the_space_is_a_one_line_error():
    s = _space()
    a = arch_from_indices(s, [0, 0, 0, 0, 0, 0], "a")
    d = a.to_dict()
    d["macro"]["stages"][1]["channels"] = 10
    bad = Architecture.from_dict(d, "a.yaml")
    with pytest.raises(FbnasError, match=r"a.yaml: macro.stages\[1\].channels is 10 but search "
                                         r"space 'wtiny' has width choices 8, 12, 16"):
        bad.check_fits(s, "a.yaml")


@pytest.mark.parametrize("over, match", [
    ({"stages": [{"channels": 8, "repeats": 1, "widths": [0.5, 0.9]}]}, "lacks 1.0"),
    ({"stages": [{"channels": 8, "repeats": 1, "widths": [0.5, 1.2]}]}, r"widths\[1\]"),
    ({"stages": [{"channels": 8, "repeats": 1, "widths": [0.5, 0.5, 1]}]}, "listed twice"),
    ({"width_divisor": 8}, "use a smaller space.width_divisor"),
    ({"candidates": ["ir_k3_e1", "ir_k3_e1_g2"]}, "op 'ir_k3_e1_g2' cannot have its width"),
    ({"stages": [{"channels": 8, "repeats": 1, "stride": 1, "widths": [0.5, 1.0]}]},
     "residual shortcut would come and go"),
])
def test_widths_that_cannot_be_searched_are_refused(over, match):
    with pytest.raises(FbnasError, match=match):
        SearchSpace.from_dict({**WSPACE, **over}, "space")


@pytest.mark.parametrize("weights", ["shared", "separate"])
@pytest.mark.parametrize("indices", [[1, 2, 2, 0, 0, 0], [2, 1, 3, 1, 1, 1], [3, 0, 2, 2, 2, 0]])
def test_a_width_path_equals_the_child_of_those_widths(weights, indices):
    """One-hot width weights compute exactly the child network of those widths, with the
    child's weights the leading channels of the supernet's (eval and train mode)."""
    s = _space()
    torch.manual_seed(0)
    net = Supernet(s, weights=weights)
    randomise_bn(net)
    arch = arch_from_indices(s, indices, "t")
    child = build_child(arch)
    cfg = config_from_dict(digits_run_config(space=WSPACE, search={"weights": weights}), "t")
    child.load_state_dict(supernet_child_state(
        {"config": cfg.resolved(), "model": net.state_dict()}, arch))
    x = torch.randn(4, 3, 16, 16)
    m, active = net.path(indices)
    for train in (False, True):
        net.train(train)
        child.train(train)
        with torch.no_grad():
            torch.testing.assert_close(net(x, m=m, active=active)[0], child(x), rtol=0,
                                       atol=1e-5)


def _costs(s: SearchSpace) -> WidthCosts:
    return width_costs(s, build_cost_table(s, "flops"))


def test_the_expected_cost_is_exact_over_both_neighbours_widths():
    s = _space()
    wc = _costs(s)
    n = len(s.layers())
    g = torch.Generator().manual_seed(0)
    probs = [torch.softmax(torch.randn(len(c), generator=g), -1)
             for c in s.decision_candidates()]
    # brute force: every architecture, its probability times its cost
    want = 0.0
    for idx in itertools.product(*(range(len(c)) for c in s.decision_candidates())):
        p = 1.0
        for d, i in enumerate(idx):
            p *= float(probs[d][i])
        want += p * wc.of(list(idx))
    got = float(wc.expected(probs[:n], probs[n:]))
    assert got == pytest.approx(want, rel=1e-5)
    # an architecture's cost is its child's counted FLOPs
    table = build_cost_table(s, "flops")
    for idx in ([0, 1, 2, 3, 0, 1], [2, 2, 2, 2, 2, 1]):
        arch = arch_from_indices(s, idx)
        assert wc.of(idx) == pytest.approx(table.predict(arch))
    lo, hi = wc.bounds()
    costs = [wc.of(list(i)) for i in itertools.product(*(range(len(c))
                                                         for c in s.decision_candidates()))]
    assert (lo, hi) == (pytest.approx(min(costs)), pytest.approx(max(costs)))
    assert wc.of(wc.dearest()) == pytest.approx(max(costs))


def test_a_calibrated_table_predicts_one_figure_whichever_way_it_is_asked():
    """The calibration (measured ≈ a·predicted + b) is applied in one place: a network's cost
    from the table, from the width cost model and from the op cost model agree."""
    s = _space()
    table = build_cost_table(s, "flops")
    table.calibration = {"a": 0.8, "b": 123.0}
    wc = width_costs(s, table)
    for idx in ([0, 1, 2, 3, 0, 1], [2, 2, 2, 2, 2, 1], [1, 0, 3, 2, 1, 0]):
        arch = arch_from_indices(s, idx)
        raw = table.predict(arch)
        assert table.predict(arch, "calibrated", s) == pytest.approx(0.8 * raw + 123.0)
        assert wc.of(idx) == pytest.approx(0.8 * raw + 123.0)


def test_a_calibrated_table_predicts_one_figure_for_an_op_search_too(tiny_space):
    table = build_cost_table(tiny_space, "flops")
    table.calibration = {"a": 0.8, "b": 123.0}
    rows, fixed = table.costs_for(tiny_space, "calibrated")
    for idx in ([0, 1, 2], [2, 0, 1]):
        arch = arch_from_indices(tiny_space, idx)
        by_rows = fixed + sum(r[o] for r, o in zip(rows, arch.ops, strict=True))
        assert by_rows == pytest.approx(table.predict(arch, "calibrated", tiny_space))
        assert by_rows == pytest.approx(0.8 * table.predict(arch) + 123.0)


def test_the_table_holds_every_signature_the_widths_produce():
    s = _space()
    sigs = {x.key() for x in space_signatures(s)}
    # layer 1 (16-channel stage, first layer): 8 in, each of 8/12/16 out; layer 3: 8/12/16 in
    assert "ir_k3_e6 c8-12 s2 8x8" in sigs and "ir_k3_e6 c12-24 s2 4x4" in sigs
    assert "ir_k3_e6 c12-12 s1 4x4" in sigs and "ir_k3_e6 c12-16 s1 4x4" not in sigs
    assert "head avg c12-32 2x2 cls5" in sigs and "head avg c24-32 2x2 cls5" in sigs


@pytest.mark.parametrize("mode", sorted(MODES.choices()))
def test_every_mode_samples_and_steps_the_widths(mode):
    s = _space()
    torch.manual_seed(0)
    net = Supernet(s, mode=mode, weights="shared", width_costs=_costs(s))
    p = net.sample_path(1.0)
    logits, cost = net(torch.randn(4, 3, 16, 16), m=p.m, active=p.active, cost_m=p.cost_m)
    (logits.logsumexp(-1).mean() + cost / 1e6).backward()
    # the cost reaches every width decision's θ in every mode
    for t in net.theta[len(s.layers()):]:
        assert t.grad is not None and t.grad.abs().sum() > 0


def test_the_fit_moves_widths_and_ops_into_the_band_whenever_one_is_there():
    s = _space()
    wc = _costs(s)
    combos = list(itertools.product(*(range(len(c)) for c in s.decision_candidates())))
    costs = {c: wc.of(list(c)) for c in combos}
    lo, hi = wc.bounds()
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        theta = [torch.randn(len(c), generator=g) for c in s.decision_candidates()]
        target = lo + float(torch.rand(1, generator=g)) * (hi - lo)
        fit, widths = fit_with_widths(theta, wc, target, 0.03)
        idx = (*fit.indices, *widths)
        assert fit.cost == pytest.approx(costs[idx])
        reachable = any(abs(c / target - 1) <= 0.03 for c in costs.values())
        assert fit.hit == reachable


@pytest.mark.slow  # moved from the fast tier: five commands end to end, 2 s
def test_a_width_search_runs_through_sample_retrain_and_plot(tmp_path):
    d = digits_run_config(
        space={**WSPACE, "in_channels": 1, "input_size": 8, "num_classes": 10},
        loss={"kind": "target", "target": "0.5x", "lambda": 1.0},
        search={"mode": "reinforce", "weights": "shared", "epochs": 2, "warmup_epochs": 1})
    for k in ("alpha", "beta"):
        d["loss"].pop(k, None)
    d["run"]["dir"] = str(tmp_path / "run")
    cfg_path = tmp_path / "w.yaml"
    cfg_path.write_text(yaml.safe_dump(d))
    assert main(["train", "--config", str(cfg_path)]) == 0
    space = config_from_dict(d, "w").space
    arch = Architecture.load(tmp_path / "run" / "arch_hard.yaml")
    arch.check_fits(space)
    assert arch.meta["final_pick"]["candidates"] >= 1
    # a re-fit starts from the recorded final pick, as the search's fit did
    again = refit(SearchRun.open(tmp_path / "run"), "off", log=lambda m: None)
    assert again.hash() == arch.hash() and again.meta["final_pick"] == arch.meta["final_pick"]
    assert main(["sample", str(tmp_path / "run"), "--soft", "-n", "3"]) == 0
    for p in (tmp_path / "run" / "samples").glob("arch_soft_*.yaml"):
        Architecture.load(p).check_fits(space)
    assert main(["retrain", "--arch", str(tmp_path / "run" / "arch_hard.yaml"), "--config",
                 str(cfg_path), "--init-from-supernet", str(tmp_path / "run"),
                 "--set", "retrain.epochs=1", "--set", "retrain.warmup_epochs=0",
                 "--set", "retrain.measure_latency=false",
                 "--set", f"run.dir={tmp_path / 'child'}"]) == 0
    res = json.loads(next((tmp_path / "child").glob("retrain-*/results.json")).read_text())
    assert res["arch"]["hash"] == arch.hash() and res["init_from"]
    pytest.importorskip("matplotlib")
    assert main(["plot", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "plots" / "widths_final.png").is_file()


def test_the_expected_cost_stays_float32_under_autocast():
    s = _space()
    wc = _costs(s)
    probs = [torch.softmax(torch.randn(len(c)), -1) for c in s.decision_candidates()]
    n = len(s.layers())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = wc.expected(probs[:n], probs[n:])
    assert got.dtype == torch.float32
    assert float(got) == pytest.approx(float(wc.expected(probs[:n], probs[n:])), rel=1e-6)


def test_widths_that_width_mult_rounds_together_are_refused_and_a_width_space_hashes_apart():
    with pytest.raises(FbnasError, match="not distinct"):
        SearchSpace.from_dict({**WSPACE, "width_divisor": 4, "width_mult": 0.5}, "space")
    twin = {**WSPACE, "stages": [{k: v for k, v in st.items() if k != "widths"}
                                 for st in WSPACE["stages"]]}
    twin.pop("width_divisor")
    assert space_hash(_space()) != space_hash(SearchSpace.from_dict(twin))


@pytest.mark.parametrize("train", [True, False])
def test_a_mask_folded_into_batchnorm_computes_what_a_multiplied_one_does(train):
    """Without a gradient the masks scale the BatchNorms' affine parameters (no activation-
    sized multiply); with one they multiply the activations: the same values, soft or hard,
    and the same running statistics."""
    s = _space()
    torch.manual_seed(0)
    net = Supernet(s, weights="shared")
    randomise_bn(net)
    net.train(train)
    x = torch.randn(4, 3, 16, 16)
    soft = [torch.softmax(torch.randn(len(c)), -1) for c in s.decision_candidates()]
    stats = []
    outs = []
    for grad in (False, True):
        copy = {k: v.clone() for k, v in net.state_dict().items()}
        m = [t.clone().requires_grad_(grad) for t in soft]
        outs.append(net(x, m=m)[0].detach())
        stats.append({k: v.clone() for k, v in net.state_dict().items() if "running" in k})
        net.load_state_dict(copy)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    for k in stats[0]:
        torch.testing.assert_close(stats[0][k], stats[1][k])


@pytest.mark.parametrize("relu", [False, True])
def test_a_mask_that_needs_a_gradient_gets_the_multiplied_masks_gradient(relu):
    """A θ step's masks need a gradient. Where no ReLU follows (the projection) the mask is
    folded into the BatchNorm all the same, with the gradient of mask·BN(conv(x)) for every
    channel, masked-out ones included; ahead of a ReLU it multiplies the activation, so a
    masked-out channel's gradient is what adding it would do (folded, ReLU'(0) would zero
    it)."""
    from fbnas.blocks.common import conv_bn
    from fbnas.blocks.masked import choice_masks, mix
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Conv2d(3, 6, 1, bias=False), nn.BatchNorm2d(6),
                        *([nn.ReLU()] if relu else [])).train()
    with torch.no_grad():
        seq[1].weight.uniform_(0.5, 1.5)
        seq[1].bias.uniform_(0.1, 0.5)
    x, g = torch.randn(4, 3, 5, 5), torch.randn(4, 6, 5, 5)
    masks = choice_masks([2, 4, 6], 6)
    grads, saved = [], []
    for fold in (True, False):
        soft = torch.tensor([0.2, 0.5, 0.3], requires_grad=True)
        w = torch.nn.functional.one_hot(torch.tensor(0), 3).float() + soft - soft.detach()
        seq.zero_grad()
        kept: dict[int, int] = {}  # bytes saved for backward, by storage
        def keep(t, kept=kept):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            y = (conv_bn(seq, x, mix(w, masks)) if fold
                 else seq(x) * mix(w, masks).view(1, -1, 1, 1))
        saved.append(sum(kept.values()))
        (y * g).sum().backward()
        grads.append((y.detach(), soft.grad.clone(), seq[0].weight.grad.clone(),
                      seq[1].weight.grad.clone()))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert grads[0][1][1:].abs().min() > 0  # the masked-out widths hear the CE
    # folded, no masked copy of the activation is kept for backward
    assert (saved[0] < saved[1] - x.numel() * 4) if not relu else saved[0] == saved[1]


@pytest.mark.parametrize("shared", [False, True])
def test_a_hidden_mask_that_needs_a_gradient_is_folded_into_the_convs_that_read_it(shared):
    """In a relaxation's θ step the expanded channels' mask (by the input's width) is folded
    into the weights of the depthwise and projection convs, not multiplied into the
    activations: the values and every gradient are those of mask·ReLU(BN(·)) after each
    normalisation, and less is kept for backward."""
    from fbnas.blocks.irf import IRFBlock, parse_irf
    from fbnas.blocks.masked import choice_masks, masked_branch, mix
    from fbnas.blocks.shared import build_shared
    torch.manual_seed(0)
    spec = parse_irf("ir_k3_e3")
    if shared:  # a slice of a superkernel the block does not own
        store, sliced = build_shared(["ir_k3_e3", "ir_k3_e1"], 8, 8, 1)
        block = sliced[0].train()
        params = [*block.parameters(), *store.parameters()]
    else:
        block = IRFBlock(8, 8, 1, spec).train()
        params = list(block.parameters())
    x, g = torch.randn(4, 8, 6, 6), torch.randn(4, 8, 6, 6)
    hidden, outs = choice_masks([12, 18, 24], 24), choice_masks([4, 6, 8], 8)

    def reference(h_mask, o_mask):  # the activations multiplied, as before the fold
        h = block.pw(x) * h_mask.view(1, -1, 1, 1)
        for stage in block.dw:
            h = stage(h) * h_mask.view(1, -1, 1, 1)
        return block.pwl(h) * o_mask.view(1, -1, 1, 1)

    got = []
    for fn in (masked_branch, None):
        soft = torch.tensor([0.2, 0.3, 0.5], requires_grad=True)
        for p in params:
            p.grad = None
        kept: dict[int, int] = {}
        def keep(t, kept=kept):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            h_mask, o_mask = mix(soft, hidden), mix(soft, outs)
            y = (fn(block, x, h_mask, o_mask) if fn else reference(h_mask, o_mask))
        (y * g).sum().backward()
        got.append((sum(kept.values()), y.detach(), soft.grad.clone(),
                    *[p.grad.clone() for p in params]))
    assert len(got[0]) == len(got[1]) == 3 + 9  # 3 convs' weights, 3 BatchNorms' γ and β
    for a, b in zip(got[0][1:], got[1][1:], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert got[0][0] < got[1][0] - 2 * 4 * 24 * 6 * 6 * 4  # two expanded activations fewer


def test_a_near_target_bundle_of_a_width_search_carries_the_fits_widths(tmp_path, monkeypatch,
                                                                         capsys):
    """`sample --near-target` on a width-searched run: its networks at the widths the table's
    fit chooses for the target; `--pick` returns the most probable one the device measured
    inside the band, widths and all (the bundle's writing and the device's results faked)."""
    import fbnas.fit.sample as sample
    from fbnas.latency import LatencyTable

    d = digits_run_config(
        space={**WSPACE, "in_channels": 1, "input_size": 8, "num_classes": 10},
        latency={"cost": "latency", "device": "fake", "cache_dir": str(tmp_path / "cache")},
        loss={"kind": "target", "target": "0.5x", "lambda": 1.0},
        search={"mode": "reinforce", "weights": "shared", "epochs": 2, "warmup_epochs": 1,
                "fit_measure": "off"})
    for k in ("alpha", "beta"):
        d["loss"].pop(k, None)
    run = tmp_path / "run"
    d["run"]["dir"] = str(run)
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(d))
    assert main(["train", "--config", str(tmp_path / "w.yaml")]) == 0
    table = LatencyTable.load(run / "cost_table.json")
    table.meta.update(imported_from="phone/results.json", backend="executorch")
    table.save(run / "cost_table.json")
    space = config_from_dict(d, "w").space
    wrote = {}
    monkeypatch.setattr(sample, "write_bundle", lambda *a, networks, purpose, **k: wrote.update(
        networks=list(networks), purpose=purpose) or {"bundle_id": "b" * 16})
    assert main(["sample", str(run), "--near-target", "3", "--bundle",
                 str(tmp_path / "nb")]) == 0
    nets = wrote["networks"]
    n = len(space.layer_candidates())
    widths = {tuple(arch_indices(space, a)[n:]) for a in nets}
    from fbnas.fit.select import Selector
    from fbnas.latency.resolve import run_costs
    cfg = config_from_dict(d, "w")
    theta = [torch.tensor(t) for t in json.loads((run / "theta.json").read_text())["theta"]]
    fitted = Selector(cfg, theta, run_costs(cfg.space, table),
                      wrote["purpose"]["near_target"]["target"]).table_fit().widths
    assert len(nets) == 3 and widths == {tuple(fitted)}  # one choice of widths: the fit's
    for a in nets:
        a.check_fits(space)
    target = wrote["purpose"]["near_target"]["target"]
    measured = {f"network {a.name}": (a, target * (1 + m), 0.01)
                for a, m in zip(nets, (0.08, -0.01, 0.02), strict=True)}
    monkeypatch.setattr(sample, "read_results", lambda p: ({"device": "phone"},
                                                           {"bundle_id": "b" * 16}))
    monkeypatch.setattr(sample, "network_latencies_us", lambda res, man: measured)
    capsys.readouterr()
    assert main(["sample", str(run), "--pick", str(tmp_path / "results.json"), "--out",
                 str(tmp_path / "p")]) == 0
    picked = Architecture.load(tmp_path / "p" / "arch_picked.yaml")
    inside = [a for a, m in zip(nets, (0.08, -0.01, 0.02), strict=True) if abs(m) <= 0.03]
    from fbnas.arch import arch_log_prob
    best = max(inside, key=lambda a: arch_log_prob(space, theta, a))
    assert picked.hash() == best.hash() and picked.meta["measured"] == pytest.approx(
        target * (1 + (-0.01 if best is nets[1] else 0.02)), abs=1e-3)
