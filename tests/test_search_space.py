from pathlib import Path

import pytest
import yaml

from fbnas.errors import FbnasError
from fbnas.search_space import SearchSpace, load_space

CONFIGS = sorted(Path(__file__).parents[1].joinpath("configs").glob("*.yaml"))
PAPER_9 = ["ir_k3_e1", "ir_k3_e1_g2", "ir_k3_e3", "ir_k3_e6", "ir_k5_e1", "ir_k5_e1_g2",
           "ir_k5_e3", "ir_k5_e6", "skip"]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_space_infers_consistent_shapes(path):
    space = load_space(path)
    layers = space.layers()
    assert len(layers) == space.num_layers
    c, h, w = space.macro.stem_shape()[1], *space.macro.stem_shape()[3:]
    s = space.macro.stem.stride
    h, w = (h - 1) // s + 1, (w - 1) // s + 1
    for la in layers:
        assert (la.c_in, la.h, la.w) == (c, h, w)
        c, (h, w) = la.c_out, la.out_hw
    assert space.macro.head_shape()[:1] == (c,)


def test_fbnet_imagenet_matches_table_1():
    space = load_space(Path(__file__).parents[1] / "configs/fbnet_imagenet.yaml")
    layers = space.layers()
    assert len(layers) == 22
    assert [(la.c_out, la.stride, la.h) for la in layers if la.position == 0] == [
        (16, 1, 112), (24, 2, 112), (32, 2, 56), (64, 2, 28), (112, 1, 14), (184, 2, 14),
        (352, 1, 7)]
    assert space.macro.head_shape() == (352, 1984, 7, 7, 1000)
    assert all(list(c) == PAPER_9 for c in space.layer_candidates())


def test_fbnet_cifar10_strides():
    space = load_space(Path(__file__).parents[1] / "configs/fbnet_cifar10.yaml")
    assert [st.stride for st in space.macro.stages] == [1, 1, 2, 2, 1, 2, 1]
    assert space.macro.stem.stride == 1
    assert space.macro.head_shape() == (352, 1504, 4, 4, 10)
    assert space.num_layers == 22


def test_per_stage_candidates_and_width_mult(tiny_space_dict):
    tiny_space_dict["stages"][1]["candidates"] = ["ir_k3_e6", "k5_e1_g2"]
    tiny_space_dict["width_mult"] = 0.5
    space = SearchSpace.from_dict(tiny_space_dict)
    assert space.candidates(0) == ("ir_k3_e1", "ir_k5_e3", "skip")
    assert space.candidates(1) == ("ir_k3_e6", "ir_k5_e1_g2")
    assert [la.c_out for la in space.layers()] == [8, 8, 8]  # 16 * 0.5, divisible by 8
    assert space.size() == 3 * 2 * 2


def test_round_trip_through_dict(tiny_space):
    again = SearchSpace.from_dict(tiny_space.to_dict())
    assert again == tiny_space


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d["candidates"].append("ir_k9_e1"), r"candidates\[3\]: op 'ir_k9_e1'"),
    (lambda d: d["candidates"].append("k3_e1"), "listed twice"),
    (lambda d: d["stages"][0].update(channels=0), r"stages\[0\]\.channels: must be >= 1"),
    (lambda d: d["stages"][0].update(channels=-4), r"stages\[0\]\.channels"),
    (lambda d: d["stages"][1].update(stride=2, repeats=1) or d["stages"].extend(
        [{"channels": 8, "stride": 2}] * 3), r"stages\[4\]\.stride: .* below 1x1"),
    (lambda d: d.update(input_size=0), "input_size: must be positive"),
    (lambda d: d.pop("head"), "missing key 'head'"),
    (lambda d: d.update(colour="red"), "unknown key 'colour'"),
    (lambda d: d["stages"][0].update(repeat=2), r"stages\[0\]: unknown key 'repeat'"),
    (lambda d: d.update(candidates=[]), "candidates: must not be empty"),
    (lambda d: d.update(num_classes="ten"), "num_classes: expected an integer"),
    (lambda d: d.update(stages=[]), "stages: must not be empty"),
    (lambda d: d["stem"].update(kernel=2), "stem.kernel: must be odd"),
])
def test_bad_spaces_name_the_key(tiny_space_dict, mutate, match):
    mutate(tiny_space_dict)
    with pytest.raises(FbnasError, match=match) as e:
        SearchSpace.from_dict(tiny_space_dict, "cfg.yaml: space")
    assert str(e.value).startswith("cfg.yaml: space")


def test_load_space_file_errors(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("space: {name: x\n  stages: [")
    with pytest.raises(FbnasError, match=r"bad.yaml: line \d+: malformed YAML"):
        load_space(p)
    p.write_text(yaml.safe_dump({"data": {}}))
    with pytest.raises(FbnasError, match="missing key 'space'"):
        load_space(p)
    p.write_bytes(b"space: \xff\xfe")
    with pytest.raises(FbnasError, match="not UTF-8"):
        load_space(p)
    with pytest.raises(FbnasError, match="no such file"):
        load_space(tmp_path / "missing.yaml")
