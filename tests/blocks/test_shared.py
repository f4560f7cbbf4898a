"""search.weights: shared — a layer's plain IRF candidates are slices of one superkernel."""

import copy

import pytest
import torch
from conftest import TINY_SPACE, count_candidate_calls, digits_run_config, randomise_bn

from fbnas.arch import arch_from_indices, build_child
from fbnas.blocks.shared import SlicedIRF, UsedSlices, child_state, sharable
from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.retrain import ChildTrainer
from fbnas.search.modes import theta_modes
from fbnas.search_space import SearchSpace
from fbnas.supernet import MixedOp, Supernet, supernet_child_state
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger

SPACE = {**TINY_SPACE, "in_channels": 3,
         "candidates": ["ir_k3_e1", "ir_k5_e3", "ir_k3_e6", "ir_k5_e6_se", "ir_k3_e1_g2", "skip"]}


def test_which_ops_share():
    for op in ("ir_k5_e6", "ir_k3_e1", "ir_k3_e1_g2", "ir_k5_e1_g2"):
        assert sharable(op) is not None, op
    for op in ("ir_k5_e6_se", "ir_k33_e3", "skip", "basic_block"):
        assert sharable(op) is None, op
    op = MixedOp(SPACE["candidates"], 8, 8, 1, "shared")
    kinds = [type(c) for c in op.candidates]
    assert [k is SlicedIRF for k in kinds] == [True, True, True, False, True, False]
    # a grouped candidate whose channels the groups do not divide: the block's own error
    with pytest.raises(FbnasError, match="c_in=6 is not divisible by groups 4"):
        MixedOp(["ir_k3_e1", "ir_k3_e6", "ir_k3_e1_g4"], 6, 6, 1, "shared")
    # the superkernel is the largest kernel and expansion: k5, e6
    assert tuple(op.shared.dw.shape) == (48, 1, 5, 5) and tuple(op.shared.pw.shape) == (48, 8, 1, 1)
    with pytest.raises(FbnasError, match="search.weights"):
        MixedOp(SPACE["candidates"], 8, 8, 1, "tied")


def test_one_superkernel_per_layer_fewer_parameters():
    space = SearchSpace.from_dict({**TINY_SPACE, "candidates": [
        "ir_k3_e1", "ir_k5_e3", "ir_k3_e6", "ir_k5_e6", "skip"]})
    sep, sh = Supernet(space), Supernet(space, weights="shared")
    n = [sum(p.numel() for p in net.weight_parameters()) for net in (sep, sh)]
    assert n[1] < 0.6 * n[0]
    # every superkernel parameter is one parameter of the supernet (not one per candidate)
    ids = [id(p) for p in sh.weight_parameters()]
    assert len(ids) == len(set(ids))
    assert all(id(op.shared.dw) in ids for op in sh.mixed)


def test_training_one_path_trains_the_others():
    space = SearchSpace.from_dict(SPACE)
    net = Supernet(space, weights="shared")
    before = [c.clone() for c in (net.mixed[0].shared.pw,)]
    m, active = net.path([1] * len(net.theta))  # ir_k5_e3 everywhere
    net(torch.randn(4, 3, 16, 16), m=m, active=active)[0].sum().backward()
    g = net.mixed[0].shared.pw.grad
    # e3's rows of the expansion got a gradient, e6's extra rows did not
    assert g[:24].abs().sum() > 0 and g[24:].abs().sum() == 0
    assert torch.equal(before[0], net.mixed[0].shared.pw)


@pytest.mark.parametrize("indices", [[0, 1, 2], [1, 0, 5], [2, 3, 4], [4, 4, 1]])
def test_a_path_equals_the_child_built_from_its_sliced_weights(indices):
    space = SearchSpace.from_dict(SPACE)
    torch.manual_seed(0)
    net = Supernet(space, weights="shared")
    randomise_bn(net)
    net.eval()
    arch = arch_from_indices(space, indices, "t")
    child = build_child(arch)
    cfg = config_from_dict(digits_run_config(space=SPACE, search={"weights": "shared"}), "t")
    child.load_state_dict(supernet_child_state(
        {"config": cfg.resolved(), "model": net.state_dict()}, arch))
    child.eval()
    x = torch.randn(3, 3, 16, 16)
    m, active = net.path(indices)
    with torch.no_grad():
        torch.testing.assert_close(net(x, m=m, active=active)[0], child(x), rtol=0, atol=1e-5)


def test_child_state_refuses_an_op_that_does_not_share():
    with pytest.raises(FbnasError, match="ir_k3_e6_se"):
        child_state({}, "ir_k3_e6_se", 8)


def test_a_grouped_candidate_reads_and_trains_the_diagonal_blocks_of_the_superkernel():
    op = MixedOp(["ir_k3_e6", "ir_k3_e1_g2", "skip"], 8, 16, 2, "shared")
    m = torch.tensor([0.0, 1.0, 0.0])
    op(torch.randn(2, 8, 6, 6), m, active=[1]).sum().backward()
    pw, pwl = op.shared.pw.grad[:, :, 0, 0], op.shared.pwl.grad[:, :, 0, 0]
    # e1 g2: expand rows 0-3 read inputs 0-3, rows 4-7 inputs 4-7; nothing else
    assert pw[:4, :4].abs().sum() > 0 and pw[4:8, 4:].abs().sum() > 0
    assert pw[:4, 4:].abs().sum() == 0 and pw[4:8, :4].abs().sum() == 0 and pw[8:].abs().sum() == 0
    # project: outputs 0-7 from mid 0-3, outputs 8-15 from mid 4-7
    assert pwl[:8, :4].abs().sum() > 0 and pwl[8:, 4:8].abs().sum() > 0
    assert pwl[:8, 4:].abs().sum() == 0 and pwl[8:, :4].abs().sum() == 0
    masks = dict(zip(("pw", "dw", "pwl"), (mk for _, mk in op.shared.used_masks()),
                     strict=True))
    assert torch.equal(masks["pw"][:, :, 0, 0], op.shared.pw.grad[:, :, 0, 0] != 0)


def _tiny_search(tmp_path, **search):
    d = digits_run_config(data={"limit": 300}, search={"weights": "shared", **search})
    d["run"]["dir"] = str(tmp_path / "run")
    cfg = config_from_dict(copy.deepcopy(d), "tiny.yaml")
    t = SearchTrainer(cfg, tmp_path / "run")
    try:
        t.train()
    finally:
        close_logger(t.log)
    return t


@pytest.mark.parametrize("mode", theta_modes())
def test_a_shared_weight_search_runs_in_every_mode_deterministically(tmp_path, mode):
    a = _tiny_search(tmp_path / "a", mode=mode)
    b = _tiny_search(tmp_path / "b", mode=mode)
    for x, y in zip(a.model.theta, b.model.theta, strict=True):
        assert torch.equal(x, y)
    assert a.history[-1]["w_ce"] == b.history[-1]["w_ce"]


def test_weight_sampling_trains_weights_on_single_paths_and_theta_on_the_mode(tmp_path):
    t = _tiny_search(tmp_path, mode="full", weight_sampling="single_path")
    # after the warm-up a weight step computes one candidate per layer, a θ step all of them
    calls = count_candidate_calls(t.model)
    x, y = next(iter(t.data.w_loader))
    t.weight_step(x, y)
    assert all(sum(c) <= 1 for c in calls)
    for c in calls:
        c[:] = [0] * len(c)
    t.theta_step(x, y)
    assert all(all(n == 1 for n in c) for c in calls)


def test_init_from_a_shared_weight_supernet_gets_the_sliced_weights(tmp_path):
    s = _tiny_search(tmp_path, mode="full")
    cfg = s.cfg
    arch = arch_from_indices(cfg.space, [1, 0], "t")  # ir_k5_e3, then ir_k3_e1
    t = ChildTrainer(cfg, arch, tmp_path / "r", init_from=tmp_path / "run")
    close_logger(t.log)
    # compared on the CPU: the trainers put their models on `device: auto` (CUDA where there is one)
    child = {k: v.cpu() for k, v in t.model.state_dict().items()}
    sh0, sh1 = s.model.mixed[0].shared, s.model.mixed[1].shared
    # layer 0: e3 of 8 channels = 24 expanded rows; its k5 is the whole superkernel window
    assert torch.equal(child["blocks.0.pw.0.weight"], sh0.pw.cpu()[:24])
    assert torch.equal(child["blocks.0.dw.0.0.weight"], sh0.dw.cpu()[:24])
    assert torch.equal(child["blocks.0.pwl.0.weight"], sh0.pwl.cpu()[:, :24])
    # layer 1: k3 e1 is the centre 3x3 of the first 8 channels
    assert torch.equal(child["blocks.1.dw.0.0.weight"], sh1.dw.cpu()[:8, :, 1:4, 1:4])
    # and the candidate's own BatchNorm
    sd = {k: v.cpu() for k, v in s.model.state_dict().items()}
    assert torch.equal(child["blocks.1.pw.1.running_mean"],
                       sd["mixed.1.candidates.0.pw.1.running_mean"])


def _steps(update: str, paths: list[int]) -> tuple[MixedOp, list[torch.Tensor], list]:
    """SGD steps (momentum, weight decay) on a shared layer, one candidate per step; returns
    the layer, its superkernel before the last step, and the masks that step read."""
    torch.manual_seed(0)
    op = MixedOp(["ir_k3_e1", "ir_k5_e6", "skip"], 8, 8, 1, "shared")
    opt = torch.optim.SGD(op.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    sparse = UsedSlices([op.shared]) if update == "used" else None
    x = torch.randn(4, 8, 6, 6)
    before: list[torch.Tensor] = []
    for i in paths:
        before = [p.detach().clone() for p in (op.shared.pw, op.shared.dw, op.shared.pwl)]
        opt.zero_grad(set_to_none=True)
        if sparse is not None:
            sparse.begin()
        m = torch.zeros(3)
        m[i] = 1.0
        op(x, m, active=[i]).square().mean().backward()
        read = [mask for _, mask in op.shared.used_masks()]
        with sparse.step(opt) if sparse is not None else torch.no_grad():
            opt.step()
    return op, before, read


def test_a_weight_step_moves_only_the_superkernel_entries_its_paths_read():
    # e6 first (momentum everywhere), then e1 k3: its step must not touch the e6-only channels
    # or the k5 ring, neither by decay nor by the momentum e6's step left
    op, before, read = _steps("used", [1, 0])
    after = [op.shared.pw, op.shared.dw, op.shared.pwl]
    assert read[0][:8].all() and not read[0][8:].any()  # e1: the first c_in rows
    assert read[1][:8, :, 1:4, 1:4].all() and read[1].sum() == 8 * 9  # the centred 3x3
    for b, a, r in zip(before, after, read, strict=True):
        assert torch.equal(a.detach()[~r], b[~r]) and not torch.equal(a.detach()[r], b[r])
    # the k3 e1 step's gradient left the k5 ring's momentum where the e6 step put it
    dense, before_d, _ = _steps("all", [1, 0])
    moved = [(a.detach() - b)[~r].abs().max() for a, b, r in zip(
        [dense.shared.pw, dense.shared.dw, dense.shared.pwl], before_d, read, strict=True)]
    assert all(m > 1e-4 for m in moved)  # `all`: decay and momentum moved what was not read


def test_shared_update_reaches_the_trainers_weight_step(tmp_path):
    t = _tiny_search(tmp_path / "a", mode="reinforce")
    assert isinstance(t._w_update().sparse, UsedSlices)
    t2 = _tiny_search(tmp_path / "b", mode="reinforce", shared_update="all")
    assert t2._w_update().sparse is None


def test_an_old_shared_checkpoint_with_grouped_candidates_is_a_one_line_error():
    """Before grouped candidates shared the superkernel, a shared-weight run saved their own
    convolutions: resuming (or scoring) it says so in one line instead of torch's key list."""
    space = SearchSpace.from_dict(SPACE)
    net = Supernet(space, weights="shared")
    state = net.state_dict()
    again = Supernet(space, weights="shared")
    again.load_search_state(state, "ck.pt")  # its own state loads
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in state.items())
    g = space.layer_candidates()[0].index("ir_k3_e1_g2")
    old = {**state, **{f"mixed.0.candidates.{g}.{k}": torch.zeros(1)
                       for k in ("pw.0.weight", "dw.0.0.weight", "pwl.0.weight")}}
    with pytest.raises(FbnasError) as e:
        again.load_search_state(old, "runs/x/checkpoint.pt")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("runs/x/checkpoint.pt: written before grouped")
    other = dict(state)
    other.pop(next(iter(other)))
    with pytest.raises(FbnasError, match=r"ck.pt: its weights do not fit .* 1 missing"):
        again.load_search_state(other, "ck.pt")
    k = next(k for k, v in state.items() if v.dim() == 4)
    with pytest.raises(FbnasError, match=rf"ck.pt: its weights do not fit .*\({k}: "):
        again.load_search_state({**state, k: torch.zeros(1, 1, 1, 1)}, "ck.pt")


def test_which_candidates_share_is_what_the_registry_says_they_are_not_their_spelling():
    """Sharing and width masks ask the block registry what an op is (`op_spec`): every
    spelling of one op (aliases, the paper's `k3_e1`) gets the same answer, and an op whose
    factory declares no IRF spec never shares, whatever its name."""
    from fbnas.blocks.irf import IRFSpec
    from fbnas.blocks.masked import expansion, maskable
    from fbnas.blocks.registry import op_spec

    assert op_spec("k3_e1") == op_spec("ir_k3_e1") == IRFSpec(3, 1)
    assert op_spec("shuffle") == IRFSpec(3, 1, groups=4)  # an alias of ir_k3_e1_g4
    assert sharable("shuffle") == IRFSpec(3, 1, groups=4) and not maskable("shuffle")
    assert op_spec("skip") is None and sharable("skip") is None and expansion("skip") == 0
    assert sharable("ir_k33_e3") is None and sharable("ir_k3_e6_se") is None
    assert maskable("k5_e6") and expansion("k5_e6") == 6
    assert sharable("no_such_op") is None and not maskable("no_such_op")
