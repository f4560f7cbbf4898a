import pytest
import torch
from torch import nn

from fbnas.blocks import build_block, canonical_op, register_block, registered_ops
from fbnas.blocks.irf import IRFBlock
from fbnas.errors import FbnasError

# Every primitive of the reference implementation (seed 001), by its own name.
SEED_PRIMITIVES = [
    "skip", "ir_k3", "ir_k5", "ir_k7", "ir_k1", "shuffle", "basic_block", "shift_5x5",
    "ir_k3_e1", "ir_k3_e3", "ir_k3_e6", "ir_k3_s4", "ir_k5_e1", "ir_k5_e3", "ir_k5_e6",
    "ir_k5_s4", "ir_k3_e1_se", "ir_k3_e3_se", "ir_k3_e6_se", "ir_k3_s4_se", "ir_k5_e1_se",
    "ir_k5_e3_se", "ir_k5_e6_se", "ir_k5_s4_se", "ir_k3_s2", "ir_k5_s2", "ir_k3_s2_se",
    "ir_k5_s2_se", "ir_k3_sep", "ir_k33_e1", "ir_k33_e3", "ir_k33_e6", "ir_k7_e1", "ir_k7_e3",
    "ir_k7_e6", "ir_k7_sep", "ir_k7_sep_e1", "ir_k7_sep_e3", "ir_k7_sep_e6",
]

SHAPES = [(16, 16, 1), (16, 32, 2), (16, 24, 1), (32, 32, 2)]


@pytest.mark.parametrize("op", sorted(set(registered_ops() + SEED_PRIMITIVES)))
@pytest.mark.parametrize("c_in,c_out,stride", SHAPES)
def test_every_op_forward_backward_shape(op, c_in, c_out, stride):
    block = build_block(op, c_in, c_out, stride)
    x = torch.randn(2, c_in, 9, 9, requires_grad=True)
    y = block(x)
    assert y.shape == (2, c_out, 5 if stride == 2 else 9, 5 if stride == 2 else 9)
    y.square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    trainable = [p for p in block.parameters() if p.requires_grad]
    if trainable:
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable)


@pytest.mark.parametrize("op", sorted(set(registered_ops() + SEED_PRIMITIVES)))
def test_residual_rule(op):
    same = build_block(op, 16, 16, 1)
    assert same.has_skip
    for c_in, c_out, stride in [(16, 32, 1), (16, 16, 2)]:
        assert not build_block(op, c_in, c_out, stride).has_skip


def test_residual_is_really_added():
    block = build_block("ir_k3_e3", 8, 8, 1).eval()
    # Zero the last BN's scale and shift: the body outputs 0, so the block must be identity.
    nn.init.zeros_(block.pwl[1].weight)
    nn.init.zeros_(block.pwl[1].bias)
    x = torch.randn(1, 8, 5, 5)
    torch.testing.assert_close(block(x), x)


def test_skip_is_identity_when_shapes_match():
    x = torch.randn(1, 8, 4, 4)
    assert build_block("skip", 8, 8, 1)(x) is x


@pytest.mark.parametrize("name,canonical", [
    ("ir_k3_s2", "ir_k3_e1_g2"), ("ir_k5_g2", "ir_k5_e1_g2"), ("k5_e1_g2", "ir_k5_e1_g2"),
    ("k3_e1_g2", "ir_k3_e1_g2"), ("ir_k3_s4", "ir_k3_e4_g4"), ("ir_k3_sep", "ir_k33_e1"),
    ("ir_k7_sep_e6", "ir_k77_e6"), ("ir_k3", "ir_k3_e1"), ("ir_k3_e6_se", "ir_k3_e6_se"),
    ("ir_k3_se_e6", "ir_k3_e6_se"), ("shuffle", "ir_k3_e1_g4"), ("skip", "skip"),
])
def test_spellings_have_one_canonical_form(name, canonical):
    assert canonical_op(name) == canonical
    assert canonical_op(canonical) == canonical


def test_structure_follows_the_name():
    b = build_block("ir_k5_e6", 16, 24, 2)
    assert isinstance(b, IRFBlock)
    assert b.pw[0].out_channels == 96 and b.pw[0].kernel_size == (1, 1)
    assert b.dw[0][0].kernel_size == (5, 5) and b.dw[0][0].stride == (2, 2)
    assert b.dw[0][0].groups == 96
    g = build_block("ir_k3_e1_g2", 16, 16, 1)
    assert g.pw[0].groups == 2 and g.pwl[0].groups == 2 and g.pw[0].out_channels == 16
    c = build_block("ir_k33_e3", 16, 16, 1)
    assert len(c.dw) == 2
    assert build_block("ir_k3_e1", 16, 16, 1).pw[0].out_channels == 16  # expand conv at e1


@pytest.mark.parametrize("bad", ["ir_k4_e1", "ir_k3_e0", "ir_k3_e99", "ir_k3_g3", "ir_e3",
                                 "ir_k3_x1", "ir_k3_e3_e6", "conv", "", "ir", "ir_k3__e1"])
def test_bad_op_names_raise_clear_errors(bad):
    with pytest.raises(FbnasError) as e:
        canonical_op(bad)
    assert "\n" not in str(e.value)
    if bad:
        assert bad in str(e.value) or "op name" in str(e.value)


def test_groups_must_divide_channels():
    with pytest.raises(FbnasError, match="divisible by groups 2"):
        build_block("ir_k3_e1_g2", 15, 16, 1)


def test_bad_shape_arguments():
    with pytest.raises(FbnasError, match="c_out"):
        build_block("ir_k3_e1", 8, 0, 1)


def test_duplicate_registration_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_block("skip")(lambda c_in, c_out, stride: nn.Identity())
