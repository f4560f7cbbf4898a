"""File helpers: safe YAML/JSON loading with clear errors, and atomic writes."""

from __future__ import annotations

import errno
import json
import os
import re
import reprlib
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from fbnas.errors import FbnasError

# Refuse runaway input before parsing it. Configs and architectures are a few KB of YAML (and
# PyYAML's safe loader parses pure Python, ~0.1-1 MB/s on a small machine); cost tables and
# results are JSON, which parses fast, and a large table is a few MB.
MAX_TEXT_BYTES = 32 * 1024 * 1024
MAX_YAML_BYTES = 1024 * 1024

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


def show(value: Any) -> str:
    """A short repr of a value from a file, for error messages: long strings, huge integers,
    deep or wide structures (a YAML alias bomb, a recursive one) are elided, never expanded."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        digits = int(abs(value).bit_length() * 0.30103) + 1
        return f"{'-' if value < 0 else ''}<an integer of about {digits} digits>"
    try:
        return _REPR.repr(value)
    except Exception:  # a value whose repr fails
        return f"<{type(value).__name__}>"


def is_number(value: Any) -> bool:
    """An int or a float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


# The kinds of value a declared field of a file holds (an architecture's meta, a results.json),
# each a test and the words an error uses: one table for every file fbnas declares the fields of.
VALUE_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "num": (is_number, "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "map": (lambda v: isinstance(v, Mapping), "an object"),
    "any": (lambda v: True, "anything"),
}


def read_text(path: str | os.PathLike, limit: int = MAX_TEXT_BYTES) -> str:
    """Read a UTF-8 text file (a byte-order mark is allowed), or raise FbnasError naming the
    file: missing, a directory, larger than `limit` bytes, unreadable or not UTF-8."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise FbnasError(f"{p}: no such file") from None
    except OSError as e:
        raise FbnasError(f"{p}: cannot read ({e.strerror or e})") from None
    if p.is_dir():
        raise FbnasError(f"{p}: is a directory, expected a file")
    if size > limit:
        raise FbnasError(f"{p}: file is {size} bytes, larger than the {limit} allowed for "
                         "this kind of file (is it the right file?)")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise FbnasError(f"{p}: cannot read ({e.strerror or e})") from None
    if len(data) > limit:  # it grew since stat (or is a special file)
        raise FbnasError(f"{p}: file is larger than the {limit} bytes allowed")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise FbnasError(f"{p}: not UTF-8 text (byte {e.start})") from None


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Load a YAML mapping with yaml.safe_load; errors name the file and line."""
    text = read_text(path, MAX_YAML_BYTES)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        msg = str(e).strip()
        problem = (getattr(e, "problem", None) or (msg.splitlines()[0] if msg else "")
                   or type(e).__name__)
        raise FbnasError(f"{path}:{where} malformed YAML ({problem})") from None
    except RecursionError:
        raise FbnasError(f"{path}: malformed YAML (nested too deeply)") from None
    except (ValueError, TypeError, OverflowError) as e:  # a scalar its tag cannot hold:
        # `2001-13-45` (a date), `!!int x`, an integer of more than 4300 digits
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FbnasError(f"{path}: malformed YAML (a value cannot be read: {first[:120]})"
                         ) from None
    if data is None:
        raise FbnasError(f"{path}: file is empty")
    if not isinstance(data, dict):
        raise FbnasError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    _refuse_duplicate_keys(text, path)
    return data


def _refuse_duplicate_keys(text: str, path: str | os.PathLike) -> None:
    """YAML lets a key repeat (the last one wins): a second `search:` section would silently
    replace the first. Walk the node tree (yaml.compose builds nodes, constructs nothing) and
    refuse a repeated key, naming both lines."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], int] = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    first = seen.setdefault((k.tag, k.value), k.start_mark.line + 1)
                    if first != k.start_mark.line + 1:
                        raise FbnasError(f"{path}: line {k.start_mark.line + 1}: key "
                                         f"{show(k.value)} repeats the one on line {first}")
                stack.append(v)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


YAML_START = re.compile(r"\A\s*(?:#[^\n]*\n\s*)*[A-Za-z_][\w-]*\s*:(?:\s|$)")


def load_json(path: str | os.PathLike, expect: type = dict) -> Any:
    """Load JSON whose top level is `expect` (an object by default); errors name the file."""
    text = read_text(path)
    if not text.strip():
        raise FbnasError(f"{path}: file is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        # a YAML file given where JSON is read: its first line (after comments) is `key:`
        yaml_file = YAML_START.match(text) is not None
        hint = "; it is YAML (a config or an architecture file?), not JSON" if yaml_file else ""
        raise FbnasError(f"{path}: malformed JSON at line {e.lineno} ({e.msg}){hint}") from None
    except RecursionError:
        raise FbnasError(f"{path}: malformed JSON (nested too deeply)") from None
    except ValueError as e:  # an integer of more than 4300 digits
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FbnasError(f"{path}: malformed JSON (a value cannot be read: {first[:120]})"
                         ) from None
    if not isinstance(data, expect):
        what = "a JSON object" if expect is dict else f"a JSON {expect.__name__}"
        raise FbnasError(f"{path}: expected {what} at the top level, got "
                         f"{type(data).__name__}")
    return data


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "w") -> None:
    """Write through a temp file in the same folder, fsync, then rename over `path`.

    A crash or a full disk leaves either the old file or the new one, never half of one; a
    failed write (disk full, permissions) removes the temp file and raises a one-line
    FbnasError naming `path`. Only a process killed outright (SIGKILL, power loss) can leave a
    `.NAME.*.tmp` file behind, which nothing ever reads.
    """
    p = Path(path)
    ensure_dir(p.parent)
    if p.is_dir():
        raise FbnasError(f"{p}: is a directory, cannot write a file there")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as e:
        raise FbnasError(f"{p}: cannot write ({_why(e)})") from None
    try:
        try:
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
            f = os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
        except BaseException:
            os.close(fd)
            raise
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and not isinstance(e, FbnasError):
            kept = "the previous file is unchanged" if p.exists() else "nothing was written"
            raise FbnasError(f"{p}: cannot write ({_why(e)}); {kept}") from None
        raise


def _why(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "no space left on device"
    return e.strerror or str(e) or type(e).__name__


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


def check_schema(where: str, version: Any, supported: int, newer: str,
                 older: str | None = None) -> None:
    """Raise unless `version` is `supported`: a file from a newer fbnas says to upgrade, one
    from an older fbnas says how to bring it up to date."""
    if type(version) is not int:
        raise FbnasError(f"{where}: schema version must be an integer, got {show(version)}")
    if version == supported:
        return
    if version > supported:
        raise FbnasError(f"{where}: schema version {show(version)} is not supported: the file "
                         f"was written by a newer fbnas (this one reads version {supported}; "
                         f"{newer})")
    raise FbnasError(f"{where}: schema version {show(version)} is not supported: the file is "
                     f"older than this fbnas reads (version {supported}; {older or newer})")


def clock(seconds: float) -> str:
    """A duration as a clock reads it: m:ss, or h:mm:ss from an hour (progress lines)."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


# ---- the configs that ship with the package ------------------------------------------------------
SHIPPED_CONFIGS = Path(__file__).resolve().parent / "configs"


def shipped_configs() -> dict[str, Path]:
    """The configs installed with fbnas, by name (the file name without .yaml)."""
    if not SHIPPED_CONFIGS.is_dir():
        return {}
    return {p.stem: p for p in sorted(SHIPPED_CONFIGS.glob("*.yaml"))}


def shipped_config(name: str) -> Path | None:
    """The shipped config called `name` (`quickstart` or `quickstart.yaml`), or None."""
    if "/" in name:
        return None
    return shipped_configs().get(name.removesuffix(".yaml"))


def config_summary(path: Path) -> str:
    """A config's first comment line: what it is, in one line."""
    for line in read_text(path).splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").rstrip()
        if line.strip():
            break
    return ""


def config_file(value: str | os.PathLike) -> str:
    """A `--config` value as a file: the file itself when it exists, else the shipped config of
    that name (`quickstart` or `quickstart.yaml`). FbnasError naming both when neither is."""
    value = os.fspath(value)
    if Path(value).exists():
        return value
    shipped = shipped_config(value)
    if shipped is not None:
        return str(shipped)
    raise FbnasError(f"{value}: no such file, and no shipped config of that name (shipped: "
                     f"{', '.join(shipped_configs()) or 'none'}; `fbnas configs` lists them)")


BASE_KEY = "base"  # a config's `base: NAME`: the config it takes every setting from first


def load_config_data(value: str | os.PathLike) -> tuple[str, dict[str, Any]]:
    """A `--config` value (a file, or a shipped config's name) read as a mapping, with its
    `base:` config (a file beside it, or a shipped config's name: `base: quickstart`) under it:
    the file's mappings merged into the base's key by key, any other value (a list, a number)
    replacing the base's. A base may have a base; a chain that comes back is an error."""
    path = config_file(value)
    return path, _with_base(load_yaml(path), path, [path])


def _with_base(data: dict[str, Any], path: str, chain: list[str]) -> dict[str, Any]:
    if not isinstance(data, dict) or BASE_KEY not in data:
        return data
    data = dict(data)
    ref = data.pop(BASE_KEY)
    if not isinstance(ref, str) or not ref.strip():
        raise FbnasError(f"{path}: {BASE_KEY}: give a config file or a shipped config's name, "
                         f"got {show(ref)}")
    beside = Path(path).parent / ref
    try:
        base_path = str(beside) if beside.is_file() else config_file(ref)
    except FbnasError as e:
        raise FbnasError(f"{path}: {BASE_KEY}: {e}") from None
    if any(os.path.samefile(base_path, p) for p in chain):
        raise FbnasError(f"{path}: {BASE_KEY}: {ref} comes back to a config of its own chain "
                         f"({' -> '.join([*chain, base_path])})")
    base = _with_base(load_yaml(base_path), base_path, [*chain, base_path])
    return merged(base, data)


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` merged into `base`: mappings key by key, any other value replacing the base's."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
