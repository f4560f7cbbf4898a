"""Property tests: the file readers and the op-name parser on arbitrary input.

Whatever a YAML or JSON file holds, reading it either succeeds or raises FbnasError with a
one-line message — never a KeyError, TypeError, AttributeError, RecursionError, ... that would
reach the user as a traceback. Inputs are arbitrary values and arbitrary edits of valid files
(which get much deeper into the readers than random data does). What loads also round-trips.
"""

from __future__ import annotations

import atexit
import copy
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fbnas.arch import Architecture
from fbnas.blocks import build_block, canonical_op
from fbnas.config import config_from_dict
from fbnas.errors import FbnasError
from fbnas.io import load_json, load_yaml
from fbnas.latency import LatencyTable, space_signatures
from fbnas.runs.results import load_results
from fbnas.search_space import SearchSpace

FUZZ = settings(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fuzz(*strategies, examples: int = 50):
    """The decorated property checked on `examples` draws of `strategies` in the fast tier and
    on ten times as many in the slow tier (derandomized: the same draws every run)."""

    def wrap(prop):
        @pytest.mark.parametrize("n", [pytest.param(examples, id="fast"),
                                       pytest.param(10 * examples, id="deep",
                                                    marks=pytest.mark.slow)])
        def test(n):
            settings(FUZZ, max_examples=n)(given(*strategies)(prop))()

        test.__name__, test.__qualname__, test.__doc__ = prop.__name__, prop.__qualname__, \
            prop.__doc__
        test.__module__ = prop.__module__
        return test

    return wrap

SPACE = {
    "name": "tiny", "input_size": 8, "in_channels": 1, "num_classes": 10,
    "stem": {"channels": 8, "stride": 1, "kernel": 3},
    "candidates": ["ir_k3_e1", "ir_k5_e3_se", "skip"],
    "stages": [{"channels": 8, "repeats": 1, "stride": 1},
               {"channels": 16, "repeats": 2, "stride": 2,
                "candidates": ["ir_k3_e6", "ir_k33_e1_g2", "shift_5x5"]}],
    "head": {"channels": 16, "pool": "avg", "dropout": 0.1},
}
CONFIG = {
    "space": SPACE,
    "data": {"dataset": "synthetic", "batch_size": 8, "limit": 64, "val_fraction": 0.2},
    "latency": {"cost": "flops", "threads": 1, "batch": 1},
    "loss": {"kind": "fbnet", "alpha": 0.2, "beta": 0.6},
    "search": {"epochs": 3, "warmup_epochs": 1, "tau0": 5.0, "grad_clip": None},
    "retrain": {"epochs": 2, "warmup_epochs": 1, "optimizer": "adamw"},
    "run": {"dir": "runs/x", "checkpoint_every_steps": 5},
}


def _arch() -> dict:
    from fbnas.arch import arch_from_indices

    space = SearchSpace.from_dict(SPACE)
    return {**arch_from_indices(space, [0, 1, 2], "a").to_dict(), "meta": {"note": "x"}}


def _table() -> dict:
    space = SearchSpace.from_dict(SPACE)
    t = LatencyTable("latency", {"backend": "fake", "batch": 1, "dtype": "float32",
                                 "threads": 1, "memory_format": "contiguous"})
    for i, sig in enumerate(space_signatures(space)):
        t.add(sig, 10.0 + i, {"ratio": 1.5, "rel_iqr": 0.01})
    t.reference = {"signature": "x", "scale_us": 3.0}
    t.context = {"scale": 1.1, "probes": 2}
    t.calibration = {"a": 1.0, "b": 2.0, "n": 5}
    return t.to_dict()


ARCH, TABLE = _arch(), _table()
RESULTS = {"fbnas_results": 2, "kind": "retrain", "arch": {"name": "a", "hash": "ab" * 32,
                                                           "ops": ["skip"]},
           "top1": 0.5, "measured_us": 1.0, "sweep": {"label": "beta1"}}

# ---- strategies ------------------------------------------------------------------------------
# values at the edges of what the readers check: out of range, of another type, not finite,
# beyond float range, empty
def _huge() -> int:
    return -(10**5000)  # more digits than int() / repr() convert by default (4300)


NASTY = st.builds(_huge) | st.sampled_from([0, -1, 1, 2, 3, 10**400, 2**63, 2**64, 10**9,
                         float("nan"), float("inf"), -0.0, 0.5, 1e308, True, False, None, "",
                         "x", "1", [], {}, [[]], "skip", "ir_k3_e6", "k5_e1_g2", "latency",
                         "flops", "avg", "fbnet", "digits", "nan", "cuda"]).map(copy.deepcopy)
# (a copy each draw: an edit must not change the shared [] / {} of later examples)
SCALARS = (NASTY | st.booleans() | st.integers() | st.floats() | st.text(max_size=12))
JSON_KEYS = st.text(max_size=10) | st.sampled_from(["name", "channels", "stride", "value",
                                                     "kind", "op", "sig"])
YAML_KEYS = JSON_KEYS | st.integers(-3, 3) | st.booleans() | st.none() | st.floats()


def values(keys=YAML_KEYS):
    return st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(keys, inner, max_size=4), max_leaves=12)


def _paths(obj: Any, prefix: tuple = ()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@st.composite
def edited(draw, base: dict, keys=YAML_KEYS):
    """`base` with 1-3 random edits: a value replaced, a key deleted, a key added, a list
    emptied or lengthened."""
    d = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(d))))
        if not path:
            continue
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        last = path[-1]
        what = draw(st.sampled_from(["set", "set", "delete", "add", "grow"]))
        if what == "set":
            parent[last] = draw(NASTY | values(keys))
        elif what == "delete":
            del parent[last]
        elif what == "add" and isinstance(parent, dict):
            parent[draw(keys)] = draw(values(keys))
        elif what == "grow" and isinstance(parent[last], list):
            parent[last] = parent[last] * draw(st.integers(0, 3))
    return d


def only_fbnas_errors(fn, *args):
    """Call fn; an FbnasError (one line) is fine, any other exception fails the property."""
    try:
        return fn(*args)
    except FbnasError as e:
        assert len(str(e).splitlines()) <= 1, f"not one line: {str(e)!r}"
        return None


# every separator str.splitlines() knows, and a CRLF pair
LINE_BREAKS = ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
               "\u2029"]


@pytest.mark.parametrize("sep", LINE_BREAKS, ids=[repr(s) for s in LINE_BREAKS])
def test_fbnas_error_folds_every_line_break(sep):
    """A message built from a hostile file name or value is still one line."""
    msg = f"runs/evil{sep}name.yaml: key 'a{sep}b' must be >= 0, got 'x{sep}{sep}y'{sep}"
    text = str(FbnasError(msg))
    assert len(text.splitlines()) == 1, repr(text)
    assert text.startswith("runs/evil name.yaml: key 'a b'")


@fuzz(st.text(max_size=60))
def test_fbnas_error_is_always_one_line(msg):
    assert len(str(FbnasError(msg)).splitlines()) <= 1


# ---- files -----------------------------------------------------------------------------------
_TMP = Path(tempfile.mkdtemp(prefix="fbnas-fuzz-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


@fuzz(st.binary(max_size=300) | st.text(max_size=300).map(str.encode)
      | st.sampled_from([b"a: [1, 2", b"- x\n- y", b"&a [*a]", b"a: &x 1\nb: *x",
                         b"!!python/object:os.system x", b"{a: !!binary ZZZ}",
                         b"\xef\xbb\xbfa: 1", b"? [a, b]\n: c", b"a: 1\na: 2",
                         b"%YAML 9.9\n---\na: 1", b"a: 2001-13-45", b"a: !!int x",
                         b"a: !!float x", b"a: !!timestamp 2020-02-30", b"a: !!set {1, 2}",
                         b"a: " + b"9" * 5000, b'{"a": ' + b"9" * 5000 + b"}",
                         b'{"a": NaN, "b": -Infinity}', b"a: !!binary AAAA"]))
def test_load_yaml_and_load_json_raise_only_fbnas_errors(raw):
    p = _TMP / "f"
    p.write_bytes(raw)
    data = only_fbnas_errors(load_yaml, p)
    assert data is None or isinstance(data, dict)
    data = only_fbnas_errors(load_json, p)
    assert data is None or isinstance(data, dict)


@fuzz(values() | edited(SPACE))
def test_search_space_from_dict(data):
    space = only_fbnas_errors(SearchSpace.from_dict, data)
    if space is not None:
        again = SearchSpace.from_dict(space.to_dict())
        assert again == space and space.size() >= 1
        assert [la.index for la in space.layers()] == list(range(space.num_layers))


@fuzz(values() | edited(ARCH))
def test_architecture_from_dict(data):
    arch = only_fbnas_errors(Architecture.from_dict, data)
    if arch is not None:
        again = Architecture.from_dict(yaml.safe_load(yaml.safe_dump(arch.to_dict())))
        assert again.hash() == arch.hash() and again.ops == arch.ops


@fuzz(values(JSON_KEYS) | edited(TABLE, JSON_KEYS))
def test_latency_table_from_dict(data):
    try:
        json.dumps(data)
    except ValueError:  # tables come from JSON, which cannot hold a 5000-digit integer
        return
    table = only_fbnas_errors(LatencyTable.from_dict, data)
    if table is not None:
        again = LatencyTable.from_dict(json.loads(json.dumps(table.to_dict())))
        assert again.fingerprint() == table.fingerprint()
        space = SearchSpace.from_dict(SPACE)
        only_fbnas_errors(table.costs_for, space)
        only_fbnas_errors(table.check_run, 1, "float32", "contiguous", "fake")


@fuzz(values() | edited(CONFIG))
def test_config_from_dict(data):
    if not isinstance(data, dict):
        data = {"space": data}
    cfg = only_fbnas_errors(config_from_dict, data)
    if cfg is not None:
        assert config_from_dict(cfg.resolved()).resolved() == cfg.resolved()


@fuzz(values(JSON_KEYS) | edited(RESULTS, JSON_KEYS))
def test_load_results(data):
    p = _TMP / "results.json"
    try:
        p.write_text(json.dumps(data))
    except ValueError:  # a 5000-digit integer: load_json's own test covers such text
        return
    row = only_fbnas_errors(load_results, p)
    if row is not None:
        assert isinstance(row["arch"], dict)


# ---- every single edit of a valid file, systematically -------------------------------------
DELETE = object()


def _edge_values() -> list:
    return [0, -1, 1, 2, 10**400, -(10**5000), 2**63, 10**9, float("nan"), float("inf"), 0.5,
            1e308, True, None, "", "x", [], {}, [[]], [None], {"x": 1}, "skip", DELETE]


READERS = {
    "space": (SPACE, SearchSpace.from_dict),
    "arch": (ARCH, Architecture.from_dict),
    "table": (TABLE, LatencyTable.from_dict),
    "config": (CONFIG, config_from_dict),
    "results": (RESULTS, None),
}


@pytest.mark.parametrize("kind", list(READERS))
def test_every_single_edit_of_a_valid_file_raises_only_fbnas_errors(kind, tmp_path):
    """Each leaf and branch of a valid file replaced by each edge value (or deleted): the
    reader accepts it or raises FbnasError. About 40 paths x 23 values per kind."""
    base, reader = READERS[kind]
    if reader is None:  # results.json goes through the file
        def reader(d):
            p = tmp_path / "results.json"
            try:
                p.write_text(json.dumps(d))
            except ValueError:  # json cannot write a 5000-digit integer (load_json's test can)
                return None
            return load_results(p)
    n = 0
    for path in list(_paths(base))[1:]:
        for value in _edge_values():
            d = copy.deepcopy(base)
            parent = d
            for k in path[:-1]:
                parent = parent[k]
            if value is DELETE:
                del parent[path[-1]]
            else:
                parent[path[-1]] = copy.deepcopy(value)
            only_fbnas_errors(reader, d)
            n += 1
    assert n > 200


# ---- op names --------------------------------------------------------------------------------
TOKENS = ["ir", "k", "k1", "k3", "k5", "k7", "k9", "k33", "k55", "k0", "k4", "e", "e0", "e1",
          "e3", "e6", "e17", "g", "g2", "g3", "g4", "s2", "s4", "se", "sep", "x", "", "3",
          "skip", "shift", "5x5", "basic", "block", "١", "k٣"]
OP_NAMES = (st.text(max_size=40)
            | st.lists(st.sampled_from(TOKENS), max_size=6).map("_".join)
            | st.lists(st.sampled_from(TOKENS), max_size=5).map(lambda t: "ir_" + "_".join(t))
            | st.sampled_from(["skip", "shift", "ir_k3_s4_se", "k3_e1", "ir_k" + "9" * 5000]))


@fuzz(OP_NAMES | values())
def test_canonical_op_raises_only_fbnas_errors_and_is_idempotent(name):
    canon = only_fbnas_errors(canonical_op, name)
    if canon is not None:
        assert canonical_op(canon) == canon


@fuzz(OP_NAMES, st.integers(-2, 17) | st.booleans() | st.none(), st.integers(-1, 17),
      st.integers(-1, 3) | st.floats(0, 3), examples=25)
def test_build_block_raises_only_fbnas_errors(name, c_in, c_out, stride):
    import torch

    block = only_fbnas_errors(build_block, name, c_in, c_out, stride)
    if block is not None:
        x = torch.randn(1, c_in, 8, 8)
        y = block.eval()(x)
        assert y.shape[1] == c_out


def test_known_op_grammar_examples():
    """Spot checks of what the fuzzer relies on: spellings map to one canonical name."""
    assert canonical_op("k3_e1") == "ir_k3_e1" and canonical_op("ir_k33_e1") == "ir_k33_e1"
    assert canonical_op("ir_k3_sep") == "ir_k33_e1"
    for bad in ("ir_k3_e0", "ir_k4_e1", "ir_k3_g3", "ir_e3_k3", "ir_k3_se_se", "k٣_e1",
                "ir_k" + "9" * 5000, "skip\n", ""):
        with pytest.raises(FbnasError):
            canonical_op(bad)
