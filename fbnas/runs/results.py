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
from pathlib import Path
from typing import Any

from fbnas.errors import FbnasError
from fbnas.io import VALUE_KINDS, is_number, load_json, show, write_json_atomic
from fbnas.runs.files import RunFiles

SCHEMA = 2  # the value of a results file's `fbnas_results`
PATH_KEY = "_path"  # load_results adds the file the row came from under this key

# Every key of a results.json file and the kind of value it holds (fbnas.io.VALUE_KINDS; None
# is always allowed).
FIELDS: dict[str, str] = {
    "kind": "str", "run_dir": "str", "created": "str", "arch": "map", "space": "str",
    "dataset": "str", "device": "str", "latency_device": "str",
    "target_us": "num", "predicted_us": "num", "latency_table": "str",
    "measured_us": "num", "measured_iqr": "num",
    "top1": "num", "top5": "num", "test_ce": "num", "val_top1": "num", "val_ce": "num",
    "params": "num", "flops": "num", "epochs": "num", "train_seconds": "num",
    "images_per_s": "num", "init_from": "str", "search_run": "str",
    "search_seconds": "num", "search_trainings": "num", "sweep": "map",
    "programs": "map",
}

# `programs`: the run's exported programs (`fbnas export`), keyed by their path relative to the
# run folder, each with these figures (None until measured): written by `record_program` from
# `fbnas export` (format, quantization, bytes), `fbnas eval --model` (test top1, top5, CE) and
# `fbnas latency measure --model` (measured_us, its relative IQR measured_iqr, and the timer's
# description).
PROGRAM_FIELDS: dict[str, str] = {
    "format": "str", "quantization": "str", "bytes": "num", "top1": "num", "top5": "num",
    "test_ce": "num", "measured_us": "num", "measured_iqr": "num", "timer": "str",
}


# Schema 1 held latency in ms under other names: read as schema 2 (name -> (name, factor)).
SCHEMA_1: dict[str, tuple[str, float]] = {
    "target_latency_ms": ("target_us", 1e3), "predicted_latency_ms": ("predicted_us", 1e3),
    "measured_latency_ms": ("measured_us", 1e3), "measured_latency_iqr": ("measured_iqr", 1.0),
}
SCHEMA_1_PROGRAMS = {"latency_ms": ("measured_us", 1e3), "latency_iqr": ("measured_iqr", 1.0)}


def _from_schema_1(data: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 record read as schema 2: its latency keys renamed and in µs."""
    def move(d: Mapping[str, Any], names: Mapping[str, tuple[str, float]]) -> dict[str, Any]:
        out = {k: v for k, v in d.items() if k not in names}
        for old, (new, factor) in names.items():
            if old in d:
                v = d[old]
                out[new] = v * factor if is_number(v) else v
        return out

    row = move(data, SCHEMA_1)
    progs = row.get("programs")
    if isinstance(progs, Mapping):
        row["programs"] = {name: move(e, SCHEMA_1_PROGRAMS) if isinstance(e, Mapping) else e
                           for name, e in progs.items()}
    return {**row, "fbnas_results": SCHEMA}


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
    """One results.json, checked: a JSON object with `fbnas_results: 2` (1 is read as 2) and
    values of the right types. Every known key is present in the result (None where the file
    lacks it); unknown keys are kept; the file's own path is stored under `PATH_KEY`. Errors
    are one-line FbnasErrors naming the file (and the key)."""
    data = load_json(path)
    version = data.get("fbnas_results")
    if version is None:
        raise FbnasError(f"{path}: not an fbnas results file (no 'fbnas_results' key)")
    if type(version) is int and version == 1:
        data, version = _from_schema_1(data), SCHEMA
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
        _check_kind(path, key, kind, v)
        if kind == "num" and isinstance(v, float) and not math.isfinite(v):
            row[key] = None  # NaN / inf (Python's json reads them) count as not measured
    row["programs"] = _programs(path, row["programs"])
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


def _programs(path, progs: Mapping | None) -> dict[str, dict[str, Any]] | None:
    """`programs` checked: each entry an object whose known keys hold their kind."""
    if progs is None:
        return None
    out = {}
    for name, entry in progs.items():
        if not isinstance(entry, Mapping):
            raise FbnasError(f"{path}: 'programs.{name}' must be an object, got {_kind(entry)}")
        e = dict(entry)
        for key, kind in PROGRAM_FIELDS.items():
            v = e.setdefault(key, None)
            if v is None:
                continue
            _check_kind(path, f"programs.{name}.{key}", kind, v)
        out[str(name)] = e
    return out


def run_results(checkpoint: str | os.PathLike) -> Path:
    """The results.json of the retrain run a checkpoint (file or run folder) belongs to."""
    return RunFiles.of(checkpoint).results


def record_program(results: str | os.PathLike, program: str | os.PathLike, *,
                   fresh: bool = False, **values: Any) -> str | None:
    """Record `values` (keys of PROGRAM_FIELDS) for the exported program at `program` in the
    run's `results` file, and return its key there (its path relative to the run folder).

    `fresh` (a new export): the entry is replaced, so figures of an earlier program at that
    path are dropped. Nothing is recorded (None) for a program outside the run folder.
    Otherwise the figures are merged into the entry `fbnas export` made, and
    nothing is written (None returned) when the run has no results.json or no such entry: a
    file the run did not export is not the run's program. Written atomically.
    """
    unknown = sorted(set(values) - set(PROGRAM_FIELDS))
    if unknown:
        raise ValueError(f"record_program: undeclared keys {unknown}")
    res = Path(results)
    if not res.is_file():
        return None
    key = Path(os.path.relpath(Path(program).resolve(), res.parent.resolve())).as_posix()
    if key.startswith("../"):
        return None  # outside the run folder: not the run's program
    data = load_json(res)
    if data.get("fbnas_results") == 1:  # rewritten in the schema it is read in
        data = _from_schema_1(data)
    progs = dict(data.get("programs") or {})
    if fresh:
        entry = dict.fromkeys(PROGRAM_FIELDS)
    elif isinstance(progs.get(key), Mapping):
        entry = dict(progs[key])
    else:
        return None
    entry.update(values)
    progs[key] = entry
    data["programs"] = progs
    write_json_atomic(res, data)
    return key


def record_program_anywhere(program: str | os.PathLike, levels: int = 3, **values: Any
                            ) -> str | None:
    """`record_program` into the run that exported `program`: the results.json of its folder
    or of one of the `levels` folders above whose `programs` lists it (the first such);
    "RUN/results.json: KEY" where recorded, else None."""
    folder = Path(program).resolve().parent
    for _ in range(levels):
        res = RunFiles(folder).results
        key = record_program(res, program, **values)
        if key is not None:
            return f"{res}: {key}"
        if folder.parent == folder:
            break
        folder = folder.parent
    return None


def _check_kind(path, key: str, kind: str, v: Any) -> None:
    ok, what = VALUE_KINDS[kind]
    if not ok(v):
        raise FbnasError(f"{path}: '{key}' must be {what} or null, got {_kind(v)}")


def _kind(v: Any) -> str:
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(
        type(v), type(v).__name__)
