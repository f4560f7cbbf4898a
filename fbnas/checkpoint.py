"""Checkpoints: atomic writes, safe loads (torch.load(weights_only=True)), RNG state capture.

A checkpoint holds only tensors, numbers, strings, lists and dicts, so it loads with
`weights_only=True` and executes no code.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fbnas.errors import FbnasError
from fbnas.io import atomic_write

CHECKPOINT_SCHEMA = 1


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write `state` atomically: a crash mid-write leaves the previous checkpoint intact."""
    state = {"fbnas_checkpoint": CHECKPOINT_SCHEMA, **state}
    atomic_write(path, lambda f: torch.save(state, f), mode="wb")


def load_checkpoint(path: str | Path, kind: str | None = None) -> dict[str, Any]:
    """Load a checkpoint with weights_only=True; errors name the file."""
    p = Path(path)
    if not p.is_file():
        raise FbnasError(f"{p}: no checkpoint there")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated/corrupted files
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FbnasError(f"{p}: corrupted or not a checkpoint ({msg[:160]})") from None
    if not isinstance(state, dict) or "fbnas_checkpoint" not in state:
        raise FbnasError(f"{p}: not an fbnas checkpoint")
    if state["fbnas_checkpoint"] != CHECKPOINT_SCHEMA:
        raise FbnasError(f"{p}: checkpoint schema {state['fbnas_checkpoint']} is not supported "
                         f"(this fbnas reads {CHECKPOINT_SCHEMA})")
    if kind is not None and state.get("kind") != kind:
        raise FbnasError(f"{p}: is a {state.get('kind')!r} checkpoint, expected {kind!r}")
    return state
