"""Registries: every extension point of fbnas is one (blocks, timer backends, export formats,
cost kinds, losses, search modes).

    TIMERS = Registry("timer backend", "latency.device")

    @TIMERS.register("cpu", host=True)
    class CpuTimer(Timer): ...

    TIMERS.get("cpu")            # the class; an unknown name is a one-line FbnasError
    TIMERS.choices()             # ("cpu", ...), in registration order
    TIMERS.attr("cpu", "host")   # what the registration said of it

    # or declared by where it lives, imported the first time it is used: the names (and what
    # the registration says of them) are known without importing torch, so `--help` is instant
    TIMERS.register("cpu", at="fbnas.backends.cpu:CpuTimer")

A duplicate name raises. A registry is also what a config setting or an argparse flag takes
its choices from (`setting(..., choices=TIMERS)`, `choices=TIMERS.choices()`), so adding an
entry is one registration and no list anywhere else.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from fbnas.errors import FbnasError

T = TypeVar("T")


def located(at: str) -> Any:
    """The object "module:attribute" names, its module imported (once: Python caches it)."""
    module, _, attr = at.partition(":")
    return getattr(importlib.import_module(module), attr)


class Entry(Generic[T]):
    """One registration: the name, the registered object and what was said of it. An entry
    registered `at` "module:attribute" imports its object the first time `obj` is read."""

    def __init__(self, name: str, obj: T | None = None, attrs: dict[str, Any] | None = None,
                 at: str | None = None):
        self.name, self.attrs, self.at = name, dict(attrs or {}), at
        self._obj = obj

    @property
    def obj(self) -> T:
        if self._obj is None and self.at is not None:
            self._obj = located(self.at)
        return self._obj  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"Entry({self.name!r}, {self.at or self._obj!r})"


class Registry(Generic[T]):
    """Name -> object, in registration order. `what` names the kind of thing in errors
    ("timer backend"); `key` is the config key or flag that picks one (e.g. "latency.device")."""

    def __init__(self, what: str, key: str | None = None):
        self.what, self.key = what, key
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, obj: T | None = None, *, at: str | None = None,
                 **attrs: Any) -> Any:
        """Register `obj` under `name` (with `attrs`); with `at` ("module:attribute"), the
        object that attribute holds, imported when first used; with neither, a decorator that
        registers what it decorates. A name registered already raises ValueError."""

        def add(o: T | None) -> T | None:
            if name in self._entries:
                raise ValueError(f"{self.what} {name!r} is already registered")
            self._entries[name] = Entry(name, o, attrs, at)
            return o

        if at is not None:
            add(None)
            return None
        if obj is None:
            return add
        return add(obj)

    def unregister(self, name: str) -> None:
        """Remove `name` (a test's temporary entry, a plugin being reloaded)."""
        self.entry(name)
        del self._entries[name]

    def entry(self, name: str, where: str | None = None) -> Entry[T]:
        """The registration of `name`; an unknown one is a one-line error naming the choices
        (and `where`, or the registry's key)."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            at = where or self.key
            prefix = f"{at}: " if at else ""
            raise FbnasError(f"{prefix}unknown {self.what} {name!r} (choose from "
                             f"{', '.join(self._entries)})") from None

    def get(self, name: str, where: str | None = None) -> T:
        return self.entry(name, where).obj

    def attr(self, name: str, key: str, default: Any = None) -> Any:
        return self.entry(name).attrs.get(key, default)

    def choices(self, **having: Any) -> tuple[str, ...]:
        """The registered names, in registration order; with `having`, only those whose
        attributes equal the given values."""
        return tuple(n for n, e in self._entries.items()
                     if all(e.attrs.get(k) == v for k, v in having.items()))

    def items(self) -> Iterator[tuple[str, T]]:
        return ((n, e.obj) for n, e in self._entries.items())

    def find(self, pred: Callable[[Entry[T]], bool]) -> Entry[T] | None:
        """The first entry for which `pred` holds, or None."""
        return next((e for e in self._entries.values() if pred(e)), None)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self._entries)})"


def lazy_exports(package: str, names: dict[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's `__getattr__` and `__dir__` that re-export `names` (name -> the module that
    defines it), each imported the first time it is asked for, so importing the package
    imports none of them (`fbnas`, `fbnas.latency`)."""

    def getattr_(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return getattr_, dir_
