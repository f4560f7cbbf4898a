import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fbnas.arch import (
    META_FIELDS,
    Architecture,
    arch_from_indices,
    arch_log_prob,
    build_child,
    child_stats,
    count_params,
    sample_hard,
    sample_soft,
)
from fbnas.errors import FbnasError
from fbnas.search_space import load_space

ROOT = Path(__file__).parents[1]
ARCHS = sorted((ROOT / "configs/archs").glob("*.yaml"))


@pytest.fixture
def tiny_arch(tiny_space):
    return arch_from_indices(tiny_space, [0, 1, 2], name="t")


def test_yaml_round_trip_is_unchanged(tiny_arch, tmp_path):
    p = tmp_path / "a.yaml"
    tiny_arch.save(p)
    text = p.read_text()
    again = Architecture.load(p)
    assert again == tiny_arch and again.hash() == tiny_arch.hash()
    again.save(tmp_path / "b.yaml")
    assert (tmp_path / "b.yaml").read_text() == text


def test_hash_ignores_name_but_not_ops(tiny_space, tiny_arch):
    renamed = arch_from_indices(tiny_space, [0, 1, 2], name="other")
    assert renamed.hash() == tiny_arch.hash()
    assert arch_from_indices(tiny_space, [0, 1, 1]).hash() != tiny_arch.hash()


@pytest.mark.slow
def test_hash_is_stable_across_processes():
    path = ARCHS[0]
    code = ("from fbnas.arch import Architecture; import sys; "
            f"print(Architecture.load({str(path)!r}).hash())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": s, "PATH": ""},
                           cwd=ROOT).stdout.strip() for s in ("1", "2")}
    assert len(outs) == 1
    assert outs == {Architecture.load(path).hash()}
    assert outs == {yaml.safe_load(path.read_text())["hash"]}


def test_child_has_no_mixed_op_and_runs(tiny_arch):
    from fbnas.supernet import MixedOp

    net = build_child(tiny_arch)
    assert not any(isinstance(m, MixedOp) for m in net.modules())
    y = net(torch.randn(2, 3, 16, 16))
    assert y.shape == (2, 5)
    y.sum().backward()


@pytest.mark.parametrize("path", ARCHS, ids=[p.stem for p in ARCHS])
def test_every_shipped_arch_builds_and_runs_224(path):
    arch = Architecture.load(path)
    net = build_child(arch).eval()
    with torch.no_grad():
        assert net(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


@pytest.mark.parametrize("name,params_m,macs_m", [
    # FBNet paper (Table 3): A 4.3M / 249M, B 4.5M / 295M, C 5.5M / 375M multiply-adds.
    ("fbnet_a", 4.3, 249), ("fbnet_b", 4.5, 295), ("fbnet_c", 5.5, 375)])
def test_fbnet_counts_are_close_to_the_paper(name, params_m, macs_m):
    s = child_stats(Architecture.load(ROOT / f"configs/archs/{name}.yaml"))
    assert s["params"] / 1e6 == pytest.approx(params_m, rel=0.1)
    assert s["macs"] / 1e6 == pytest.approx(macs_m, rel=0.06)


def test_flops_count_a_known_layer():
    from fbnas.arch import count_flops

    conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
    assert count_flops(conv, (10, 10)) == 2 * 3 * 8 * 9 * 100
    assert count_params(conv) == 3 * 8 * 9


def test_sampling_from_theta(tiny_space):
    theta = [torch.tensor([0.0, 3.0, 0.0]), torch.tensor([5.0, 0.0, 0.0]),
             torch.tensor([0.0, 0.0, 1.0])]
    hard = sample_hard(tiny_space, theta)
    assert hard.ops == ("ir_k5_e3", "ir_k3_e1", "skip")
    g = torch.Generator().manual_seed(0)
    draws = [sample_soft(tiny_space, theta, g) for _ in range(200)]
    assert sum(d.ops[1] == "ir_k3_e1" for d in draws) > 180
    lp = arch_log_prob(tiny_space, theta, hard)
    assert lp == pytest.approx(sum(float(torch.log_softmax(t, -1).max()) for t in theta))


def test_check_fits(tiny_space, tiny_arch):
    tiny_arch.check_fits(tiny_space)
    imagenet = load_space(ROOT / "configs/fbnet_imagenet.yaml")
    with pytest.raises(FbnasError, match="macro.input_size is 16 but search space"):
        tiny_arch.check_fits(imagenet)
    fb_b = Architecture.load(ROOT / "configs/archs/fbnet_b.yaml")
    fb_b.check_fits(imagenet)
    small = load_space(ROOT / "configs/fbnet_imagenet.yaml")
    object.__setattr__(small, "stage_candidates",
                       tuple(("ir_k3_e1", "skip") for _ in small.stage_candidates))
    with pytest.raises(FbnasError, match="layer 1 op 'ir_k3_e6' is not a candidate"):
        fb_b.check_fits(small)


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d["ops"][1].pop(), r"ops\[1\]: expected a list of 2 ops"),
    (lambda d: d["ops"].pop(), "2 stage lists for 3 stages"),
    (lambda d: d["ops"][2].__setitem__(0, "ir_k9_e9"), r"ops\[2\]\[0\] \(layer 3\)"),
    (lambda d: d.update(fbnas_arch=99), "schema version 99 is not supported"),
    (lambda d: d.pop("fbnas_arch"), "missing key 'fbnas_arch'"),
    (lambda d: d["macro"].update(num_classes=0), "macro.num_classes: must be >= 1"),
    (lambda d: d.update(extra=1), "unknown key 'extra'"),
])
def test_bad_arch_files_name_the_key(tiny_arch, tmp_path, mutate, match):
    d = tiny_arch.to_dict()
    d["macro"]["stages"].append({"channels": 16, "repeats": 1, "stride": 1})
    d["ops"].append(["skip"])
    mutate(d)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(FbnasError, match=match) as e:
        Architecture.load(p)
    assert str(p) in str(e.value)


def test_edited_file_is_marked(tiny_arch, tmp_path):
    d = tiny_arch.to_dict()
    d["ops"][0] = ["skip"]
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(d))
    a = Architecture.load(p)
    assert a.meta.get("edited") is True and a.hash() != tiny_arch.hash()


def test_meta_is_declared_once_and_checked(tiny_space, tiny_arch, tmp_path):
    """fbnas writes only the meta keys `META_FIELDS` declares, each of its kind; a file's
    declared keys are checked when read, a person's own keys kept."""
    a = arch_from_indices(tiny_space, [0, 1, 2], "t", target=700.0, cost_unit="us", run="r")
    assert a.meta == {"target": 700.0, "cost_unit": "us", "run": "r"}
    with pytest.raises(ValueError, match="undeclared keys \\['target_ms'\\]"):
        arch_from_indices(tiny_space, [0, 1, 2], "t", target_ms=0.7)
    with pytest.raises(ValueError, match="undeclared"):
        tiny_arch.with_meta(asked=700.0)
    with pytest.raises(FbnasError, match="meta.measured: expected a number"):
        tiny_arch.with_meta(measured="fast")
    b = tiny_arch.with_meta(measured=690.5, fitted_layers=2)
    assert b.meta == {"measured": 690.5, "fitted_layers": 2} and tiny_arch.meta == {}
    d = b.to_dict()
    d["meta"]["note"] = "mine"
    p = tmp_path / "a.yaml"
    p.write_text(yaml.safe_dump(d))
    assert Architecture.load(p).meta["note"] == "mine"
    d["meta"]["fitted_layers"] = 1.5
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(FbnasError, match=f"{p}: meta.fitted_layers: expected an integer"):
        Architecture.load(p)
    assert set(META_FIELDS) >= {"target", "predicted", "measured", "cost_unit", "search_cost"}
