"""What a resumed run may change: each trainer's policy as data, and the one check."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fbnas.config import section_types
from fbnas.errors import FbnasError
from fbnas.settings import added_values, resumable_keys


@dataclass(frozen=True)
class ResumePolicy:
    """`compared`: the config sections a resumed run must keep, but for the keys their
    settings declare `resumable` (where and how it runs, not what it computes); `also_kept`:
    single (section, key) pairs of other sections it must keep. A key older checkpoints lack
    counts as the value its setting declares `added`."""

    compared: tuple[str, ...]
    also_kept: tuple[tuple[str, str], ...] = ()

    @property
    def resumable(self) -> frozenset[tuple[str, str]]:
        """(section, key) pairs of `compared` a resumed run may change."""
        types = section_types()
        return frozenset((s, k) for s in self.compared for k in resumable_keys(types[s]))

    @property
    def added(self) -> dict[tuple[str, str], Any]:
        """(section, key) -> the value runs had before the key existed, for the keys kept."""
        types = section_types()
        out = {(s, k): v for s in self.compared for k, v in added_values(types[s]).items()}
        for s, k in self.also_kept:
            if k in (old := added_values(types[s])):
                out[(s, k)] = old[k]
        return out

    def check(self, saved: dict[str, Any], now: dict[str, Any], where: Path) -> None:
        added = self.added
        check_kept_settings(saved, now, self.compared, self.resumable, added, where)
        for section, key in self.also_kept:
            _keep(where, section, key, saved.get(section, {}).get(key, added.get(
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
