"""What a resumed run may change: each trainer's policy as data, and the one check."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fbnas.errors import FbnasError


@dataclass(frozen=True)
class ResumePolicy:
    """`compared`: the config sections a resumed run must keep; `resumable`: (section, key)
    pairs it may change (where and how it runs, not what it computes); `also_kept`: single
    (section, key) pairs of other sections it must keep; `added`: keys added since older
    checkpoints were written, with the value those runs had."""

    compared: tuple[str, ...]
    resumable: frozenset[tuple[str, str]]
    added: dict[tuple[str, str], Any] = field(default_factory=dict)
    also_kept: tuple[tuple[str, str], ...] = ()

    def check(self, saved: dict[str, Any], now: dict[str, Any], where: Path) -> None:
        check_kept_settings(saved, now, self.compared, self.resumable, self.added, where)
        for section, key in self.also_kept:
            _keep(where, section, key, saved.get(section, {}).get(key, self.added.get(
                (section, key))), now.get(section, {}).get(key))


def check_kept_settings(saved: dict[str, Any], now: dict[str, Any], sections: Sequence[str],
                        resumable: set[tuple[str, str]] | frozenset[tuple[str, str]],
                        added: dict[tuple[str, str], Any], where: Path) -> None:
    """A resumed run must keep its settings: every key of `sections` in the checkpoint's
    resolved config `saved` equals `now`'s, except the `resumable` ones; a key missing from an
    older checkpoint counts as its `added` value."""
    for section in sections:
        a, b = saved.get(section, {}), now.get(section, {})
        for key in sorted(set(a) | set(b)):
            if (section, key) not in resumable:
                _keep(where, section, key, a.get(key, added.get((section, key))), b.get(key))


def _keep(where: Path, section: str, key: str, old: Any, new: Any) -> None:
    if old != new:
        raise FbnasError(f"{where}: {section}.{key} was {old!r} in this run, now {new!r}; a "
                         "resumed run must keep its settings (start a new run to change them)")
