"""Block signatures: canonical keys, each shape measured once, deduplicated in the shipped
spaces (fbnas/latency/signature.py)."""

from __future__ import annotations

from fbnas.latency import block_signature, build_table, layer_signatures, space_signatures
from fbnas.search_space import load_space

from .fakes import FAST, fake, tiny_space


def test_signature_keys_are_canonical_and_readable():
    sig = block_signature("k3_e6", 16, 24, 1, 32, 32)
    assert sig.key() == "ir_k3_e6 c16-24 s1 32x32"
    assert block_signature("ir_k3_s2", 16, 16, 1, 8, 8).op == "ir_k3_e1_g2"


def test_repeated_shapes_are_measured_once():
    space = tiny_space()
    sigs = space_signatures(space)
    # stem + 3 ops x (8->8 s1 8x8, 8->16 s2 8x8, 16->16 s1 4x4) + head; 5 layers x 3 ops = 15
    assert len(sigs) == 1 + 9 + 1 == len(set(sigs))
    timer = fake()
    build_table(space, timer, FAST, context_probes=0)
    entries = [p for p in timer.prepared if p != "reference"]
    assert sorted(entries) == sorted(s.key() for s in sigs)


def test_signature_dedup_in_shipped_spaces():
    for cfg in ("configs/fbnet_cifar10.yaml", "configs/fbnet_imagenet.yaml"):
        space = load_space(cfg)
        per_layer = sum(len(r) for r in layer_signatures(space))
        assert len(space_signatures(space)) < per_layer + 2
