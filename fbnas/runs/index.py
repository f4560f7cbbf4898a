"""The results index behind `fbnas runs`: every retrain run's `results.json` as one table.

Like NAS-Bench-101's query of evaluated architectures: `find_results` collects the files,
`fbnas.runs.results.load_results` checks and normalises each one, and `results_table` /
`format_table` sort the
rows by any column in `COLUMNS` (numerically for numbers, missing values always last) and
mark the rows on the latency / accuracy Pareto front (`pareto`).

    rows = [load_results(p) for p in find_results(["runs"])]
    print(format_table(rows, sort="measured"))
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from fbnas.backends import FORMATS
from fbnas.errors import FbnasError
from fbnas.io import is_number
from fbnas.runs.files import RESULTS
from fbnas.runs.results import PATH_KEY

_FRONT_KEY = "_front"


# ---- finding ---------------------------------------------------------------------------------
def find_results(paths: Iterable[str | os.PathLike], missing_ok: bool = False) -> list[Path]:
    """The results.json files under `paths`, in a deterministic order.

    A path that is a file is taken as it is; a directory is searched recursively for files
    named results.json (sorted by their path components, so `a/b` comes before `a-b`). Paths
    are taken in the order given and a file reached twice is listed once. A path that does
    not exist is an FbnasError naming it, or skipped when `missing_ok`.
    """
    out: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw)
        if p.is_file():
            found = [p]
        elif p.is_dir():
            found = sorted((f for f in p.rglob(RESULTS) if f.is_file()), key=lambda f: f.parts)
        elif missing_ok:
            continue
        else:
            raise FbnasError(f"{p}: no such file or directory")
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


# ---- columns ---------------------------------------------------------------------------------
class Column(NamedTuple):
    """header: the table's title; get(row): the raw value (None = missing); fmt(value): text
    for a present value."""

    header: str
    get: Callable[[Mapping[str, Any]], Any]
    fmt: Callable[[Any], str]


def _rel(p: str | os.PathLike) -> str:
    """`p` relative to the current directory when it lies under it, else as it is."""
    path = Path(p)
    if path.is_absolute():
        try:
            return str(path.relative_to(Path.cwd())) or "."
        except ValueError:
            return str(path)
    return str(path)


def _run(r: Mapping[str, Any]) -> str | None:
    """The run directory: the folder holding the results.json it was read from (correct even
    when the run was moved), else the run_dir it records."""
    if r.get(PATH_KEY):
        return _rel(Path(r[PATH_KEY]).parent)
    return _rel(r["run_dir"]) if r.get("run_dir") else None


def _arch(r: Mapping[str, Any], key: str) -> Any:
    a = r.get("arch")
    return a.get(key) if isinstance(a, Mapping) else None


def _sweep(r: Mapping[str, Any], key: str | None = None) -> Any:
    s = r.get("sweep")
    if not isinstance(s, Mapping):
        return None
    if key is not None:
        return s.get(key)
    return ",".join(f"{k}={v}" for k, v in s.items()) or None


def _key(key: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda r: r.get(key)


def _fixed(digits: int, scale: float = 1.0) -> Callable[[Any], str]:
    return lambda v: f"{v * scale:.{digits}f}"


def _int(v: Any) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


_HASH_CHARS = 12

COLUMNS: dict[str, Column] = {
    "front": Column("*", _key(_FRONT_KEY), lambda v: "*" if v else ""),
    "run": Column("run", _run, str),
    "arch": Column("arch",
                   lambda r: _arch(r, "hash")[:_HASH_CHARS] if _arch(r, "hash") else None, str),
    "name": Column("name", lambda r: _arch(r, "name"), str),
    "space": Column("space", _key("space"), str),
    "dataset": Column("dataset", _key("dataset"), str),
    "device": Column("device", lambda r: r.get("latency_device") or r.get("device"), str),
    "target": Column("target us", _key("target_us"), _fixed(1)),
    "predicted": Column("predicted us", _key("predicted_us"), _fixed(1)),
    "measured": Column("measured us", _key("measured_us"), _fixed(1)),
    "iqr": Column("iqr %", _key("measured_iqr"), _fixed(1, 100.0)),
    "top1": Column("top1 %", _key("top1"), _fixed(2, 100.0)),
    "top5": Column("top5 %", _key("top5"), _fixed(2, 100.0)),
    "val_top1": Column("val top1 %", _key("val_top1"), _fixed(2, 100.0)),
    "params": Column("params M", _key("params"), _fixed(3, 1e-6)),
    "flops": Column("MFLOPs", _key("flops"), _fixed(1, 1e-6)),
    "epochs": Column("epochs", _key("epochs"), _int),
    "train_s": Column("train s", _key("train_seconds"), _fixed(1)),
    "img_s": Column("img/s", _key("images_per_s"), _fixed(0)),
    "search_s": Column("search s", _key("search_seconds"), _fixed(0)),
    "search_R": Column("search R", _key("search_trainings"), _fixed(2)),
    "setting": Column("sweep point", lambda r: _sweep(r, "label"), str),
    "sweep": Column("sweep", _sweep, str),
    "train_device": Column("train device", _key("device"), str),
    "hash": Column("hash", lambda r: _arch(r, "hash"), str),
    "search_run": Column("search run",
                         lambda r: _rel(r["search_run"]) if r.get("search_run") else None, str),
    "kind": Column("kind", _key("kind"), str),
    "created": Column("created", _key("created"), str),
    "file": Column("file", lambda r: _rel(r[PATH_KEY]) if r.get(PATH_KEY) else None, str),
}


def _program(fmt: str, quantization: str, key: str) -> Callable[[Mapping[str, Any]], Any]:
    """A run's figure `key` of its exported `fmt` program of `quantization` (the first file
    by name that has it, where the run exported several)."""
    def get(r: Mapping[str, Any]) -> Any:
        progs = r.get("programs")
        if not isinstance(progs, Mapping):
            return None
        for name in sorted(progs):
            p = progs[name]
            if (isinstance(p, Mapping) and p.get("format") == fmt
                    and (p.get("quantization") or "none") == quantization
                    and p.get(key) is not None):
                return p[key]
        return None
    return get


# Per exported program kind (every registered format, each quantization it writes): the
# program's test top-1 (`fbnas eval --model`) and latency (`fbnas latency measure --model`).
PROGRAM_COLUMNS: list[str] = []
for _fmt in FORMATS:
    for _q in FORMATS.attr(_fmt, "quantizations"):
        _label = "fp32" if _q == "none" else _q
        COLUMNS[f"{_fmt}_{_label}_top1"] = Column(f"{_fmt} {_label} top1 %",
                                                  _program(_fmt, _q, "top1"), _fixed(2, 100.0))
        COLUMNS[f"{_fmt}_{_label}_us"] = Column(f"{_fmt} {_label} us",
                                                _program(_fmt, _q, "measured_us"), _fixed(1))
        PROGRAM_COLUMNS += [f"{_fmt}_{_label}_top1", f"{_fmt}_{_label}_us"]

DEFAULT_COLUMNS = ["front", "run", "arch", "name", "space", "dataset", "device", "target",
                   "predicted", "measured", "top1", "top5", "params", "flops", "epochs", "search_R",
                   "setting"]
# Sorted high-to-low unless told otherwise; every other column sorts low-to-high.
DESCENDING = frozenset({"front", "top1", "top5", "val_top1", "img_s",
                        *(c for c in PROGRAM_COLUMNS if c.endswith("_top1"))})
# Left-aligned in the table; the rest are numbers, right-aligned.
TEXT_COLUMNS = frozenset({"front", "run", "arch", "name", "space", "dataset", "device", "setting",
                          "sweep", "train_device", "hash", "search_run", "kind", "created",
                          "file"})


def check_column(name: str, what: str = "column") -> str:
    """`name` if it is in COLUMNS, else an FbnasError listing the valid ones."""
    if name not in COLUMNS:
        raise FbnasError(f"unknown {what} {name!r}; columns are: {', '.join(COLUMNS)}")
    return name


def parse_columns(spec: str | Sequence[str] | None) -> list[str]:
    """'a,b,c' (or a list) → checked column names; None → DEFAULT_COLUMNS."""
    if spec is None:
        return list(DEFAULT_COLUMNS)
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise FbnasError(f"no columns given; columns are: {', '.join(COLUMNS)}")
    return [check_column(n) for n in names]


def columns_for(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The default columns, then each program column that some row has a figure in (the
    runs' int8 and fp32 programs beside the eager model, once they were exported)."""
    return list(DEFAULT_COLUMNS) + [c for c in PROGRAM_COLUMNS
                                    if any(not _missing(COLUMNS[c].get(r)) for r in rows)]


def default_descending(column: str) -> bool:
    """Accuracy-like columns sort high-to-low by default; latency, size and the rest low-to-high."""
    return column in DESCENDING


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


# ---- sorting and the Pareto front ------------------------------------------------------------
def sort_rows(rows: Sequence[Mapping[str, Any]], sort: str = "top1",
              descending: bool | None = None) -> list[Mapping[str, Any]]:
    """`rows` ordered by column `sort`: numbers numerically, text lexicographically (numbers
    before text if a column mixes them), rows missing the value always last, ties in their
    given order. `descending=None` takes the column's default (`default_descending`)."""
    get = COLUMNS[check_column(sort, "sort column")].get
    if descending is None:
        descending = default_descending(sort)
    present, missing = [], []
    for r in rows:
        v = get(r)
        (missing if _missing(v) else present).append((v, r))

    def key(item):
        v = item[0]
        return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))

    present.sort(key=key, reverse=descending)  # stable: ties keep their order either way
    return [r for _, r in present] + [r for _, r in missing]


def _latency(r: Mapping[str, Any]) -> Any:
    v = COLUMNS["measured"].get(r)
    return COLUMNS["predicted"].get(r) if _missing(v) else v


def pareto(rows: Sequence[Mapping[str, Any]], x: str | None = None, y: str = "top1") -> set[int]:
    """Indices of the rows on the Pareto front of minimum `x` and maximum `y` (both column
    names): those no other row beats on one without losing on the other. `x=None` is latency:
    a row's measured latency, or its predicted latency when it has no measurement. Rows missing
    either value are never on the front; rows with equal (x, y) are both on it or both not."""
    gx = _latency if x is None else COLUMNS[check_column(x)].get
    gy = COLUMNS[check_column(y)].get
    points = []
    for i, r in enumerate(rows):
        vx, vy = gx(r), gy(r)
        if is_number(vx) and is_number(vy) and not (_missing(vx) or _missing(vy)):
            points.append((vx, vy, i))
    points.sort(key=lambda p: (p[0], -p[1]))
    front: set[int] = set()
    best = -math.inf  # highest y among points of strictly lower x
    j = 0
    while j < len(points):
        k = j
        while k < len(points) and points[k][0] == points[j][0]:
            k += 1
        top = points[j][1]  # the group of equal x is sorted by y, highest first
        if top > best:
            front.update(i for _, vy, i in points[j:k] if vy == top)
            best = top
        j = k
    return front


# ---- tables ----------------------------------------------------------------------------------
def select_rows(rows: Sequence[Mapping[str, Any]], sort: str = "top1",
                descending: bool | None = None, top: int | None = None
                ) -> list[dict[str, Any]]:
    """Copies of `rows` marked with their Pareto front membership (over all of `rows`), sorted
    by `sort`, the first `top` of them if given."""
    check_column(sort, "sort column")
    if top is not None and top < 0:
        raise FbnasError(f"top must be >= 0, got {top}")
    front = pareto(rows)
    marked = [{**r, _FRONT_KEY: i in front} for i, r in enumerate(rows)]
    ordered = sort_rows(marked, sort, descending)
    return [dict(r) for r in (ordered if top is None else ordered[:top])]


def records(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | str | None = None
            ) -> list[dict[str, Any]]:
    """Raw (unformatted) values: one {column: value} per row, for CSV and JSON output."""
    cols = parse_columns(columns)
    return [{c: COLUMNS[c].get(r) for c in cols} for r in rows]


def results_table(rows: Sequence[Mapping[str, Any]], sort: str = "top1",
                  descending: bool | None = None, columns: Sequence[str] | str | None = None,
                  top: int | None = None) -> list[list[str]]:
    """The header row, then one row of formatted cells per result ('-' where missing), sorted
    by `sort` (see `sort_rows`) and cut to `top`; column `front` marks Pareto rows with '*'."""
    cols = parse_columns(columns)
    table = [[COLUMNS[c].header for c in cols]]
    for r in select_rows(rows, sort, descending, top):
        cells = []
        for c in cols:
            col = COLUMNS[c]
            v = col.get(r)
            cells.append("-" if _missing(v) and c != "front" else col.fmt(v))
        table.append(cells)
    return table


def align(table: Sequence[Sequence[str]], columns: Sequence[str] | None = None) -> str:
    """Fixed-width text: cells padded to each column's widest, two spaces apart; columns named
    in TEXT_COLUMNS (or all, if `columns` is None) left-aligned, numbers right-aligned."""
    if not table:
        return ""
    widths = [max(len(row[j]) for row in table) for j in range(len(table[0]))]
    lines = []
    for row in table:
        cells = []
        for j, cell in enumerate(row):
            left = columns is None or columns[j] in TEXT_COLUMNS
            cells.append(cell.ljust(widths[j]) if left else cell.rjust(widths[j]))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def format_table(rows: Sequence[Mapping[str, Any]], sort: str = "top1",
                 descending: bool | None = None, columns: Sequence[str] | str | None = None,
                 top: int | None = None) -> str:
    """`results_table` as fixed-width aligned text (no trailing newline)."""
    cols = parse_columns(columns)
    return align(results_table(rows, sort, descending, cols, top), cols)
