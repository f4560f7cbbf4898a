from pathlib import Path

import pytest
import yaml

from fbnas.config import (
    SearchConfig,
    apply_overrides,
    config_from_dict,
    load_config,
)
from fbnas.errors import FbnasError
from fbnas.trainer import TauSchedule

ROOT = Path(__file__).parents[1]
RUN_CONFIGS = [p for p in sorted((ROOT / "configs").glob("*.yaml"))
               if "search" in yaml.safe_load(p.read_text())]


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=[p.stem for p in RUN_CONFIGS])
def test_shipped_run_configs_load_and_resolve_to_a_fixed_point(path):
    cfg = load_config(path)
    again = config_from_dict(cfg.resolved(), "resolved")
    assert again.resolved() == cfg.resolved()


def test_overrides_set_nested_values_with_yaml_types():
    data = {"search": {"epochs": 5}, "space": {"stages": [{"channels": 8}]}}
    out = apply_overrides(data, ["search.epochs=3", "search.hard=true", "loss.kind=additive",
                                 "space.stages.0.channels=16", "search.tau0=2.5"])
    assert out["search"] == {"epochs": 3, "hard": True, "tau0": 2.5}
    assert out["loss"] == {"kind": "additive"}
    assert out["space"]["stages"][0]["channels"] == 16
    assert data["search"]["epochs"] == 5  # the input is not modified


@pytest.mark.parametrize("item,match", [
    ("search.epochs", "expected key=value"),
    ("serach.epochs=3", "unknown section 'serach'"),
    ("space.stages.7.channels=3", "index 7 out of range"),
    ("search..epochs=1", "bad key"),
])
def test_bad_overrides(item, match):
    with pytest.raises(FbnasError, match=match):
        apply_overrides({"space": {"stages": [{}]}}, [item])


def test_unknown_keys_are_errors_naming_the_key():
    cfg = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())
    cfg["search"]["epoch"] = 3
    with pytest.raises(FbnasError, match="q.yaml: search: unknown key 'epoch'"):
        config_from_dict(cfg, "q.yaml")
    cfg["search"].pop("epoch")
    cfg["optimizer"] = {}
    with pytest.raises(FbnasError, match="unknown section 'optimizer'"):
        config_from_dict(cfg, "q.yaml")


@pytest.mark.parametrize("override,match", [
    ("search.tau0=0", "search.tau0: must be > 0"),
    ("search.tau0=-1", "search.tau0"),
    ("search.warmup_epochs=400", "leaves no θ epochs"),
    ("loss.lambda=-0.5", "loss.lambda: must be >= 0"),  # alpha, beta: tests/test_loss.py
    ("loss.target=-2ms", "loss.target: cannot read"),
    ("search.device=tpu", "search.device: must be one of"),
    ("search.device=xla", r"search.device: xla is not supported for training .*latency.device"),
    ("retrain.device=xla", "retrain.device: xla is not supported for training"),
    ("latency.cost=energy", "latency.cost: must be one of"),
    ("search.epochs=two", "search.epochs: expected an integer"),
    ("space.num_classes=0", "space.num_classes: must be >= 1"),
    ("space.candidates=[]", "space.candidates: must not be empty"),
])
def test_out_of_range_values(override, match):
    with pytest.raises(FbnasError, match=match):
        load_config(ROOT / "configs/quickstart.yaml", [override])


def test_temperature_schedules():
    exp = TauSchedule.from_config(
        SearchConfig(epochs=10, warmup_epochs=2, tau0=5.0, tau_decay=0.5, tau_min=0.01))
    assert [exp(e) for e in (0, 1, 2)] == [5.0, 5.0, 5.0]
    assert exp(4) == pytest.approx(5.0 * 2.718281828 ** -1.0, rel=1e-6)
    lin = TauSchedule.from_config(
        SearchConfig(epochs=6, warmup_epochs=1, tau0=5.0, tau_schedule="linear", tau_min=1.0))
    assert [round(lin(e), 6) for e in range(6)] == [5.0, 5.0, 4.0, 3.0, 2.0, 1.0]


def test_data_classes_sets_the_heads_class_count_and_resolves_to_a_fixed_point():
    base = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())
    assert base["space"]["num_classes"] == 10
    cfg = config_from_dict(apply_overrides(base, ["data.classes=4", "data.class_seed=2"]), "q")
    assert cfg.space.macro.num_classes == 4 and cfg.space.macro.head_shape()[-1] == 4
    r = cfg.resolved()
    assert (r["data"]["classes"], r["data"]["class_seed"], r["space"]["num_classes"]) == (4, 2, 4)
    assert config_from_dict(r, "resolved").resolved() == r
    # without a subset the resolved data section has neither key (older runs resume as before)
    plain = config_from_dict(base, "q").resolved()
    assert "classes" not in plain["data"] and "class_seed" not in plain["data"]
    assert plain["space"]["num_classes"] == 10
    # the shipped ImageNet config searches on 100 classes of the 1000-class space
    imagenet = load_config(ROOT / "configs/fbnet_imagenet.yaml")
    assert (imagenet.data.classes, imagenet.space.macro.num_classes) == (100, 100)
    assert load_config(ROOT / "configs/fbnet_imagenet.yaml",
                       ["data.classes=null"]).space.macro.num_classes == 1000


@pytest.mark.parametrize("value,needles", [
    ("11", ["data.classes: 11 is more than the 10 classes of digits"]),
    ("1", ["data.classes: must be >= 2, got 1"]),
    ("ten", ["data.classes: expected an integer, got 'ten'"]),
    ("4.5", ["data.classes: expected an integer, got 4.5"]),
])
def test_bad_data_classes_are_one_line_errors_naming_the_set_and_key(value, needles):
    """A value given with --set is blamed on that --set, not on the file it overrides."""
    with pytest.raises(FbnasError) as ei:
        load_config(ROOT / "configs/quickstart.yaml", ["search.seed=1", f"data.classes={value}"])
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"--set data.classes={value}: data.classes")
    assert "quickstart.yaml" not in msg
    for n in needles:
        assert n in msg


def test_a_shorter_retrain_keeps_its_warm_up_where_it_fits():
    """One rule for the sweep's and fidelity's --retrain-epochs: warm-up kept, else epochs - 1."""
    from fbnas.config import RetrainConfig, with_retrain_epochs

    d = {"retrain": {"epochs": 30, "warmup_epochs": 3}}
    assert with_retrain_epochs(d, 10)["retrain"] == {"epochs": 10, "warmup_epochs": 3}
    assert with_retrain_epochs(d, 2)["retrain"] == {"epochs": 2, "warmup_epochs": 1}
    assert d["retrain"]["epochs"] == 30  # the input is not changed
    default = RetrainConfig().warmup_epochs
    assert with_retrain_epochs({}, 1)["retrain"] == {"epochs": 1,
                                                      "warmup_epochs": min(default, 0)}
    bad = {"retrain": "fast"}  # left for the config check to name
    assert with_retrain_epochs(bad, 5) is bad


def test_search_settings_read_as_groups_or_flat():
    """`search: {fit: {tolerance: 0.05}}` is `fit_tolerance: 0.05`; old flat configs load as
    before; a key outside a group's, or one setting given both ways, is one line."""
    from fbnas.config import SEARCH_GROUPS, SearchConfig, search_groups

    grouped = SearchConfig.from_dict({
        "w": {"lr": 0.2, "momentum": 0.8}, "theta": {"lr": 0.03}, "fit": {"tolerance": 0.05,
        "measure": False}, "tau": {"start": 3.0, "min": 0.2}, "final": {"candidates": 4}})
    flat = SearchConfig.from_dict({
        "w_lr": 0.2, "w_momentum": 0.8, "theta_lr": 0.03, "fit_tolerance": 0.05,
        "fit_measure": "off", "tau0": 3.0, "tau_min": 0.2, "final_candidates": 4})
    assert grouped == flat and grouped.fit_measure == "off"
    # every field of a group's prefix is in it, and nothing else
    groups = search_groups()
    names = {n for g in groups.values() for n in g.values()}
    assert {n for n in vars(flat) if n.split("_")[0] in SEARCH_GROUPS} | {"tau0"} == names
    with pytest.raises(FbnasError, match=r"search.fit.tolernce: unknown key \(the fit group's"):
        SearchConfig.from_dict({"fit": {"tolernce": 0.05}})
    with pytest.raises(FbnasError, match="search.fit.tolerance and search.fit_tolerance are one"):
        SearchConfig.from_dict({"fit": {"tolerance": 0.05}, "fit_tolerance": 0.03})
    # --set reaches a group's key too
    from fbnas.config import apply_overrides
    d = apply_overrides({"search": {"fit": {"rounds": 3}}}, ["search.fit.rounds=5"])
    assert SearchConfig.from_dict(d["search"]).fit_rounds == 5


def test_an_unknown_key_or_section_suggests_the_near_one_and_is_said_the_same_everywhere(
        tmp_path):
    with pytest.raises(FbnasError, match=r"^--set search\.epochz=3: search: unknown key "
                                         r"'epochz' \(did you mean 'epochs'\?\)$"):
        load_config(ROOT / "configs/quickstart.yaml", ["search.epochz=3"])
    with pytest.raises(FbnasError, match=r"unknown key 'zzz' \(known keys: .*epochs"):
        load_config(ROOT / "configs/quickstart.yaml", ["search.zzz=3"])
    with pytest.raises(FbnasError, match=r"unknown section 'serch' \(did you mean 'search'\?\)"):
        load_config(ROOT / "configs/quickstart.yaml", ["serch.epochs=3"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("spaec: {name: x}\n")
    from fbnas.search_space import load_space
    for load in (load_config, load_space):
        with pytest.raises(FbnasError) as ei:
            load(bad)
        assert str(ei.value) == f"{bad}: unknown section 'spaec' (did you mean 'space'?)"
    # a file at fault is blamed on the file, --set or not
    bad.write_text("space: {name: x}\nsearch: {epochz: 3}\n")
    with pytest.raises(FbnasError, match=rf"^{bad}: "):
        load_config(bad, ["search.seed=2"])


def test_the_wrong_kind_of_file_is_named_with_the_command_that_reads_it(tmp_path):
    from fbnas.arch import Architecture
    from fbnas.io import load_json
    from fbnas.search_space import load_space
    arch = ROOT / "configs/archs/fbnet_a.yaml"
    for load in (load_config, load_space):
        with pytest.raises(FbnasError) as ei:
            load(arch)
        assert str(ei.value) == f"{arch}: an architecture file (fbnas arch reads it), not a config"
    with pytest.raises(FbnasError, match="missing key 'fbnas_arch': it is a config "
                                         r"\(fbnas train --config reads it\)"):
        Architecture.load(ROOT / "configs/quickstart.yaml")
    with pytest.raises(FbnasError, match=r"malformed JSON at line 1 .*; it is YAML"):
        load_json(ROOT / "configs/quickstart.yaml")
    broken = tmp_path / "t.json"
    broken.write_text('{"fbnas_cost_table": 1,}')  # a damaged JSON object is not called YAML
    with pytest.raises(FbnasError) as ei:
        load_json(broken)
    assert "malformed JSON" in str(ei.value) and "YAML" not in str(ei.value)


# ---- `base:` ----------------------------------------------------------------------------------
def test_a_config_takes_what_it_does_not_set_from_its_base(tmp_path):
    from fbnas.config import load_config
    from fbnas.latency.config import LatencyConfig
    from fbnas.search_space import load_space

    p = tmp_path / "c.yaml"
    p.write_text("base: quickstart\nspace:\n  name: mine\n  stages:\n"
                 "    - {channels: 8, repeats: 1, stride: 1}\nsearch:\n  epochs: 30\n"
                 "latency:\n  threads: 2\n")
    cfg, qs = load_config(p), load_config("quickstart")
    assert cfg.space.name == "mine" and cfg.search.epochs == 30
    assert len(cfg.space.macro.stages) == 1  # a list replaces the base's
    assert cfg.space.to_dict()["candidates"] == qs.space.to_dict()["candidates"]  # merged
    assert cfg.search.mode == qs.search.mode and cfg.search.warmup_epochs == qs.search.warmup_epochs
    assert cfg.retrain == qs.retrain and cfg.data == qs.data
    assert load_space(p).name == "mine"
    assert LatencyConfig.from_file(p).threads == 2
    assert LatencyConfig.from_file(p).device == qs.latency.device


def test_a_base_beside_the_file_and_a_chain_of_bases(tmp_path):
    from fbnas.config import load_config

    (tmp_path / "a.yaml").write_text("base: quickstart\nsearch: {epochs: 50}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nretrain: {epochs: 2}\n")
    cfg = load_config(tmp_path / "b.yaml")
    assert (cfg.search.epochs, cfg.retrain.epochs) == (50, 2)
    assert cfg.space == load_config("quickstart").space


@pytest.mark.parametrize("text, says", [
    ("base: nosuch\n", ["c.yaml: base: nosuch: no such file", "shipped"]),
    ("base: 3\n", ["c.yaml: base: give a config file or a shipped config's name"]),
    ("base: c.yaml\n", ["c.yaml: base: c.yaml comes back"]),
])
def test_a_bad_base_is_one_line_naming_the_file_and_key(tmp_path, text, says):
    from conftest import one_line_error

    from fbnas.config import load_config

    p = tmp_path / "c.yaml"
    p.write_text(text)
    one_line_error(lambda: load_config(p), *says)


def test_the_shipped_variants_take_the_quickstarts_settings():
    """The width and deep configs say they are the quickstart's but for their space: so they
    repeat none of its settings and read as it does."""
    from fbnas.config import load_config
    from fbnas.io import load_yaml

    qs = load_config("quickstart")
    for name in ("quickstart_widths", "digits_deep"):
        raw = load_yaml(ROOT / "configs" / f"{name}.yaml")
        assert raw["base"] == "quickstart" and set(raw) == {"base", "space", "run"}, name
        cfg = load_config(name)
        assert (cfg.search, cfg.retrain, cfg.loss, cfg.data) == \
            (qs.search, qs.retrain, qs.loss, qs.data), name
