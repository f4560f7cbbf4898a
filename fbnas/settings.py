"""Typed settings: the strict reader of one mapping from a file (`Fields`), and config
dataclass fields declared once (`setting`) and read with their getter, default and bounds
(`read_fields`)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fbnas.errors import FbnasError
from fbnas.io import check_schema, show


class Fields:
    """Strict reader of one mapping from a file: typed getters, and unknown keys are errors.

    `where` names the file and the key path so that every message points at the bad value.
    """

    def __init__(self, data: Any, where: str):
        if not isinstance(data, Mapping):
            raise FbnasError(f"{where}: expected a mapping, got {type(data).__name__}")
        self.data = dict(data)
        self.where = where
        self.used: set[str] = set()

    def _get(self, key: str, default: Any, required: bool, nullable: bool = False) -> Any:
        """The value; `key: null` counts as absent (the default) unless `nullable`."""
        self.used.add(key)
        if key not in self.data or (self.data[key] is None and not nullable):
            if required:
                raise FbnasError(f"{self.where}: missing key '{key}'")
            return default
        return self.data[key]

    def at(self, key: str) -> str:
        return f"{self.where}.{key}"

    def int(self, key: str, default: Any = None, *, required: bool = False, min: int | None = None,
            max: int = 2**63 - 1):
        v = self._get(key, default, required)
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise FbnasError(f"{self.at(key)}: expected an integer, got {show(v)}")
        if min is not None and v < min:
            raise FbnasError(f"{self.at(key)}: must be >= {min}, got {show(v)}")
        if v > max:
            raise FbnasError(f"{self.at(key)}: must be <= {max}, got {show(v)}")
        return v

    def float(self, key: str, default: Any = None, *, required: bool = False,
              min: float | None = None, gt: float | None = None, max: float | None = None,
              nullable: bool = False):
        v = self._get(key, default, required, nullable)
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise FbnasError(f"{self.at(key)}: expected a number, got {show(v)}")
        try:
            v = float(v)
        except OverflowError:  # an integer beyond float range
            raise FbnasError(f"{self.at(key)}: must be finite, got {show(v)}") from None
        if v != v or v in (float("inf"), float("-inf")):
            raise FbnasError(f"{self.at(key)}: must be finite, got {v}")
        if min is not None and v < min:
            raise FbnasError(f"{self.at(key)}: must be >= {min}, got {v}")
        if gt is not None and v <= gt:
            raise FbnasError(f"{self.at(key)}: must be > {gt}, got {v}")
        if max is not None and v > max:
            raise FbnasError(f"{self.at(key)}: must be <= {max}, got {v}")
        return v

    def str(self, key: str, default: Any = None, *, required: bool = False,
            choices: tuple[str, ...] | None = None):
        v = self._get(key, default, required)
        if v is None:
            return v
        if not isinstance(v, str):
            raise FbnasError(f"{self.at(key)}: expected a string, got {show(v)}")
        if choices is not None and v not in choices:
            raise FbnasError(f"{self.at(key)}: must be one of {', '.join(choices)}; got {show(v)}")
        return v

    def bool(self, key: str, default: Any = None, *, required: bool = False):
        v = self._get(key, default, required)
        if v is None:
            return v
        if not isinstance(v, bool):
            raise FbnasError(f"{self.at(key)}: expected true or false, got {show(v)}")
        return v

    def list(self, key: str, default: Any = None, *, required: bool = False, nonempty=False):
        v = self._get(key, default, required)
        if v is None:
            return v
        if not isinstance(v, list):
            raise FbnasError(f"{self.at(key)}: expected a list, got {show(v)}")
        if nonempty and not v:
            raise FbnasError(f"{self.at(key)}: must not be empty")
        return v

    def sub(self, key: str, *, required: bool = False) -> Fields:
        v = self._get(key, {}, required)
        if v is None:
            v = {}
        return Fields(v, self.at(key))

    def raw(self, key: str, default: Any = None, *, required: bool = False):
        return self._get(key, default, required)

    def schema(self, key: str, supported: int, remedy: str, older: str | None = None) -> int:
        """Read a file's schema version; another one raises with an upgrade message: `remedy`
        for a file newer than this fbnas reads, `older` (default `remedy`) for an older one."""
        if key not in self.data and (kind := file_kind(self.data)):
            raise FbnasError(f"{self.where}: missing key '{key}': it is {kind}")
        version = self.int(key, required=True)
        check_schema(self.at(key), version, supported, remedy, older)
        return version

    def done(self) -> None:
        """Raise if the mapping holds a key nobody asked for (a typo, usually)."""
        # `key: null` means "unset" (so `--set loss.alpha=null` can clear a key)
        unknown = [k for k in self.data if k not in self.used and self.data[k] is not None]
        if unknown:
            bad = unknown[0]
            name = bad if isinstance(bad, str) and len(bad) <= 60 else show(bad)
            raise FbnasError(f"{self.where}: unknown key '{name}' ({suggest(bad, self.used)})")


def suggest(name: Any, known: Iterable[str], what: str = "known keys") -> str:
    """'did you mean 'epochs'?' when `name` is close to one of `known`, else the list of them:
    what an unknown key or column's error adds."""
    close = (difflib.get_close_matches(name, list(known), n=1, cutoff=0.7)
             if isinstance(name, str) else [])
    if close:
        return f"did you mean '{close[0]}'?"
    return f"{what}: {', '.join(sorted(known)) or 'none'}"


# a config file's sections, in the order a resolved config writes them
SECTIONS = ("space", "data", "latency", "loss", "search", "retrain", "run")
# the devices a network trains on (retrain.device, search.device, `fbnas eval --device`)
DEVICES = ("auto", "cpu", "cuda")
# how a latency table turns its entries into a network's cost (fbnas.latency.table): as
# measured, with its affine calibration, or with the per-(layer, op) corrections on top of it
COST_MODELS = ("auto", "raw", "calibrated", "corrected")
# whether a search's fit to its target times networks (search.fit_measure, `fbnas sample
# --fit-measure`): auto does where this machine can time the table's device
FIT_MEASURES = ("auto", "on", "off")

# Numbers the settings, the library and the command line share, declared once:
# a network is on its latency target within ±3% (search.fit_tolerance, the fit's defaults), and
# the benchmark reads "of similar latency" (`--near`) and draws its bands (`--band-width`) so
LATENCY_TOLERANCE = 0.03
# interleaved rounds a timing takes per entry (the measurement protocol, `--rounds`)
TIMING_ROUNDS = 30
# probe networks timed end to end to fit a table's in-network context model (`--probes`)
CONTEXT_PROBES = 12


# the key each kind of fbnas file holds, what it is and the command that reads it
FILE_KINDS = {"fbnas_arch": ("an architecture file", "fbnas arch"),
              "fbnas_cost_table": ("a latency table", "fbnas latency show"),
              "fbnas_results": ("a results file", "fbnas runs"),
              "fbnas_bench": ("a benchmark file", "fbnas bench show")}


def file_kind(data: Any) -> str | None:
    """What kind of fbnas file a mapping read from disk is, with the command that reads it
    ("an architecture file (fbnas arch reads it)"); None where it is none of them."""
    if not isinstance(data, Mapping):
        return None
    for key, (what, reader) in FILE_KINDS.items():
        if key in data:
            return f"{what} ({reader} reads it)"
    if any(k in data for k in SECTIONS):
        return "a config (fbnas train --config reads it)"
    return None


def check_sections(data: Mapping[str, Any], source: str) -> None:
    """A config's top-level keys are its sections: an unknown one is an error naming it, the
    same for every command that reads a config (`fbnas train`, `fbnas space`, ...)."""
    unknown = [k for k in data if k not in SECTIONS]
    kind = file_kind(data)
    if unknown and kind and not kind.startswith("a config"):
        raise FbnasError(f"{source}: {kind}, not a config")
    if unknown:
        bad = unknown[0]
        raise FbnasError(f"{source}: unknown section '{bad if isinstance(bad, str) else show(bad)}'"
                         f" ({suggest(bad, SECTIONS, 'sections')})")


NOT_ADDED = object()  # `setting(added=...)` not given: old checkpoints have the key


def setting(default: Any, kind: str, *, key: str | None = None, resumable: bool = False,
            added: Any = NOT_ADDED, convert: Callable[[Any, str], Any] | None = None,
            **check: Any) -> Any:
    """A config dataclass field that `read_fields` reads: `kind` names the `Fields` getter
    (int, float, str, bool, list, raw), `check` its bounds (min, gt, max, choices, nullable,
    required), `key` the file's key when it differs from the attribute (`lambda` -> `lam`).
    `resumable`: a resumed run may change it (where or how a run runs, not what it computes);
    `added`: the value runs had before the key existed (old checkpoints lack it); `convert(value,
    where)`: checks and normalises a value read. The default is written once, here."""
    meta = {"kind": kind, "key": key, "check": check, "resumable": resumable, "convert": convert}
    if added is not NOT_ADDED:
        meta["added"] = added
    return dataclasses.field(default=default, metadata=meta)


def settings_of(cls: type) -> dict[str, dataclasses.Field]:
    """The `setting` fields of the dataclass `cls`, by the file's key."""
    return {fd.metadata["key"] or fd.name: fd for fd in dataclasses.fields(cls)
            if "kind" in fd.metadata}


def resumable_keys(cls: type) -> frozenset[str]:
    """The keys of `cls` a resumed run may change (declared `resumable=True`)."""
    return frozenset(k for k, fd in settings_of(cls).items() if fd.metadata["resumable"])


def added_values(cls: type) -> dict[str, Any]:
    """Keys of `cls` that old checkpoints lack, with the value those runs had."""
    return {k: fd.metadata["added"] for k, fd in settings_of(cls).items()
            if "added" in fd.metadata}


def read_setting(f: Fields, fd: dataclasses.Field, default: Any = NOT_ADDED) -> Any:
    """The setting field `fd` read from `f`, with its default (or `default` where given)."""
    meta, key = fd.metadata, fd.metadata["key"] or fd.name
    value = getattr(f, meta["kind"])(key, fd.default if default is NOT_ADDED else default,
                                     **meta["check"])
    convert = meta["convert"]
    return value if convert is None or value is None else convert(value, f.at(key))


def read_fields(cls: type, data: Any, at: str, **given: Any) -> Any:
    """Build the dataclass `cls` from the mapping `data` found at `at`, reading each `setting`
    field with its getter, default and bounds (in field order); `given` fills fields that are
    not settings. Unknown keys are errors naming the key (`Fields.done`)."""
    f = Fields({} if data is None else data, at)
    kwargs = dict(given)
    for fd in settings_of(cls).values():
        kwargs[fd.name] = read_setting(f, fd)
    f.done()
    return cls(**kwargs)


def setting_choices(cls: type, name: str) -> tuple[str, ...]:
    """The `choices` a `setting` field of the dataclass `cls` declares (a CLI flag's choices)."""
    fd = next(f for f in dataclasses.fields(cls) if f.name == name)
    return tuple(fd.metadata["check"]["choices"])
