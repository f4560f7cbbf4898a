"""The cost table file: latency (µs), FLOPs or parameters per block signature, as JSON.

One file per device (latency) or per space family (FLOPs, params). Entries are keyed by
signature (see `fbnas.latency.signature`), so identical layers share one entry and one table
serves every search space whose layers share signatures. Stem and head are entries too, so a
whole network can be predicted. Schema (version 1):

    {"fbnas_cost_table": 1,
     "cost": "latency" | "flops" | "params",  "unit": "us" | "flops" | "params",
     "meta": {backend, device_name, cpu_model, gpu_name?, threads, torch_version, batch,
              dtype, memory_format, mode, created, fbnas_version},
     "protocol": {...how entries were timed...} | null,
     "reference": {"signature": KEY, "scale_us": µs, ...} | null,  # drift-compensation unit
     "context": {"scale": s, "exponent": g, ...} | null,  # in-network model, in the values
     "noise": {...} | null,                    # spread of the measurement, for the record
     "calibration": {"a": a, "b": b, ...} | null,       # measured ≈ a·predicted + b
     "corrections": {"space": NAME, "space_hash": H, "rows": [{op: δ}, ...], ...} | null,
     "entries": {KEY: {"sig": {kind, op, c_in, c_out, stride, h, w[, classes]},
                       "value": number, "stats": {...} | absent}}}

Which estimate `costs_for` and `predict` use is chosen by `model`: "raw" (the entries),
"calibrated" (affine calibration applied), "corrected" (the per-(layer, op) corrections fitted
from end-to-end measurements, see `fbnas.latency.validate`), or "auto" (the best available:
corrected if corrections were fitted for this space, else calibrated if calibrated, else raw).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fbnas import __version__
from fbnas.backends import QUANTIZATIONS
from fbnas.errors import FbnasError
from fbnas.io import load_json, show, write_json_atomic
from fbnas.latency.kinds import COST_KINDS, is_measured
from fbnas.latency.signature import (
    Signature,
    arch_signatures,
    head_signature,
    layer_signatures,
    space_signatures,
    stem_signature,
)
from fbnas.search_space import SearchSpace
from fbnas.settings import COST_MODELS, Fields

SCHEMA = 1
MODELS = COST_MODELS


def calibrated(cal: dict[str, Any] | None, rows: list[dict[Any, float]], fixed: float
               ) -> tuple[list[dict[Any, float]], float]:
    """The one place a table's affine calibration (measured ≈ a·predicted + b: `calibration`,
    or the `corrections` fit's own a and b) is applied: each block's cost times a, the fixed
    cost (stem + head) times a plus b, so that every network's sum is a·(its raw sum) + b.
    `cal` None: as given."""
    if not cal:
        return rows, fixed
    a, b = float(cal["a"]), float(cal["b"])
    return [{k: a * v for k, v in row.items()} for row in rows], a * fixed + b
# The meta keys that change what the numbers mean (the fingerprint covers these).
MEANINGFUL_META = ("backend", "device_name", "cpu_model", "gpu_name", "threads", "batch",
                   "dtype", "memory_format", "quantization", "mode", "torch_version", "clock")
# What a table older than a meta key was measured with (the key's absence reads as this).
META_ABSENT = {"allocator": "system", "quantization": "none"}


def space_hash(space: SearchSpace) -> str:
    """sha256 of a space's per-layer candidate signatures (what corrections are fitted to),
    and of its width choices where it searches widths."""
    rows = [[(op, s.key()) for op, s in row.items()] for row in layer_signatures(space)]
    d = {"stem": stem_signature(space.macro).key(), "layers": rows,
         "head": head_signature(space.macro).key()}
    if space.searches_widths:  # its networks (probes, corrections) differ from its widest twin's
        d["widths"] = [space.width_choices(s) for s in range(len(space.macro.stages))]
    blob = json.dumps(d, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


class Entry:
    """One signature's cost, and (latency) the statistics it came from."""

    __slots__ = ("sig", "value", "stats")

    def __init__(self, sig: Signature, value: float, stats: dict[str, Any] | None = None):
        self.sig, self.value, self.stats = sig, float(value), stats

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"sig": self.sig.to_dict(), "value": self.value}
        if self.stats:
            d["stats"] = self.stats
        return d


class LatencyTable:
    """A cost table (latency, FLOPs or params) keyed by block signature."""

    def __init__(self, cost: str = "latency", meta: dict[str, Any] | None = None):
        if cost not in COST_KINDS:
            raise FbnasError(f"cost table: cost must be one of {', '.join(COST_KINDS)}; "
                             f"got {cost!r}")
        self.cost = cost
        self.unit = COST_KINDS.get(cost).table_unit
        self.meta: dict[str, Any] = dict(meta or {})
        self.meta.setdefault("created", _dt.datetime.now(_dt.timezone.utc)
                             .isoformat(timespec="seconds"))
        self.meta.setdefault("fbnas_version", __version__)
        self.protocol: dict[str, Any] | None = None
        self.reference: dict[str, Any] | None = None
        self.context: dict[str, Any] | None = None
        self.noise: dict[str, Any] | None = None
        self.calibration: dict[str, Any] | None = None
        self.corrections: dict[str, Any] | None = None
        self.entries: dict[str, Entry] = {}
        self.path: str | None = None

    # ---- entries -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, sig: Signature | str) -> bool:
        return (sig if isinstance(sig, str) else sig.key()) in self.entries

    def add(self, sig: Signature, value: float, stats: dict[str, Any] | None = None) -> None:
        if not value >= 0 or value == float("inf"):
            raise FbnasError(f"cost table: entry '{sig.key()}' has a negative or non-finite "
                             f"value {value!r}")
        self.entries[sig.key()] = Entry(sig, value, stats)

    def value(self, sig: Signature) -> float:
        try:
            return self.entries[sig.key()].value
        except KeyError:
            raise FbnasError(f"{self._name()}: no entry for '{sig.key()}'") from None

    def missing(self, space: SearchSpace) -> list[Signature]:
        """Every signature `space` needs that the table lacks (stem, blocks, head), once each."""

        return [s for s in space_signatures(space) if s.key() not in self.entries]

    def _name(self) -> str:
        return self.path or f"{self.cost} table"

    def build_command(self, config: str | None = None) -> str:
        """The command that measures this table's missing entries (extending it in place)."""
        out = shlex.quote(self.path) if self.path else "TABLE.json"
        cfg = shlex.quote(config) if config else "CONFIG.yaml"
        if not is_measured(self.cost):
            return f"fbnas latency build --config {cfg} --cost {self.cost} --table {out}"
        m = self.meta
        cmd = (f"fbnas latency build --config {cfg} --device {m.get('backend', 'cpu')} "
               f"--threads {m.get('threads', 1)} --batch {m.get('batch', 1)} "
               f"--dtype {m.get('dtype', 'float32')}")
        if m.get("memory_format") == "channels_last":
            cmd += " --channels-last"
        if self.setting("quantization") != "none":
            cmd += f" --quantization {m['quantization']}"
        return cmd + f" --table {out}"

    def require(self, space: SearchSpace, config: str | None = None) -> None:
        """Raise, listing every missing signature and the command that measures them."""
        miss = self.missing(space)
        if miss:
            listed = "; ".join(s.key() for s in miss)
            raise FbnasError(f"{self._name()}: {len(miss)} signature(s) of search space "
                             f"'{space.name}' missing: {listed}; measure them with: "
                             f"{self.build_command(config)}")

    def setting(self, key: str) -> Any:
        """meta[key], or what a table older than the key was measured with (META_ABSENT)."""
        return self.meta.get(key, META_ABSENT.get(key))

    def check_run(self, batch: int | None = None, dtype: str | None = None,
                  memory_format: str | None = None, backend: str | None = None,
                  allocator: str | None = None, quantization: str | None = None) -> None:
        """Refuse a latency table measured for another batch size, dtype, memory format,
        backend, memory allocator or quantization than the run asks for (FLOPs and params
        tables fit every run; a table older than the allocator setting was measured under
        `system`, one older than the quantization setting unquantized)."""
        if not is_measured(self.cost):
            return
        asked = {"batch": batch, "dtype": dtype, "memory_format": memory_format,
                 "backend": backend, "allocator": allocator, "quantization": quantization}
        for key, want in asked.items():
            have = self.setting(key)
            if want is not None and have != want:
                flag = {"batch": f"--batch {want}", "dtype": f"--dtype {want}",
                        "backend": f"--device {want}", "allocator": f"--allocator {want}",
                        "quantization": f"--quantization {want}",
                        "memory_format": ("--channels-last" if want == "channels_last" else
                                          "without --channels-last")}[key]
                raise FbnasError(
                    f"{self._name()}: meta.{key} is {show(have)} but this run asks for "
                    f"{want!r}; a latency table only holds for the setting it was measured in — "
                    f"build one for {key} {want!r} (fbnas latency build ... {flag})")

    # ---- costs for a search space ------------------------------------------------------------
    def _pick_model(self, space: SearchSpace | None, model: str) -> str:
        if model not in MODELS:
            raise FbnasError(f"cost model must be one of {', '.join(MODELS)}; got {model!r}")
        # corrections are per (layer, op) at one width: a width-searched space uses the
        # calibration (fbnas.latency.resolve.width_costs)
        corrected_ok = (self.corrections is not None and space is not None
                     and not space.searches_widths
                     and self.corrections.get("space_hash") == space_hash(space))
        if model == "corrected" and not corrected_ok:
            why = ("has no corrections" if self.corrections is None else
                   f"has corrections fitted for space '{self.corrections.get('space')}', "
                   "not for this one")
            raise FbnasError(f"{self._name()}: {why}; fit them with: fbnas latency validate "
                             "--config CONFIG.yaml --table TABLE --corrections --save")
        if model == "calibrated" and self.calibration is None:
            raise FbnasError(f"{self._name()}: has no calibration; fit one with: fbnas latency "
                             "validate --config CONFIG.yaml --table TABLE --save")
        if model == "auto":
            return "corrected" if corrected_ok else "calibrated" if self.calibration else "raw"
        return model

    def costs_for(self, space: SearchSpace, model: str = "auto",
                  config: str | None = None) -> tuple[list[dict[str, float]], float]:
        """(rows, fixed): one mapping op -> cost per searchable layer, and stem + head.

        Raises FbnasError listing every missing signature. The result goes straight to
        `Supernet.set_costs(rows, fixed)`.
        """
        self.require(space, config)
        sigs = layer_signatures(space)
        rows = [{op: self.entries[s.key()].value for op, s in row.items()} for row in sigs]
        fixed = (self.entries[stem_signature(space.macro).key()].value
                 + self.entries[head_signature(space.macro).key()].value)
        which = self._pick_model(space, model)
        if which in ("calibrated", "corrected"):
            rows, fixed = calibrated(self.calibration if which == "calibrated"
                                     else self.corrections, rows, fixed)
        if which == "corrected":
            deltas = self.corrections["rows"]
            if len(deltas) != len(rows):
                raise FbnasError(f"{self._name()}: corrections.rows has {len(deltas)} rows but "
                                 f"search space '{space.name}' has {len(rows)} layers")
            rows = [{op: max(0.0, v + float(d.get(op, 0.0))) for op, v in row.items()}
                    for row, d in zip(rows, deltas, strict=True)]
        return rows, fixed

    def predict(self, arch, model: str = "raw", space: SearchSpace | None = None) -> float:
        """Whole-network cost of an Architecture: fixed (stem + head) + its chosen blocks.

        With `model` other than "raw", the stored calibration (or, given the `space` the
        corrections were fitted on, the corrected model) is applied.
        """
        sigs = arch_signatures(arch)
        missing = [s.key() for s in sigs if s.key() not in self.entries]
        if missing:
            uniq = list(dict.fromkeys(missing))
            raise FbnasError(f"{self._name()}: architecture '{arch.name}' needs "
                             f"{len(uniq)} signature(s) the table lacks: {'; '.join(uniq)}; "
                             f"measure them with: {self.build_command()}")
        which = self._pick_model(space, model)
        if which == "corrected":
            rows, fixed = self.costs_for(space, "corrected")
            return fixed + sum(r[op] for r, op in zip(rows, arch.ops, strict=True))
        total = sum(self.entries[s.key()].value for s in sigs)
        if which == "calibrated":
            _, total = calibrated(self.calibration, [], total)
        return total

    # ---- identity ----------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """sha256 over what the numbers mean: cost kind, device setting, entry values,
        calibration and corrections (not creation time, statistics or noise)."""
        blob = {
            "schema": SCHEMA, "cost": self.cost, "unit": self.unit,
            "meta": {k: self.meta.get(k) for k in MEANINGFUL_META if k in self.meta},
            "entries": {k: e.value for k, e in sorted(self.entries.items())},
            "calibration": ({k: self.calibration[k] for k in ("a", "b")}
                            if self.calibration else None),
            "corrections": ({k: self.corrections[k] for k in ("space_hash", "a", "b", "rows")}
                            if self.corrections else None),
        }
        return hashlib.sha256(json.dumps(blob, sort_keys=True, separators=(",", ":"))
                              .encode()).hexdigest()

    # ---- file format -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "fbnas_cost_table": SCHEMA, "cost": self.cost, "unit": self.unit,
            "meta": self.meta, "protocol": self.protocol, "reference": self.reference,
            "context": self.context, "noise": self.noise, "calibration": self.calibration,
            "corrections": self.corrections,
            "entries": {k: e.to_dict() for k, e in self.entries.items()},
        }

    def save(self, path: str | Path) -> None:
        """Write the table as JSON, atomically (a crash leaves the old file or the new one).
        Messages keep naming the file the table was loaded from (or first saved to)."""
        write_json_atomic(path, self.to_dict())
        if self.path is None:  # a copy saved elsewhere keeps naming the file it came from
            self.path = str(path)

    @classmethod
    def from_dict(cls, data: Any, where: str = "table") -> LatencyTable:
        f = Fields(data, where)
        f.schema("fbnas_cost_table", SCHEMA, "upgrade fbnas to read it",
                 "rebuild it with this fbnas: fbnas latency build --fresh ...")
        cost = f.str("cost", required=True, choices=COST_KINDS)
        unit = f.str("unit", required=True)
        want = COST_KINDS.get(cost).table_unit
        if unit != want:
            raise FbnasError(f"{f.at('unit')}: a {cost} table is in '{want}', got {show(unit)}")
        meta = f.raw("meta", required=True)
        if not isinstance(meta, dict):
            raise FbnasError(f"{f.at('meta')}: expected a mapping, got {show(meta)}")
        _check_meta(meta, cost, f.at("meta"))
        t = cls(cost, meta)
        for key in ("protocol", "reference", "context", "noise", "calibration", "corrections"):
            v = f.raw(key, None)
            if v is not None and not isinstance(v, dict):
                raise FbnasError(f"{f.at(key)}: expected a mapping or null, got {show(v)}")
            setattr(t, key, v)
        _check_blocks(t, f)
        for key in ("calibration", "corrections"):
            block = getattr(t, key)
            if block is not None:
                bf = Fields(block, f.at(key))
                bf.float("a", required=True)
                bf.float("b", required=True)
        if t.corrections is not None:
            rows = t.corrections.get("rows")
            if not isinstance(rows, list) or not all(
                    isinstance(r, dict) and all(isinstance(v, (int, float)) and
                                                not isinstance(v, bool) for v in r.values())
                    for r in rows):
                raise FbnasError(f"{f.at('corrections')}.rows: expected a list of "
                                 "{op: number} mappings")
            if not isinstance(t.corrections.get("space_hash"), str):
                raise FbnasError(f"{f.at('corrections')}: missing key 'space_hash'")
        entries = f.raw("entries", required=True)
        if not isinstance(entries, Mapping):
            raise FbnasError(f"{f.at('entries')}: expected a mapping, got {type(entries).__name__}")
        for key, ed in entries.items():
            ew = f"{f.at('entries')}['{key}']"
            ef = Fields(ed, ew)
            sig = Signature.from_dict(ef.raw("sig", required=True), f"{ew}.sig")
            if sig.key() != key:
                raise FbnasError(f"{ew}: key does not match its signature (expected "
                                 f"'{sig.key()}')")
            value = ef.float("value", required=True, min=0.0)
            stats = ef.raw("stats", None)
            if stats is not None and not isinstance(stats, dict):
                raise FbnasError(f"{ew}.stats: expected a mapping, got {show(stats)}")
            for k, v in (stats or {}).items():
                if not _number(v):
                    raise FbnasError(f"{ew}.stats.{k}: expected a number, got {show(v)}")
            ef.done()
            t.entries[key] = Entry(sig, value, stats)
        f.done()
        return t

    @classmethod
    def load(cls, path: str | Path) -> LatencyTable:
        t = cls.from_dict(load_json(path), str(path))
        t.path = str(path)
        return t


# ---- checking the optional blocks a table file may hold -----------------------------------------
def _number(v: Any) -> bool:
    """A JSON number fbnas can compute with: a float, or an integer within float range."""
    return isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool)
                                    and abs(v) < 2**1023)


META_STRINGS = ("backend", "device_name", "cpu_model", "gpu_name", "dtype", "torch_version",
                "mode", "clock", "created", "fbnas_version", "note")


def _check_meta(meta: dict[str, Any], cost: str, where: str) -> None:
    """The meta keys fbnas reads must have their types (a latency table needs batch, dtype,
    backend: they say what the numbers were measured for)."""
    mf = Fields(meta, where)
    required = is_measured(cost)
    mf.int("batch", required=required, min=1)
    mf.str("dtype", required=required)
    mf.str("backend", required=required)
    mf.int("threads", None, min=1)
    mf.str("memory_format", None, choices=("contiguous", "channels_last"))
    mf.str("quantization", None, choices=QUANTIZATIONS)
    for key in META_STRINGS:
        mf.str(key, None)


# key -> (kind, lower bound): what build/show/measure/validate read from each block
_PROTOCOL = {"rounds": ("int", 1), "sample_s": ("num", 0.0), "ref_sample_s": ("num", 0.0),
             "ref_every": ("int", 1), "warmup_s": ("num", 0.0), "max_rel_iqr": ("num", 0.0),
             "extra_rounds": ("int", 0), "seed": ("int", 0), "reference": ("bool", None),
             "reference_signature": ("str", None)}
_REFERENCE = {"scale_us": ("num", 0.0), "signature": ("str", None), "statistic": ("str", None)}
_CONTEXT = {"scale": ("num", 0.0), "exponent": ("num", 0.0), "probes": ("int", 0),
            "probe_space": ("str", None)}


def _check_block(block: dict[str, Any] | None, spec: dict[str, tuple[str, Any]],
                 where: str) -> None:
    if block is None:
        return
    for key, (kind, lo) in spec.items():
        v = block.get(key)
        if v is None:
            continue
        ok = {"int": isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**31,
              "num": _number(v),
              "bool": isinstance(v, bool), "str": isinstance(v, str)}[kind]
        if not ok:
            what = {"int": "an integer below 2^31", "num": "a number", "bool": "true or false",
                    "str": "a string"}[kind]
            raise FbnasError(f"{where}.{key}: expected {what}, got {show(v)}")
        if lo is not None and (v != v or v < lo or v in (float("inf"), float("-inf"))):
            raise FbnasError(f"{where}.{key}: must be a finite number >= {lo}, got {show(v)}")


def _check_blocks(t: LatencyTable, f: Fields) -> None:
    _check_block(t.protocol, _PROTOCOL, f.at("protocol"))
    _check_block(t.reference, _REFERENCE, f.at("reference"))
    _check_block(t.context, _CONTEXT, f.at("context"))
    nets = (t.context or {}).get("probe_nets")
    if nets is not None and not (isinstance(nets, list) and all(
            _number(x) and 0 < x < float("inf") for x in nets)):
        raise FbnasError(f"{f.at('context')}.probe_nets: expected a list of positive numbers, "
                         f"got {show(nets)}")
    for key, v in (t.noise or {}).items():
        w = f"{f.at('noise')}.{key}"
        if key == "_ref_times_s":
            ok = isinstance(v, list) and all(_number(x) for x in v)
        elif key == "_probe_ratios":
            ok = isinstance(v, dict) and all(isinstance(r, list) and all(_number(x) for x in r)
                                             for r in v.values())
        else:
            ok = v is None or _number(v)
        if not ok:
            raise FbnasError(f"{w}: unexpected value {show(v)}")


CostTable = LatencyTable  # FLOPs and params tables are the same class with another `cost`
