"""File helpers: safe YAML/JSON loading with clear errors, and atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from fbnas.errors import FbnasError

MAX_TEXT_BYTES = 32 * 1024 * 1024  # config, arch and table files are small; refuse runaway input


def read_text(path: str | os.PathLike) -> str:
    """Read a UTF-8 text file, or raise FbnasError naming the file."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise FbnasError(f"{p}: no such file") from None
    except OSError as e:
        raise FbnasError(f"{p}: cannot read ({e.strerror})") from None
    if p.is_dir():
        raise FbnasError(f"{p}: is a directory, expected a file")
    if size > MAX_TEXT_BYTES:
        raise FbnasError(f"{p}: file is {size} bytes, larger than the {MAX_TEXT_BYTES} allowed")
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise FbnasError(f"{p}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise FbnasError(f"{p}: cannot read ({e.strerror})") from None


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Load a YAML mapping with yaml.safe_load; errors name the file and line."""
    text = read_text(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise FbnasError(f"{path}:{where}: malformed YAML ({problem})") from None
    if data is None:
        raise FbnasError(f"{path}: file is empty")
    if not isinstance(data, dict):
        raise FbnasError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_json(path: str | os.PathLike, expect: type = dict) -> Any:
    """Load JSON whose top level is `expect` (an object by default); errors name the file."""
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FbnasError(f"{path}: malformed JSON at line {e.lineno} ({e.msg})") from None
    if not isinstance(data, expect):
        what = "a JSON object" if expect is dict else f"a JSON {expect.__name__}"
        raise FbnasError(f"{path}: expected {what} at the top level")
    return data


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "w") -> None:
    """Write through a temp file in the same folder, fsync, then rename over `path`.

    A crash or a full disk leaves either the old file or the new one, never half of one.
    """
    p = Path(path)
    ensure_dir(p.parent)
    if p.is_dir():
        raise FbnasError(f"{p}: is a directory, cannot write a file there")
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def ensure_dir(path: str | os.PathLike) -> Path:
    """mkdir -p, or a one-line FbnasError naming the path."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FbnasError(f"{p}: cannot create directory ({e.strerror})") from None
    return p


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def write_yaml_atomic(path: str | os.PathLike, data: Mapping[str, Any]) -> None:
    write_text_atomic(path, yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=None))


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=False) + "\n")


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
            raise FbnasError(f"{self.at(key)}: expected an integer, got {v!r}")
        if min is not None and v < min:
            raise FbnasError(f"{self.at(key)}: must be >= {min}, got {v}")
        if v > max:
            raise FbnasError(f"{self.at(key)}: must be <= {max}, got {v}")
        return v

    def float(self, key: str, default: Any = None, *, required: bool = False,
              min: float | None = None, gt: float | None = None, max: float | None = None,
              nullable: bool = False):
        v = self._get(key, default, required, nullable)
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise FbnasError(f"{self.at(key)}: expected a number, got {v!r}")
        v = float(v)
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
            raise FbnasError(f"{self.at(key)}: expected a string, got {v!r}")
        if choices is not None and v not in choices:
            raise FbnasError(f"{self.at(key)}: must be one of {', '.join(choices)}; got {v!r}")
        return v

    def bool(self, key: str, default: Any = None, *, required: bool = False):
        v = self._get(key, default, required)
        if v is None:
            return v
        if not isinstance(v, bool):
            raise FbnasError(f"{self.at(key)}: expected true or false, got {v!r}")
        return v

    def list(self, key: str, default: Any = None, *, required: bool = False, nonempty=False):
        v = self._get(key, default, required)
        if v is None:
            return v
        if not isinstance(v, list):
            raise FbnasError(f"{self.at(key)}: expected a list, got {v!r}")
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

    def schema(self, key: str, supported: int, remedy: str) -> int:
        """Read a file's schema version; an unsupported one raises with an upgrade message."""
        version = self.int(key, required=True)
        if version != supported:
            raise FbnasError(f"{self.at(key)}: schema version {version} is not supported "
                             f"(this fbnas reads version {supported}; {remedy})")
        return version

    def done(self) -> None:
        """Raise if the mapping holds a key nobody asked for (a typo, usually)."""
        # `key: null` means "unset" (so `--set loss.alpha=null` can clear a key)
        unknown = [k for k in self.data if k not in self.used and self.data[k] is not None]
        if unknown:
            known = ", ".join(sorted(self.used)) or "none"
            raise FbnasError(f"{self.where}: unknown key '{unknown[0]}' (known keys: {known})")
