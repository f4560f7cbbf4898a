"""Bad input, a tested matrix: every file fbnas reads, through every CLI command that reads it.

Files: configs (each section), architecture YAML, cost tables, search and child checkpoints,
dataset roots and results.json. Each case makes one bad file (or a mismatched pair of good
ones), runs `fbnas ...` in-process, and asserts:

- exit status 2;
- stderr is ONE line, `fbnas COMMAND: error: ...`, naming the file and the key or value;
- nothing was written: the case folder (the working directory, holding every input and every
  output path the command was given) and the shared fixture runs are byte-for-byte and
  mtime-for-mtime as before.

"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from conftest import digits_run_config

from fbnas._cli import main

# ---- the shared fixture: a good config, a finished search and retrain, tables ------------------
TINY = digits_run_config(
    search={"bn_calib_samples": 64},
    retrain={"epochs": 1, "warmup_epochs": 0, "device": "cpu", "measure_latency": False})


@dataclass
class World:
    dir: Path
    cfg: dict  # the good config, as a dict
    config: Path  # ... as a file (run.dir inside the world)
    run: Path  # a finished search run
    retrain: Path  # a finished retrain run (child checkpoint, results.json)
    arch: Path  # the search's architecture (tiny space)
    flops: Path  # the run's flops table
    lat: Path  # a latency table for the tiny space (fake device, batch 1, float32)
    other_config: Path  # a config whose space differs (wider second stage)
    other_arch: Path  # an architecture of that other space


def _write_yaml(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    from fbnas.arch import Architecture, arch_from_indices
    from fbnas.latency import LatencyTable, make_timer, space_signatures
    from fbnas.search_space import SearchSpace

    d = tmp_path_factory.mktemp("world")
    cfg = copy.deepcopy(TINY)
    good = copy.deepcopy(cfg)
    good["run"]["dir"] = str(d / "run")
    config = _write_yaml(d / "good.yaml", good)
    assert main(["train", "--config", str(config)]) == 0
    arch = d / "run" / "arch_hard.yaml"
    assert main(["retrain", "--arch", str(arch), "--config", str(config),
                 "--out", str(d / "retrain")]) == 0
    space = SearchSpace.from_dict(cfg["space"], "tiny")
    lat = LatencyTable("latency", make_timer("fake").describe())
    for i, sig in enumerate(space_signatures(space)):
        lat.add(sig, 50.0 + i)
    lat.save(d / "lat.json")
    other = copy.deepcopy(good)
    other["space"]["stages"][1]["channels"] = 24
    other_config = _write_yaml(d / "other.yaml", other)
    other_space = SearchSpace.from_dict(other["space"], "other")
    arch_from_indices(other_space, [0, 1], "other_arch").save(d / "other_arch.yaml")
    Architecture.load(d / "other_arch.yaml")
    return World(d, cfg, config, d / "run", d / "retrain", arch, d / "run" / "cost_table.json",
                 d / "lat.json", other_config, d / "other_arch.yaml")


# ---- cases ----------------------------------------------------------------------------------
Setup = Callable[[World, Path], tuple[list, list]]  # -> (argv, substrings of the error line)


@dataclass(frozen=True)
class Case:
    setup: Setup


CASES: list = []


def case(id: str, marks=()):
    def deco(setup: Setup) -> Setup:
        CASES.append(pytest.param(Case(setup), id=id, marks=marks))
        return setup
    return deco


def add(id: str, setup: Setup, marks=()) -> None:
    case(id, marks)(setup)


def config_file(w: World, d: Path, mutate: Callable[[dict], None] | None = None,
                name: str = "c.yaml") -> Path:
    """The good config with run.dir (and the latency cache) inside the case folder, mutated."""
    c = copy.deepcopy(w.cfg)
    c["run"]["dir"] = str(d / "run")
    c["latency"]["cache_dir"] = str(d / "cache")
    if mutate is not None:
        mutate(c)
    return _write_yaml(d / name, c)


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---- 1. file-level faults x every command that reads the file --------------------------------
def _sparse(p: Path, size: int) -> None:
    with open(p, "wb") as f:
        f.truncate(size)


def _truncate(good: bytes, kind: str) -> bytes:
    """The good bytes cut about half-way. A YAML cut lands inside a mapping key (a bare partial
    word, which no YAML reader accepts), so where the half falls, and so whether the rest
    still parses as a valid shorter file, does not depend on how long the paths in it are."""
    half = good[: len(good) // 2]
    if kind != "yaml":
        return half  # JSON cut anywhere does not parse
    # a key whose line follows a sibling's `key: value` (at the start of a block, the partial
    # word would read as the parent's scalar value)
    keys = list(re.finditer(rb"^(?P<ind> *)[a-z_]+: \S.*\n(?=(?P=ind)(?P<key>[a-z_]{2,}):)",
                            half, re.MULTILINE))
    assert keys, "no mapping key in the first half of the good file"
    return half[: keys[-1].start("key") + 1]


def _text_faults(kind: str) -> dict[str, tuple[Callable[[Path, bytes], None], str]]:
    """fault -> (make the file at `p` from the good bytes, what the error line says)."""
    big = 2 * 1024 * 1024 if kind == "yaml" else 40 * 1024 * 1024
    malformed = b"space: [1, 2\n  name: x\n" if kind == "yaml" else b'{"fbnas": [1, 2'
    depth = 700 if kind == "yaml" else 100_000  # PyYAML recurses in Python, json in C
    return {
        "missing": (lambda p, good: None, "no such file"),
        "empty": (lambda p, good: p.write_bytes(b""), "empty"),
        "directory": (lambda p, good: p.mkdir(), "is a directory"),
        "non_utf8": (lambda p, good: p.write_bytes(good[:40] + b"\xff\xfe\xfa" + good[40:]),
                     "not UTF-8"),
        "truncated": (lambda p, good: p.write_bytes(_truncate(good, kind)), ""),
        "malformed": (lambda p, good: p.write_bytes(malformed), "malformed"),
        "huge": (lambda p, good: _sparse(p, big), "larger than"),
        "top_level_list": (lambda p, good: p.write_bytes(b"[1, 2]\n"), "expected a"),
        "deep_nesting": (lambda p, good: p.write_bytes(b"[" * depth + b"]" * depth),
                         "nested too deeply"),
    }


def _file_cases(kind: str, ext: str, good: Callable[[World], bytes],
                consumers: dict[str, Callable[[World, Path, Path], list]],
                target: Callable[[Path], Path], skip: dict[str, set[str]] | None = None):
    for fault, (make, says) in _text_faults(ext).items():
        for cname, argv_for in consumers.items():
            if fault in (skip or {}).get(cname, set()):
                continue

            def setup(w, d, make=make, says=says, argv_for=argv_for):
                p = target(d)
                p.parent.mkdir(parents=True, exist_ok=True)
                make(p, good(w))
                return argv_for(w, d, p), [str(p), says]
            add(f"{kind}-{fault}-via-{cname}", setup)


def _s(*parts) -> list[str]:
    return [str(x) for x in parts]


CONFIG_CONSUMERS = {
    "space": lambda w, d, p: _s("space", p),
    "train": lambda w, d, p: _s("train", "--config", p),
    "latency_build": lambda w, d, p: _s("latency", "build", "--config", p, "--cost", "flops",
                                         "--table", d / "t.json"),
    "latency_show": lambda w, d, p: _s("latency", "show", w.lat, "--config", p),
    "latency_predict": lambda w, d, p: _s("latency", "predict", "--arch", w.arch, "--table",
                                           w.lat, "--config", p),
    "latency_validate": lambda w, d, p: _s("latency", "validate", "--config", p, "--table",
                                            w.lat, "--device", "fake", "--json",
                                            d / "r.json"),
    "arch_space": lambda w, d, p: _s("arch", w.arch, "--config", p),
    "retrain": lambda w, d, p: _s("retrain", "--arch", w.arch, "--config", p, "--out",
                                   d / "rt"),
    "eval": lambda w, d, p: _s("eval", "--checkpoint", w.retrain, "--config", p, "--json",
                                d / "e.json"),
    "sweep": lambda w, d, p: _s("sweep", "--config", p, "--beta", "0,1", "--out", d / "sw"),
}
_file_cases("config", "yaml", lambda w: w.config.read_bytes(), CONFIG_CONSUMERS,
            lambda d: d / "c.yaml")

ARCH_CONSUMERS = {
    "arch": lambda w, d, p: _s("arch", p),
    "arch_space": lambda w, d, p: _s("arch", p, "--config", w.config),
    "latency_predict": lambda w, d, p: _s("latency", "predict", "--arch", p, "--table", w.lat),
    "latency_measure": lambda w, d, p: _s("latency", "measure", "--arch", p, "--device", "fake",
                                           "--json", d / "m.json"),
    "retrain": lambda w, d, p: _s("retrain", "--arch", p, "--config", w.config, "--out",
                                   d / "rt"),
    "sweep_reference": lambda w, d, p: _s("sweep", "--config", config_file(w, d), "--beta",
                                           "0", "--reference", p, "--out", d / "sw"),
}
_file_cases("arch", "yaml", lambda w: w.arch.read_bytes(), ARCH_CONSUMERS,
            lambda d: d / "a.yaml")


def _train_with_table(w: World, d: Path, p: Path) -> list:
    def mutate(c):
        c["latency"] = {"cost": "latency", "table": str(p), "device": "fake"}
    return _s("train", "--config", config_file(w, d, mutate))


TABLE_CONSUMERS = {
    "latency_show": lambda w, d, p: _s("latency", "show", p),
    "latency_predict": lambda w, d, p: _s("latency", "predict", "--arch", w.arch, "--table", p),
    "latency_build": lambda w, d, p: _s("latency", "build", "--config", w.config, "--cost",
                                         "flops", "--table", p),
    "latency_measure": lambda w, d, p: _s("latency", "measure", "--arch", w.arch, "--table", p,
                                           "--device", "fake", "--json", d / "m.json"),
    "latency_validate": lambda w, d, p: _s("latency", "validate", "--config", w.config,
                                            "--table", p, "--device", "fake", "--json",
                                            d / "r.json"),
    "train": _train_with_table,
}
_file_cases("table", "json", lambda w: w.lat.read_bytes(), TABLE_CONSUMERS,
            lambda d: d / "t.json",
            skip={"latency_build": {"missing"},  # a missing --out is a new table
                  "train": {"missing"}})  # a missing table file is a config-level check below
add("table-missing-via-train",
    lambda w, d: (_train_with_table(w, d, d / "nope.json"), [str(d / "nope.json"),
                                                             "no such file"]))

RESULTS_CONSUMERS = {"runs": lambda w, d, p: _s("runs", p)}
_file_cases("results", "json", lambda w: (w.retrain / "results.json").read_bytes(),
            RESULTS_CONSUMERS, lambda d: d / "r" / "results.json",
            skip={"runs": {"directory"}})  # a directory is what `fbnas runs DIR` searches


# files inside a run folder: the run's config (resume, plot), history (plot), cost table (sample)
RUN_FILES = [
    # (what, text kind, run folder, file, {consumer: argv from the case folder})
    ("search-run-config", "yaml", "run", "config.yaml", {
        "train_resume": lambda d: _s("train", "--resume", d / "run"),
        "plot": lambda d: _s("plot", d / "run", "--out", d / "plots")}),
    ("search-run-history", "json", "run", "history.json", {
        "plot": lambda d: _s("plot", d / "run", "--out", d / "plots")}),
    ("search-run-cost-table", "json", "run", "cost_table.json", {
        "sample": lambda d: _s("sample", d / "run", "--out", d / "s")}),
    ("retrain-run-config", "yaml", "rt", "config.yaml", {
        "retrain_resume": lambda d: _s("retrain", "--resume", d / "rt")}),
]
# a missing or non-file run config is "no config.yaml there" (the folder is named); a run
# without cost_table.json samples without predicted costs: not an error
NOT_A_FILE = {("missing", "train_resume"), ("directory", "train_resume"),
              ("missing", "retrain_resume"), ("directory", "retrain_resume"),
              ("missing", "plot")}
for _what, _ext, _folder, _name, _consumers in RUN_FILES:
    for _fault, (_make, _says) in _text_faults(_ext).items():
        for _cname, _argv in _consumers.items():
            if (_fault, _cname) == ("missing", "sample"):
                continue

            def _setup(w, d, folder=_folder, name=_name, make=_make, says=_says, argv=_argv,
                       fault=_fault, cname=_cname):
                run = copy_run(w.run if folder == "run" else w.retrain, d / folder)
                p = run / name
                good = p.read_bytes()
                p.unlink()
                make(p, good)
                if (fault, cname) in NOT_A_FILE:
                    return argv(d), [str(run), name]
                return argv(d), [str(p), says]
            add(f"{_what}-{_fault}-via-{_cname}", _setup)

HISTORY_CHANGES = [
    ("record-not-object", lambda h: h.__setitem__(0, 5), "[0]: expected an epoch record"),
    ("epoch-missing", lambda h: h[0].pop("epoch"), "[0].epoch: expected a number"),
    ("probs-missing", lambda h: h[-1].pop("probs"), "probs: expected one list"),
    ("probs-of-another-space", lambda h: h[0]["probs"].append([1.0]), "[0].probs"),
    ("series-string", lambda h: h[0].update(tau="hot"), "[0].tau: expected a number"),
    ("empty-list", lambda h: h.clear(), "no epochs recorded yet"),
    ("object-not-list", lambda h: None, "expected a JSON list"),
]
for _id, _change, _says in HISTORY_CHANGES:
    def _setup(w, d, change=_change, says=_says, id=_id):
        run = copy_run(w.run, d / "run")
        h = json.loads((run / "history.json").read_text())
        change(h)
        _write_json(run / "history.json", {"epochs": h} if id == "object-not-list" else h)
        return _s("plot", run, "--out", d / "plots"), [str(run / "history.json"), says]
    add(f"history-{_id}-via-plot", _setup)


# ---- 2. checkpoints: damaged files x every command that reads them ---------------------------
class Payload:
    """Unpickling this would create a file; weights_only=True must refuse it instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _resave(p: Path, change: Callable[[dict], object]) -> None:
    """Load a checkpoint, change its dict in place, save it back as it is (no fbnas checks)."""
    state = torch.load(p, weights_only=True)
    change(state)
    torch.save(state, p)


def _ckpt_faults(other_kind: Callable[[World], Path]):
    return {
        "missing": (lambda w, p: p.unlink(), "no checkpoint there"),
        "empty": (lambda w, p: p.write_bytes(b""), "empty"),
        "directory": (lambda w, p: (p.unlink(), p.mkdir()), "is a directory"),
        "truncated": (lambda w, p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
                      "corrupted"),
        "garbage": (lambda w, p: p.write_bytes(bytes(range(256)) * 64), "corrupted"),
        "tensor_not_dict": (lambda w, p: torch.save(torch.zeros(3), p),
                            "not an fbnas checkpoint"),
        "no_header": (lambda w, p: torch.save({"model": {}}, p), "not an fbnas checkpoint"),
        "schema_newer": (lambda w, p: _resave(p, lambda s: s.update(fbnas_checkpoint=2)),
                         "newer fbnas"),
        "schema_older": (lambda w, p: _resave(p, lambda s: s.update(fbnas_checkpoint=0)),
                         "older"),
        "wrong_kind": (lambda w, p: shutil.copy(other_kind(w), p), "checkpoint, expected"),
        "missing_model": (lambda w, p: _resave(p, lambda s: s.pop("model")),
                          "missing key 'model'"),
        "model_not_tensors": (lambda w, p: _resave(p, lambda s: s.update(model={"x": [1, 2]})),
                              "not tensors"),
        "pickled_code": (lambda w, p: torch.save(Payload(p.parent / "PWNED"), p), "corrupted"),
    }


SEARCH_CKPT_CONSUMERS = {
    "sample": lambda w, d: _s("sample", d / "run"),
    "train_resume": lambda w, d: _s("train", "--resume", d / "run"),
    "retrain_init_from_supernet": lambda w, d: _s(
        "retrain", "--arch", w.arch, "--config", config_file(w, d),
        "--init-from-supernet", d / "run", "--out", d / "rt2"),
}
CHILD_CKPT_CONSUMERS = {
    "eval": lambda w, d: _s("eval", "--checkpoint", d / "rt", "--json", d / "e.json"),
    "export": lambda w, d: _s("export", "--checkpoint", d / "rt", "--format", "torchscript",
                               "--out", d / "exp"),
    "retrain_resume": lambda w, d: _s("retrain", "--resume", d / "rt"),
    "latency_measure": lambda w, d: _s("latency", "measure", "--model", d / "rt" /
                                        "checkpoint.pt", "--device", "fake"),
}


def _ckpt_cases(kind, consumers, run_of, folder, other_kind):
    for fault, (make, says) in _ckpt_faults(other_kind).items():
        for cname, argv_for in consumers.items():
            if (fault, cname) == ("directory", "latency_measure"):
                says = "no checkpoint there"  # a folder is read as a run folder: PATH/checkpoint.pt

            def setup(w, d, make=make, says=says, argv_for=argv_for):
                run = copy_run(run_of(w), d / folder)
                p = run / "checkpoint.pt"
                make(w, p)
                return argv_for(w, d), [str(p), says]
            add(f"{kind}-checkpoint-{fault}-via-{cname}", setup)


_ckpt_cases("search", SEARCH_CKPT_CONSUMERS, lambda w: w.run, "run",
            lambda w: w.retrain / "checkpoint.pt")
_ckpt_cases("child", CHILD_CKPT_CONSUMERS, lambda w: w.retrain, "rt",
            lambda w: w.run / "checkpoint.pt")


# ---- 3. config contents: every section, via `fbnas train --config` ---------------------------
DELETE = object()


def _set(c: dict, path: tuple, value) -> None:
    node = c
    for k in path[:-1]:
        node = node[k]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value


CONFIG_VALUES = [
    # (id, key path, value, what the error line says besides the file)
    ("space-missing", ("space",), DELETE, "missing key 'space'"),
    ("space-not-mapping", ("space",), [1], "space: expected a mapping"),
    ("space-name-missing", ("space", "name"), DELETE, "missing key 'name'"),
    ("space-name-path", ("space", "name"), "../../elsewhere", "space.name"),
    ("space-unknown-key", ("space", "colour"), "red", "unknown key 'colour'"),
    ("space-num_classes-zero", ("space", "num_classes"), 0, "space.num_classes: must be >= 1"),
    ("space-num_classes-string", ("space", "num_classes"), "ten",
     "space.num_classes: expected an integer"),
    ("space-num_classes-bool", ("space", "num_classes"), True,
     "space.num_classes: expected an integer"),
    ("space-candidates-empty", ("space", "candidates"), [], "space.candidates: must not be empty"),
    ("space-candidates-bad-kernel", ("space", "candidates"), ["ir_k4_e1"],
     "space.candidates[0]: op 'ir_k4_e1': kernel 4"),
    ("space-candidates-unknown-op", ("space", "candidates"), ["conv_magic"],
     "unknown op 'conv_magic'"),
    ("space-candidates-not-string", ("space", "candidates"), [42],
     "space.candidates[0]: expected an op name"),
    ("space-candidates-duplicate", ("space", "candidates"), ["ir_k3_e1", "k3_e1"],
     "listed twice"),
    ("space-candidates-string", ("space", "candidates"), "ir_k3_e1",
     "space.candidates: expected a list"),
    ("space-candidates-long-name", ("space", "candidates"), ["ir_k3_" + "e" * 5000],
     "space.candidates[0]"),
    ("space-stages-empty", ("space", "stages"), [], "space.stages: must not be empty"),
    ("space-stage-not-mapping", ("space", "stages"), [5], "space.stages[0]: expected a mapping"),
    ("space-stage-channels-negative", ("space", "stages", 0, "channels"), -8,
     "space.stages[0].channels: must be >= 1"),
    ("space-stage-stride-zero", ("space", "stages", 1, "stride"), 0,
     "space.stages[1].stride: must be >= 1"),
    ("space-stage-repeats-huge", ("space", "stages", 0, "repeats"), 10**9,
     "space.stages[0].repeats: must be <= 1024"),
    ("space-stage-unknown-key", ("space", "stages", 0, "expand"), 6, "unknown key 'expand'"),
    ("space-stage-stride-beyond-input", ("space", "stages", 1, "stride"), 16,
     "stages[1].stride: stride 16 on a 8x8 map"),
    ("space-input_size-one-number-list", ("space", "input_size"), [8],
     "space.input_size: expected an integer or [H, W]"),
    ("space-input_size-zero", ("space", "input_size"), 0, "space.input_size: must be positive"),
    ("space-input_size-huge", ("space", "input_size"), 10**6, "space.input_size: must be <="),
    ("space-width_mult-negative", ("space", "width_mult"), -1.0, "space.width_mult: must be > 0"),
    ("space-stem-missing", ("space", "stem"), DELETE, "missing key 'stem'"),
    ("space-stem-kernel-even", ("space", "stem", "kernel"), 2, "space.stem.kernel: must be odd"),
    ("space-head-pool", ("space", "head", "pool"), "median", "space.head.pool: must be one of"),
    ("space-head-dropout", ("space", "head", "dropout"), 1.5, "space.head.dropout: must be <="),
    ("unknown-section", ("optimizer",), {"lr": 1}, "unknown section 'optimizer'"),
    ("data-dataset", ("data", "dataset"), "mnist", "data.dataset: must be one of"),
    ("data-batch_size-zero", ("data", "batch_size"), 0, "data.batch_size: must be >= 1"),
    ("data-w_fraction-above-1", ("data", "w_fraction"), 1.5, "data.w_fraction: must be in"),
    ("data-val_fraction-negative", ("data", "val_fraction"), -0.1, "data.val_fraction"),
    ("data-limit-zero", ("data", "limit"), 0, "data.limit: must be >= 1"),
    ("data-unknown-key", ("data", "shuffle"), True, "unknown key 'shuffle'"),
    ("data-cifar-without-root", ("data", "dataset"), "cifar10", "data.root: required"),
    ("data-root-number", ("data", "root"), 5, "data.root: expected a string"),
    ("data-not-mapping", ("data",), "digits", "data: expected a mapping"),
    ("latency-cost", ("latency", "cost"), "energy", "latency.cost: must be one of"),
    ("latency-threads-zero", ("latency", "threads"), 0, "latency.threads: must be >= 1"),
    ("latency-batch-negative", ("latency", "batch"), -1, "latency.batch: must be >= 1"),
    ("latency-dtype", ("latency", "dtype"), "int8", "latency.dtype: must be one of"),
    ("latency-device", ("latency", "device"), "tpu", "latency.device: must be one of"),
    ("latency-unknown-key", ("latency", "file"), "t.json", "unknown key 'file'"),
    ("latency-table-number", ("latency", "table"), 5, "latency.table: expected a string"),
    ("loss-kind", ("loss", "kind"), "focal", "loss.kind: must be one of"),
    ("loss-alpha-negative", ("loss", "alpha"), -0.5, "loss.alpha: must be > 0"),
    ("loss-alpha-zero", ("loss", "alpha"), 0, "loss.alpha: must be > 0"),
    ("loss-beta-zero", ("loss", "beta"), 0, "loss.beta: must be > 0"),
    ("loss-beta-negative", ("loss", "beta"), -1.0, "loss.beta: must be > 0"),
    ("loss-alpha-string", ("loss", "alpha"), "big", "loss.alpha: expected a number"),
    ("loss-alpha-nan", ("loss", "alpha"), float("nan"), "loss.alpha: must be finite"),
    ("loss-alpha-huge-integer", ("loss", "alpha"), 10**400, "loss.alpha: must be finite"),
    ("loss-unknown-key", ("loss", "target"), 100, "unknown key 'target'"),
    ("loss-normalized-without-target", ("loss",), {"kind": "normalized"},
     "loss: missing key 'target'"),
    ("loss-normalized-target-1", ("loss",), {"kind": "normalized", "target": 1},
     "loss.target: must be > 1"),
    ("loss-additive-lambda-negative", ("loss",), {"kind": "additive", "target": 100,
                                                  "lambda": -1}, "loss.lambda: must be >= 0"),
    ("loss-label_smoothing", ("loss", "label_smoothing"), 1.5, "loss.label_smoothing"),
    ("loss-not-mapping", ("loss",), [1], "loss: expected a mapping"),
    ("search-epochs-zero", ("search", "epochs"), 0, "search.epochs: must be >= 1"),
    ("search-epochs-string", ("search", "epochs"), "two", "search.epochs: expected an integer"),
    ("search-epochs-float", ("search", "epochs"), 2.5, "search.epochs: expected an integer"),
    ("search-tau0-zero", ("search", "tau0"), 0, "search.tau0: must be > 0"),
    ("search-tau0-negative", ("search", "tau0"), -1, "search.tau0: must be > 0"),
    ("search-warmup-no-theta-epochs", ("search", "warmup_epochs"), 2, "leaves no θ epochs"),
    ("search-tau_min-above-tau0", ("search", "tau_min"), 10, "search.tau_min"),
    ("search-w_momentum", ("search", "w_momentum"), 2, "search.w_momentum: must be <= 1"),
    ("search-nan_policy", ("search", "nan_policy"), "ignore", "search.nan_policy"),
    ("search-device", ("search", "device"), "tpu", "search.device: must be one of"),
    ("search-grad_clip-negative", ("search", "grad_clip"), -1, "search.grad_clip: must be > 0"),
    ("search-seed-negative", ("search", "seed"), -1, "search.seed: must be >= 0"),
    ("search-tau_schedule", ("search", "tau_schedule"), "cosine", "search.tau_schedule"),
    ("search-w_lr-inf", ("search", "w_lr"), float("inf"), "search.w_lr: must be finite"),
    ("search-unknown-key", ("search", "epoch"), 3, "unknown key 'epoch'"),
    ("search-not-mapping", ("search",), 3, "search: expected a mapping"),
    ("retrain-epochs-zero", ("retrain", "epochs"), 0, "retrain.epochs: must be >= 1"),
    ("retrain-optimizer", ("retrain", "optimizer"), "adam", "retrain.optimizer: must be one of"),
    ("retrain-lr-zero", ("retrain", "lr"), 0, "retrain.lr: must be > 0"),
    ("retrain-lr_min-above-lr", ("retrain", "lr_min"), 1.0, "retrain.lr_min"),
    ("retrain-warmup-not-below-epochs", ("retrain", "warmup_epochs"), 1,
     "retrain.warmup_epochs"),
    ("retrain-label_smoothing", ("retrain", "label_smoothing"), 2, "retrain.label_smoothing"),
    ("retrain-unknown-key", ("retrain", "batch_size"), 8, "unknown key 'batch_size'"),
    ("run-checkpoint_every_steps-negative", ("run", "checkpoint_every_steps"), -1,
     "run.checkpoint_every_steps: must be >= 0"),
    ("run-dir-number", ("run", "dir"), 5, "run.dir: expected a string"),
    ("run-tensorboard-string", ("run", "tensorboard"), "yes",
     "run.tensorboard: expected true or false"),
    ("run-unknown-key", ("run", "resume"), True, "unknown key 'resume'"),
]
for _id, _path, _value, _says in CONFIG_VALUES:
    def _setup(w, d, path=_path, value=_value, says=_says):
        c = config_file(w, d, lambda c: _set(c, path, value))
        return _s("train", "--config", c), [str(c), says]
    add(f"config-{_id}", _setup)

# A section of the wrong type that happens to be falsy ([], 0, false, "") is read as an empty
# section, so every default applies silently. Driven through `fbnas eval --config`, which reads
# the whole config and then only evaluates, so that the accepted config costs a second, not a
# search with the default 90 epochs.
FALSY_SECTIONS = [("data", []), ("latency", 0), ("loss", []), ("search", False),
                  ("retrain", ""), ("run", [])]
for _section, _value in FALSY_SECTIONS:
    def _setup(w, d, section=_section, value=_value):
        c = config_file(w, d, lambda c: c.update({section: value}))
        return (_s("eval", "--checkpoint", w.retrain, "--config", c),
                [str(c), f"{section}: expected a mapping"])
    add(f"config-{_section}-falsy-wrong-type", _setup)

SET_CASES = [
    ("unknown-section", "serach.epochs=1", "unknown section 'serach'", None),
    ("no-equals", "search.epochs", "expected key=value", None),
    ("index-out-of-range", "space.stages.9.channels=1", "index 9 out of range", None),
    ("bad-value", "search.epochs=many", "search.epochs: expected an integer", None),
    ("name-into-list", "space.stages.first.channels=3", "space.stages", None),
    ("unreadable-date", "search.epochs=2001-13-45", "search.epochs", None),
    ("deep-value", "search.epochs=" + "[" * 1000, "search.epochs", None),
    # a --set mistake is said of the --set, with the nearest key
    ("unknown-key-near-one", "search.epochz=3", "--set search.epochz=3: search: unknown key "
     "'epochz' (did you mean 'epochs'?)", None),
]
for _id, _item, _says, _mark in SET_CASES:
    def _setup(w, d, item=_item, says=_says):
        return _s("train", "--config", config_file(w, d), "--set", item), [says]
    add(f"config-set-{_id}", _setup, marks=() if _mark is None else _mark)


# ---- the wrong kind of file, named as such, with the command that reads it -----------------
@case("an-architecture-given-as-a-config-via-train")
def _(w, d):
    return _s("train", "--config", w.arch), [str(w.arch), "an architecture file (fbnas arch "
                                                           "reads it), not a config"]


@case("an-architecture-given-as-a-config-via-space")
def _(w, d):
    return _s("space", w.arch), [str(w.arch), "an architecture file (fbnas arch reads it)"]


@case("a-config-given-as-an-architecture-via-arch")
def _(w, d):
    return _s("arch", w.config), [str(w.config), "it is a config (fbnas train --config reads it)"]


@case("a-yaml-config-given-as-a-table-via-latency-show")
def _(w, d):
    return _s("latency", "show", w.config), [str(w.config), "it is YAML", "not JSON"]


@pytest.mark.parametrize("argv", [["space"], ["train", "--config"]])
def test_a_misspelt_section_reads_the_same_in_every_command(world, tmp_path, argv, capsys):
    p = tmp_path / "c.yaml"
    p.write_text(world.config.read_text().replace("space:", "spaec:", 1))
    assert main([*argv, str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{p}: unknown section 'spaec' (did you mean 'space'?)"), err


# ---- 4. architecture contents, via `fbnas arch` -----------------------------------------------
def _arch_dict(w: World) -> dict:
    return yaml.safe_load(w.arch.read_text())


ARCH_VALUES = [
    ("schema-missing", ("fbnas_arch",), DELETE, "missing key 'fbnas_arch'"),
    ("schema-newer", ("fbnas_arch",), 2, "newer fbnas"),
    ("schema-older", ("fbnas_arch",), 0, "re-export"),
    ("schema-string", ("fbnas_arch",), "1", "fbnas_arch: expected an integer"),
    ("unknown-key", ("colour",), "red", "unknown key 'colour'"),
    ("name-number", ("name",), 5, "name: expected a string"),
    ("hash-number", ("hash",), 5, "hash: expected a string"),
    ("macro-missing", ("macro",), DELETE, "missing key 'macro'"),
    ("macro-num_classes-zero", ("macro", "num_classes"), 0, "macro.num_classes: must be >= 1"),
    ("macro-stages-empty", ("macro", "stages"), [], "macro.stages: must not be empty"),
    ("macro-input_size-string", ("macro", "input_size"), "big", "macro.input_size"),
    ("macro-stride-beyond-input", ("macro", "stages", 1, "stride"), 16, "stride 16 on a 8x8"),
    ("macro-unknown-key", ("macro", "depth"), 3, "unknown key 'depth'"),
    ("ops-missing", ("ops",), DELETE, "missing key 'ops'"),
    ("ops-not-list", ("ops",), "skip", "ops: expected a list"),
    ("ops-stage-count", ("ops",), [["skip"]], "ops: 1 stage lists for 2 stages"),
    ("ops-stage-length", ("ops", 0), ["skip", "skip"], "ops[0]: expected a list of 1 ops"),
    ("ops-bad-op", ("ops", 0, 0), "ir_k4_e1", "ops[0][0] (layer 0): op 'ir_k4_e1'"),
    ("ops-op-number", ("ops", 1, 0), 42, "ops[1][0] (layer 1)"),
    ("ops-op-unprintable", ("ops", 0, 0), "skip\u2028x", "ops[0][0] (layer 0)"),
    ("meta-list", ("meta",), [1], "meta: expected a mapping"),
    ("meta-run-number", ("meta",), {"run": 5}, "meta.run: expected a string"),
    ("meta-predicted-text", ("meta",), {"predicted": "fast"}, "meta.predicted: expected a number"),
]
for _id, _path, _value, _says in ARCH_VALUES:
    def _setup(w, d, path=_path, value=_value, says=_says):
        a = _arch_dict(w)
        _set(a, path, value)
        p = _write_yaml(d / "a.yaml", a)
        return _s("arch", p), [str(p), says]
    add(f"arch-{_id}", _setup)


# ---- 5. cost table contents, via `fbnas latency show` ------------------------------------------
def _table_dict(w: World) -> dict:
    return json.loads(w.lat.read_text())


def _first(t: dict) -> str:
    return next(iter(t["entries"]))


TABLE_CHANGES: list[tuple[str, Callable[[dict], None], str]] = [
    ("schema-missing", lambda t: t.pop("fbnas_cost_table"), "missing key 'fbnas_cost_table'"),
    ("schema-newer", lambda t: t.update(fbnas_cost_table=2), "newer fbnas"),
    ("schema-older", lambda t: t.update(fbnas_cost_table=0), "latency build"),
    ("schema-string", lambda t: t.update(fbnas_cost_table="1"), "expected an integer"),
    ("unknown-key", lambda t: t.update(colour="red"), "unknown key 'colour'"),
    ("cost", lambda t: t.update(cost="energy"), "cost: must be one of"),
    ("unit", lambda t: t.update(unit="ms"), "unit: a latency table is in 'us'"),
    ("meta-missing", lambda t: t.pop("meta"), "missing key 'meta'"),
    ("meta-list", lambda t: t.update(meta=[1]), "meta: expected a mapping"),
    ("meta-batch-missing", lambda t: t["meta"].pop("batch"), "meta: missing key 'batch'"),
    ("meta-batch-string", lambda t: t["meta"].update(batch="one"),
     "meta.batch: expected an integer"),
    ("meta-threads-zero", lambda t: t["meta"].update(threads=0), "meta.threads: must be >= 1"),
    ("meta-memory_format", lambda t: t["meta"].update(memory_format="nhwc"),
     "meta.memory_format"),
    ("entries-missing", lambda t: t.pop("entries"), "missing key 'entries'"),
    ("entries-list", lambda t: t.update(entries=[1]), "entries: expected a mapping"),
    ("entry-key-mismatch", lambda t: t["entries"].update(
        {"bogus": t["entries"].pop(_first(t))}), "key does not match its signature"),
    ("entry-value-negative", lambda t: t["entries"][_first(t)].update(value=-1.0),
     "value: must be >= 0"),
    ("entry-value-string", lambda t: t["entries"][_first(t)].update(value="fast"),
     "value: expected a number"),
    ("entry-value-nan", lambda t: t["entries"][_first(t)].update(value=float("nan")),
     "value: must be finite"),
    ("entry-value-missing", lambda t: t["entries"][_first(t)].pop("value"),
     "missing key 'value'"),
    ("entry-unknown-key", lambda t: t["entries"][_first(t)].update(note="x"),
     "unknown key 'note'"),
    ("entry-stats-string", lambda t: t["entries"][_first(t)].update(stats={"ratio": "x"}),
     "stats.ratio: expected a number"),
    ("sig-missing", lambda t: t["entries"][_first(t)].pop("sig"), "missing key 'sig'"),
    ("sig-kind", lambda t: t["entries"][_first(t)]["sig"].update(kind="tail"),
     "sig.kind: must be one of"),
    ("sig-c_in-zero", lambda t: t["entries"][_first(t)]["sig"].update(c_in=0),
     "sig.c_in: must be >= 1"),
    ("calibration-list", lambda t: t.update(calibration=[1, 2]),
     "calibration: expected a mapping or null"),
    ("calibration-without-a", lambda t: t.update(calibration={"b": 1.0}),
     "calibration: missing key 'a'"),
    ("corrections-rows", lambda t: t.update(corrections={"a": 1, "b": 0, "rows": "x",
                                                         "space_hash": "h"}),
     "corrections.rows"),
    ("corrections-no-space_hash", lambda t: t.update(corrections={"a": 1, "b": 0, "rows": []}),
     "space_hash"),
    ("reference-scale-string", lambda t: t.update(reference={"scale_us": "x"}),
     "reference.scale_us: expected a number"),
    ("context-scale-string", lambda t: t.update(context={"scale": "x"}),
     "context.scale: expected a number"),
    ("context-exponent-negative", lambda t: t.update(context={"scale": 1.2, "exponent": -1}),
     "context.exponent: must be a finite number >= 0"),
    ("context-probe-nets-negative", lambda t: t.update(context={"scale": 1.2, "probes": 2,
                                                                "probe_nets": [1.0, -2]}),
     "context.probe_nets: expected a list of positive numbers"),
    ("noise-string", lambda t: t.update(noise={"median_rel_iqr": "x"}), "noise.median_rel_iqr"),
    ("protocol-rounds-string", lambda t: t.update(protocol={"rounds": "many"}),
     "protocol.rounds: expected an integer"),
]


def _block_entry(t: dict) -> str:
    return next(k for k, e in t["entries"].items() if e["sig"]["kind"] == "block")


TABLE_CHANGES += [
    ("sig-op-not-canonical", lambda t: t["entries"][_block_entry(t)]["sig"].update(op="k3_e1"),
     "is not canonical"),
    ("sig-op-unknown", lambda t: t["entries"][_block_entry(t)]["sig"].update(op="conv_magic"),
     "unknown op 'conv_magic'"),
]
for _id, _change, _says in TABLE_CHANGES:
    def _setup(w, d, change=_change, says=_says):
        t = _table_dict(w)
        change(t)
        p = _write_json(d / "t.json", t)
        return _s("latency", "show", p), [str(p), says]
    add(f"table-{_id}", _setup)


# ---- 6. results.json contents, via `fbnas runs FILE` --------------------------------------------
RESULTS_CHANGES = [
    ("not-fbnas", lambda r: r.pop("fbnas_results"), "not an fbnas results file"),
    ("schema-newer", lambda r: r.update(fbnas_results=3), "newer fbnas"),
    ("schema-bool", lambda r: r.update(fbnas_results=True), "fbnas_results is True"),
    ("top1-string", lambda r: r.update(top1="high"), "'top1' must be a number"),
    ("arch-hash-number", lambda r: r["arch"].update(hash=5), "'arch.hash' must be a string"),
    ("arch-ops-numbers", lambda r: r["arch"].update(ops=[1, 2]), "'arch.ops'"),
    ("sweep-list", lambda r: r.update(sweep=[1]), "'sweep' must be an object"),
    ("space-number", lambda r: r.update(space=5), "'space' must be a string"),
]
for _id, _change, _says in RESULTS_CHANGES:
    def _setup(w, d, change=_change, says=_says):
        r = json.loads((w.retrain / "results.json").read_text())
        change(r)
        p = _write_json(d / "r" / "results.json", r)
        return _s("runs", p), [str(p), says]
    add(f"results-{_id}", _setup)


# ---- 7. files that are fine alone but wrong together -------------------------------------------
@case("arch-from-another-space-via-arch-space")
def _(w, d):
    return _s("arch", w.other_arch, "--config", w.config), [str(w.other_arch),
                                                           "macro.stages", "search space 'tiny'"]


@case("arch-op-not-a-candidate-via-arch-space")
def _(w, d):
    a = _arch_dict(w)
    a["ops"][0] = ["ir_k7_e6"]
    p = _write_yaml(d / "a.yaml", a)
    return _s("arch", p, "--config", w.config), [str(p), "layer 0 op 'ir_k7_e6' is not a "
                                                       "candidate of search space 'tiny'"]


@case("arch-from-another-space-via-latency-predict-config")
def _(w, d):
    return (_s("latency", "predict", "--arch", w.other_arch, "--table", w.lat, "--config",
               w.config), [str(w.other_arch), "macro.stages"])


@case("arch-from-another-space-via-latency-predict-table")
def _(w, d):
    return (_s("latency", "predict", "--arch", w.other_arch, "--table", w.lat),
            [str(w.lat), "signature(s) the table lacks", "fbnas latency build"])


@case("arch-from-another-space-via-retrain-init-from-supernet")
def _(w, d):
    return (_s("retrain", "--arch", w.other_arch, "--config", config_file(w, d),
               "--init-from-supernet", w.run, "--out", d / "rt"),
            [str(w.run / "checkpoint.pt"), "macro.stages", "search space 'tiny'"])


@case("arch-other-than-the-run-via-retrain-resume")
def _(w, d):
    rt = copy_run(w.retrain, d / "rt")
    return (_s("retrain", "--resume", rt, "--arch", w.other_arch),
            [str(rt / "checkpoint.pt"), "trains architecture"])


@case("child-checkpoint-weights-of-another-arch-via-eval")
def _(w, d):
    rt = copy_run(w.retrain, d / "rt")
    other = yaml.safe_load(w.other_arch.read_text())
    _resave(rt / "checkpoint.pt", lambda s: s.update(arch=other))
    return (_s("eval", "--checkpoint", rt, "--json", d / "e.json"),
            [str(rt / "checkpoint.pt"), "weights do not fit architecture"])


@case("child-checkpoint-bad-embedded-arch-via-export")
def _(w, d):
    rt = copy_run(w.retrain, d / "rt")
    _resave(rt / "checkpoint.pt", lambda s: s["arch"].update(fbnas_arch=7))
    return (_s("export", "--checkpoint", rt, "--format", "torchscript", "--out", d / "exp"),
            [str(rt / "checkpoint.pt"), "arch.fbnas_arch", "newer fbnas"])


@case("search-checkpoint-of-another-space-via-train-resume")
def _(w, d):
    run = copy_run(w.run, d / "run")
    return (_s("train", "--resume", run, "--config", w.other_config),
            [str(run / "checkpoint.pt"), "another search space", "space.stages"])


@case("search-checkpoint-of-another-space-in-the-run-dir-via-train-resume")
def _(w, d):
    """Another space's config saved in the run folder (a copied or mixed-up run)."""
    run = copy_run(w.run, d / "run")
    other = yaml.safe_load(w.other_config.read_text())
    other["run"]["dir"] = str(run)
    _write_yaml(run / "config.yaml", other)
    return _s("train", "--resume", run), [str(run / "checkpoint.pt"), "another search space"]


@case("search-checkpoint-theta-of-another-space-via-sample")
def _(w, d):
    run = copy_run(w.run, d / "run")
    _resave(run / "checkpoint.pt", lambda s: s["model"].update({"theta.1": torch.zeros(7)}))
    return _s("sample", run), [str(run / "checkpoint.pt"), "model.theta.1"]


@case("search-checkpoint-bad-config-via-sample")
def _(w, d):
    run = copy_run(w.run, d / "run")
    _resave(run / "checkpoint.pt", lambda s: s["config"]["search"].update(tau0=-1.0))
    return _s("sample", run), [str(run / "checkpoint.pt"), "search.tau0: must be > 0"]


@case("search-run-without-config-via-train-resume")
def _(w, d):
    run = copy_run(w.run, d / "run")
    (run / "config.yaml").unlink()
    return _s("train", "--resume", run), [str(run), "no config.yaml there"]


@case("search-run-config-changed-via-train-resume")
def _(w, d):
    run = copy_run(w.run, d / "run")
    return (_s("train", "--resume", run, "--set", "search.w_lr=0.5"),
            [str(run / "checkpoint.pt"), "search.w_lr was 0.1 in this run, now 0.5"])


def _lat_meta(w: World, d: Path, **meta) -> Path:
    t = _table_dict(w)
    t["meta"].update(meta)
    return _write_json(d / "t.json", t)


@case("table-of-another-batch-via-latency-measure")
def _(w, d):
    t = _lat_meta(w, d)
    return (_s("latency", "measure", "--arch", w.arch, "--table", t, "--device", "fake",
               "--batch", "4", "--json", d / "m.json"), [str(t), "meta.batch is 1", "4"])


@case("table-of-another-dtype-via-latency-measure")
def _(w, d):
    t = _lat_meta(w, d, dtype="float16")
    return (_s("latency", "measure", "--arch", w.arch, "--table", t, "--device", "fake",
               "--dtype", "float32", "--json", d / "m.json"),
            [str(t), "meta.dtype is 'float16'", "'float32'"])


@case("table-of-another-device-via-latency-measure")
def _(w, d):
    t = _lat_meta(w, d, backend="cuda")
    return (_s("latency", "measure", "--arch", w.arch, "--table", t, "--device", "fake",
               "--json", d / "m.json"), [str(t), "meta.backend is 'cuda'", "'fake'"])


@case("table-of-another-batch-via-latency-build-extend")
def _(w, d):
    t = _lat_meta(w, d)
    return (_s("latency", "build", "--config", w.config, "--table", t, "--device", "fake",
               "--batch", "4", "--probes", "0"), [str(t), "meta.batch is 1", "4"])


@case("table-of-another-device-via-latency-build-extend")
def _(w, d):
    t = _lat_meta(w, d, device_name="another machine")
    return (_s("latency", "build", "--config", w.config, "--table", t, "--device", "fake",
               "--probes", "0"), [str(t), "meta.device_name is 'another machine'"])


@case("table-of-another-cost-via-latency-build")
def _(w, d):
    t = _lat_meta(w, d)
    return (_s("latency", "build", "--config", w.config, "--cost", "flops", "--table", t),
            [str(t), "holds a latency table, but --cost is flops"])


@case("table-of-another-batch-via-train")
def _(w, d):
    t = _lat_meta(w, d, batch=8)
    return _train_with_table(w, d, t), [str(t), "meta.batch is 8", "1"]


@case("table-of-another-cost-via-train")
def _(w, d):
    return _train_with_table(w, d, w.flops), [str(w.flops), "is a flops table",
                                               "latency.cost is 'latency'"]


@case("table-of-another-space-via-train")
def _(w, d):
    def mutate(c):
        c["space"] = yaml.safe_load(w.other_config.read_text())["space"]
        c["latency"] = {"cost": "latency", "table": str(w.lat), "device": "fake"}
    return (_s("train", "--config", config_file(w, d, mutate)),
            [str(w.lat), "missing", "fbnas latency build"])


@case("table-of-another-space-via-latency-validate")
def _(w, d):
    return (_s("latency", "validate", "--config", w.other_config, "--table", w.lat, "--device",
               "fake", "--json", d / "r.json"), [str(w.lat), "signature(s) of search space",
                                                    "missing"])


# ---- 8. dataset roots ---------------------------------------------------------------------------
def _eval_on(w: World, d: Path, dataset: str, root: Path) -> list:
    return _s("eval", "--checkpoint", w.retrain, "--set", f"data.dataset={dataset}",
              "--set", f"data.root={root}", "--json", d / "e.json")


def _imagefolder(d: Path, train: dict[str, int] | None, val: dict[str, int] | None) -> Path:
    root = d / "images"
    root.mkdir()
    for part, classes in (("train", train), ("val", val)):
        if classes is None:
            continue
        (root / part).mkdir()
        for name, n in classes.items():
            (root / part / name).mkdir()
            for i in range(n):
                (root / part / name / f"{i}.png").write_bytes(b"")
    return root


def _dir(p: Path) -> Path:
    p.mkdir()
    return p


def _file(p: Path) -> Path:
    p.write_text("x")
    return p


ROOT_KEY = "retrain: config: data.root: "  # the checkpoint's config, as `fbnas eval` reads it
DATA_ROOTS = [
    # (id, dataset, make the root, what the error line says)
    ("cifar10-root-missing", "cifar10", lambda d: d / "nope", [ROOT_KEY, "nope: no such folder"]),
    ("cifar10-root-empty", "cifar10", lambda d: _dir(d / "empty"),
     [ROOT_KEY, "empty holds no CIFAR10 data"]),
    ("cifar10-root-is-a-file", "cifar10", lambda d: _file(d / "f"), [ROOT_KEY, "is not a folder"]),
    ("cifar100-root-empty", "cifar100", lambda d: _dir(d / "empty"),
     [ROOT_KEY, "holds no CIFAR100 data"]),
    ("imagefolder-root-missing", "imagefolder", lambda d: d / "nope",
     [ROOT_KEY, "nope: no such folder"]),
    ("imagefolder-root-empty", "imagefolder", lambda d: _imagefolder(d, None, None),
     [ROOT_KEY, "images has no train/ folder"]),
    ("imagefolder-no-val", "imagefolder", lambda d: _imagefolder(d, {"a": 1}, None),
     [ROOT_KEY, "has no val/ folder"]),
    ("imagefolder-no-classes", "imagefolder", lambda d: _imagefolder(d, {}, {}),
     [ROOT_KEY, "images/train", "class folder"]),
    ("imagefolder-class-without-images", "imagefolder",
     lambda d: _imagefolder(d, {"a": 0}, {"a": 1}), [ROOT_KEY, "images/train"]),
    ("imagefolder-classes-differ", "imagefolder",
     lambda d: _imagefolder(d, {"a": 1, "b": 1}, {"a": 1, "c": 1}),
     [ROOT_KEY, "different classes", "b, c"]),
    ("imagefolder-wrong-class-count", "imagefolder",
     lambda d: _imagefolder(d, {"a": 1, "b": 1}, {"a": 1, "b": 1}),
     ["data.dataset: imagefolder has 2 classes", "num_classes=10"]),
]
for _id, _dataset, _make, _says in DATA_ROOTS:
    def _setup(w, d, dataset=_dataset, make=_make, says=_says):
        return _eval_on(w, d, dataset, make(d)), says
    add(f"data-{_id}-via-eval", _setup)


@case("data-cifar10-root-missing-via-train")
def _(w, d):
    def mutate(c):
        c["data"].update(dataset="cifar10", root=str(d / "nope"))
        c["space"]["in_channels"] = 3
    c = config_file(w, d, mutate)
    return _s("train", "--config", c), [str(c), "data.root", "no such folder"]


@case("data-imagefolder-root-empty-via-retrain")
def _(w, d):
    root = _imagefolder(d, None, None)

    def mutate(c):
        c["data"].update(dataset="imagefolder", root=str(root))
    c = config_file(w, d, mutate)
    return (_s("retrain", "--arch", w.arch, "--config", c, "--out", d / "rt"),
            [str(c), "data.root", "has no train/ folder"])


@case("config-section-repeated-via-train")
def _(w, d):
    """A second `search:` section would silently replace the first."""
    p = d / "c.yaml"
    p.write_bytes(config_file(w, d).read_bytes() + b"search: {epochs: 1}\n")
    return _s("train", "--config", p), [str(p), "key 'search' repeats the one on line"]


@case("arch-key-repeated-via-arch")
def _(w, d):
    p = d / "a.yaml"
    p.write_bytes(w.arch.read_bytes() + b"name: again\n")
    return _s("arch", p), [str(p), "key 'name' repeats the one on line 2"]


@case("config-date-that-does-not-exist-via-train")
def _(w, d):
    """A plain `2001-13-45` is a YAML date, and not a valid one."""
    p = d / "c.yaml"
    p.write_bytes(config_file(w, d).read_bytes() + b"x: 2001-13-45\n")
    return _s("train", "--config", p), [str(p), "malformed YAML", "month must be in 1..12"]


@case("config-integer-of-5000-digits-via-train")
def _(w, d):
    c = config_file(w, d)
    p = d / "c.yaml"
    p.write_text(c.read_text().replace("epochs: 2", "epochs: " + "9" * 5000, 1))
    return _s("train", "--config", p), [str(p), "malformed YAML", "4300 digits"]


@case("config-integer-of-40-digits-via-train")
def _(w, d):
    c = config_file(w, d, lambda c: c["search"].update(epochs=10**40))
    return _s("train", "--config", c), [str(c), "search.epochs: must be <=",
                                        "<an integer of about 41 digits>"]


# ---- 9. code in data files is never run ---------------------------------------------------------
PYTHON_TAG = b'!!python/object/apply:os.system ["touch PWNED"]'


@case("config-python-object-tag-via-train")
def _(w, d):
    p = d / "c.yaml"
    p.write_bytes(config_file(w, d).read_bytes() + b"\nextra: " + PYTHON_TAG + b"\n")
    return _s("train", "--config", p), [str(p), "malformed YAML", "python/object"]


@case("arch-python-object-tag-via-arch")
def _(w, d):
    p = d / "a.yaml"
    p.write_bytes(b"fbnas_arch: " + PYTHON_TAG + b"\n" + w.arch.read_bytes())
    return _s("arch", p), [str(p), "malformed YAML", "python/object"]


# ---- the default run's sample of the matrix -------------------------------------------------
# The fast tier runs the first case (in the order above) that adds a command, a fault or a file
# not yet covered: one case at least per command, per fault kind and per file (and per group
# of keys of a file's contents); the whole matrix runs in the slow tier (`pytest -m slow -n 0`).
FAULTS = {*_text_faults("yaml"), *_ckpt_faults(lambda w: w.run)}


def _features(case_id: str) -> set[str]:
    what, _, via = case_id.partition("-via-")
    if not via:  # one file's contents through the command that reads them
        return {"contents:" + "-".join(what.split("-")[:2])}
    fault = next((f for f in FAULTS if what.endswith("-" + f)), None)
    if fault is None:  # files fine alone but wrong together, dataset roots
        file = "-".join(what.split("-")[:2]) if what.startswith("data-") else what.split("-")[0]
        return {"command:" + via, "file:" + file + " (pair)"}
    return {"command:" + via, "fault:" + fault, "file:" + what[:-len(fault) - 1]}


_covered: set[str] = set()
for _i, _p in enumerate(CASES):
    _new = _features(_p.id) - _covered
    _covered |= _new
    if not _new:
        CASES[_i] = pytest.param(*_p.values, id=_p.id, marks=(*_p.marks, pytest.mark.slow))


# ---- the runner -----------------------------------------------------------------------------
def snapshot(root: Path) -> dict[str, tuple]:
    """Every file and folder under `root`: kind, size, mtime and (below 8 MB) content hash."""
    out: dict[str, tuple] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", str(p.readlink()))
        elif p.is_dir():
            out[rel] = ("dir",)
        else:
            st = p.stat()
            digest = (hashlib.sha256(p.read_bytes()).hexdigest() if st.st_size < 8 << 20
                      else None)
            out[rel] = ("file", st.st_size, st.st_mtime_ns, digest)
    return out


def _close_run_loggers(under: Path) -> None:
    """A trainer that failed in its constructor leaves its run logger open; close it."""
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if not name.startswith("fbnas.training") or not isinstance(lg, logging.Logger):
            continue
        for h in list(lg.handlers):
            if str(getattr(h, "baseFilename", "")).startswith(str(under)):
                h.close()
                lg.removeHandler(h)


@pytest.mark.parametrize("bad", CASES)
def test_bad_input_is_one_clear_line_and_writes_nothing(bad: Case, world, tmp_path,
                                                        monkeypatch, capsys):
    d = tmp_path / "case"
    d.mkdir()
    monkeypatch.chdir(d)  # relative default outputs land in the snapshot
    monkeypatch.setenv("HOME", str(d))  # and so would ~/.cache/fbnas
    argv, says = bad.setup(world, d)
    before, world_before = snapshot(d), snapshot(world.dir)
    capsys.readouterr()
    try:
        rc = main(argv)
    finally:
        _close_run_loggers(d)
    out, err = capsys.readouterr()
    assert rc == 2, f"{argv}: exit status {rc}; stderr: {err}"
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), f"not one line: {err!r}"
    line = lines[0]
    # "fbnas COMMAND: error: " or "fbnas COMMAND ACTION: error: "
    assert line.startswith(f"fbnas {argv[0]}") and ": error: " in line, line
    assert line.split(": error: ")[0].count(" ") <= 2, line
    for s in says:
        assert s in line, f"{s!r} not in {line!r}"
    assert snapshot(world.dir) == world_before, "the shared fixture changed"
    after = snapshot(d)
    assert after == before, (f"files changed: "
                             f"{sorted(set(after.items()) ^ set(before.items()))}")


def test_case_count():
    """The matrix is as large as the docs say (docs/robustness.md)."""
    assert len(CASES) >= 400


# ---- not a CLI failure, but part of the contract --------------------------------------
def test_a_damaged_results_file_inside_a_dir_is_a_warning_not_an_error(world, tmp_path,
                                                                       capsys):
    """`fbnas runs DIR` lists what it can read and warns (one line each) about the rest."""
    good = tmp_path / "runs" / "good"
    shutil.copytree(world.retrain, good)
    bad = tmp_path / "runs" / "bad" / "results.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"fbnas_results": 2, "top1": ')
    capsys.readouterr()
    assert main(["runs", str(tmp_path / "runs")]) == 0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and str(bad) in err and "warning" in err
    assert "good" in out


def test_a_yaml_bom_and_windows_line_ends_are_fine(world, tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"\xef\xbb\xbf" + world.config.read_bytes().replace(b"\n", b"\r\n"))
    assert main(["space", str(p)]) == 0


def test_only_safe_loaders_are_used():
    """The safe-loading audit (docs/robustness.md): YAML through yaml.safe_load only, torch
    files through torch.load(weights_only=True) only, no pickle / marshal / eval / exec; the
    exceptions are torch.jit.load in fbnas/backends/torchscript.py, for TorchScript files, and
    torch.export.load in fbnas/backends/pt2.py, for .pt2 programs a user asks to time or fbnas
    export wrote (code the user trusts)."""

    src = Path(__file__).parents[1] / "fbnas"
    banned = [r"yaml\.(load|unsafe_load|full_load|load_all|unsafe_load_all)\(",
              r"Loader\s*=(?!\s*yaml\.SafeLoader\))", r"\bpickle\b", r"\bmarshal\b",
              r"\bdill\b", r"\bshelve\b",
              r"(?<![\w.])(?<!def )eval\(", r"(?<![\w.])exec\(", r"allow_pickle\s*=\s*True",
              r"weights_only\s*=\s*False"]
    found = []
    for f in sorted(src.rglob("*.py")):
        text = f.read_text()
        for pat in banned:
            found += [f"{f.name}: {m.group(0)}" for m in re.finditer(pat, text)]
        for m in re.finditer(r"torch\.load\(([^)]*)\)", text):
            if "weights_only=True" not in m.group(1):
                found.append(f"{f.name}: {m.group(0)}")
        if "torch.jit.load(" in text and f.name != "torchscript.py":
            found.append(f"{f.name}: torch.jit.load")
        if "torch.export.load(" in text and f.name != "pt2.py":
            found.append(f"{f.name}: torch.export.load")
    assert not found, found
