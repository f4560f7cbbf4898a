"""A retrain's results.json: its one schema (`FIELDS`), the one writer (`results_record`)
and the one reader (`load_results`).

Every key a retrain writes is declared here once with its type; `results_record` refuses a key
the schema lacks (so a writer cannot drift from the reader), and `load_results` checks a file's
values against the same declaration.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from fbnas.errors import FbnasError
from fbnas.io import load_json, show, write_json_atomic

SCHEMA = 1  # the value of a results file's `fbnas_results`
PATH_KEY = "_path"  # load_results adds the file the row came from under this key

# Every key of a results.json file and the kind of value it holds (None is always allowed).
FIELDS: dict[str, str] = {
    "kind": "str", "run_dir": "str", "created": "str", "arch": "map", "space": "str",
    "dataset": "str", "device": "str", "latency_device": "str",
    "target_latency_ms": "num", "predicted_latency_ms": "num", "latency_table": "str",
    "measured_latency_ms": "num", "measured_latency_iqr": "num",
    "top1": "num", "top5": "num", "test_ce": "num", "val_top1": "num", "val_ce": "num",
    "params": "num", "flops": "num", "epochs": "num", "train_seconds": "num",
    "images_per_s": "num", "init_from": "str", "search_run": "str", "sweep": "map",
}


def results_record(**values: Any) -> dict[str, Any]:
    """A results.json's contents: `values` (every key of `FIELDS`, each once) under the
    schema's version. A key the schema does not declare is a programming error."""
    unknown = sorted(set(values) - set(FIELDS))
    missing = sorted(set(FIELDS) - set(values))
    if unknown or missing:
        raise ValueError(f"results record: undeclared keys {unknown}, missing keys {missing}")
    return {"fbnas_results": SCHEMA, **{k: values[k] for k in FIELDS}}


def write_results(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Write a record made by `results_record` (atomically)."""
    write_json_atomic(path, dict(record))


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """One results.json, checked: a JSON object with `fbnas_results: 1` and values of the
    right types. Every known key is present in the result (None where the file lacks it);
    unknown keys are kept; the file's own path is stored under `PATH_KEY`. Errors are one-line
    FbnasErrors naming the file (and the key)."""
    data = load_json(path)
    version = data.get("fbnas_results")
    if version is None:
        raise FbnasError(f"{path}: not an fbnas results file (no 'fbnas_results' key)")
    if type(version) is not int or version != SCHEMA:
        remedy = ("written by a newer fbnas: upgrade fbnas to read it"
                  if type(version) is int and version > SCHEMA else
                  "re-run the retrain with this fbnas")
        raise FbnasError(f"{path}: fbnas_results is {show(version)}, this fbnas reads version "
                         f"{SCHEMA} ({remedy})")
    row = dict(data)
    for key, kind in FIELDS.items():
        v = row.setdefault(key, None)
        if v is None:
            continue
        if kind == "str" and not isinstance(v, str):
            raise FbnasError(f"{path}: '{key}' must be a string or null, got {_kind(v)}")
        if kind == "num":
            if not is_number(v):
                raise FbnasError(f"{path}: '{key}' must be a number or null, got {_kind(v)}")
            if isinstance(v, float) and not math.isfinite(v):
                row[key] = None  # NaN / inf (Python's json reads them) count as not measured
        if kind == "map" and not isinstance(v, Mapping):
            raise FbnasError(f"{path}: '{key}' must be an object or null, got {_kind(v)}")
    arch = dict(row["arch"] or {})
    for key in ("name", "hash"):
        v = arch.setdefault(key, None)
        if v is not None and not isinstance(v, str):
            raise FbnasError(f"{path}: 'arch.{key}' must be a string or null, got {_kind(v)}")
    ops = arch.setdefault("ops", None)
    if ops is not None and not (isinstance(ops, list) and all(isinstance(o, str) for o in ops)):
        raise FbnasError(f"{path}: 'arch.ops' must be a list of strings or null")
    row["arch"] = arch
    row[PATH_KEY] = str(path)
    return row


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _kind(v: Any) -> str:
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(
        type(v), type(v).__name__)
