"""Checkpoints: atomic writes, safe loads (torch.load(weights_only=True)), and a retrain's
checkpoint opened as its network (`load_child`).

A checkpoint holds only tensors, numbers, strings, lists and dicts, so it loads with
`weights_only=True` and executes no code.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from fbnas.arch import Architecture, ChildNet, build_child
from fbnas.errors import FbnasError
from fbnas.io import atomic_write, check_schema, show
from fbnas.runs.files import RunFiles

CHECKPOINT_SCHEMA = 1


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write `state` atomically: a crash mid-write leaves the previous checkpoint intact, and a
    full disk is a one-line FbnasError (the previous checkpoint intact, no temp file left).

    The state is serialised in memory first: torch.save writing to a file turns the OSError of
    a full disk into an opaque RuntimeError."""
    state = {"fbnas_checkpoint": CHECKPOINT_SCHEMA, **state}
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getbuffer()
    atomic_write(path, lambda f: f.write(data), mode="wb")


# The keys each kind of checkpoint holds and their types, checked on load so that a damaged or
# hand-made file is a one-line error here rather than a KeyError deep in a trainer. REQUIRED
# keys must be present (a search checkpoint: all that resuming reads; a child checkpoint: what
# `fbnas eval` / `export` / `latency measure` read, the model and its architecture); the others
# are type-checked when present.
TYPES: dict[str, type | tuple[type, ...]] = {
    "epoch": int, "phase": str, "step": int, "model": dict, "w_opt": dict, "theta_opt": dict,
    "w_sched": dict, "opt": dict, "rng": dict, "config": dict, "cost_fingerprint": str,
    "history": list, "arch": dict, "partial": (dict, type(None)),
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "search": ("epoch", "phase", "step", "model", "w_opt", "theta_opt", "w_sched", "rng",
               "config", "cost_fingerprint", "history"),
    "child": ("model", "arch"),
}


def load_checkpoint(path: str | Path, kind: str | None = None) -> dict[str, Any]:
    """Load a checkpoint with weights_only=True (no code runs: only tensors and plain data
    load); errors name the file and are one line."""
    p = Path(path)
    if p.is_dir():
        raise FbnasError(f"{p}: is a directory, expected a checkpoint file")
    if not p.is_file():
        raise FbnasError(f"{p}: no checkpoint there")
    if p.stat().st_size == 0:
        raise FbnasError(f"{p}: corrupted or not a checkpoint (the file is empty)")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated/corrupted files
        raise FbnasError(f"{p}: corrupted or not a checkpoint ({_why_unloadable(p, e)})"
                         ) from None
    if not isinstance(state, dict) or "fbnas_checkpoint" not in state:
        raise FbnasError(f"{p}: not an fbnas checkpoint")
    check_schema(f"{p}: fbnas_checkpoint", state["fbnas_checkpoint"], CHECKPOINT_SCHEMA,
                 "upgrade fbnas to read it", "resume it with the fbnas that wrote it, or "
                 "start a new run")
    if kind is not None and state.get("kind") != kind:
        raise FbnasError(f"{p}: is a {show(state.get('kind'))} checkpoint, expected {kind!r}")
    kind_of = state.get("kind")
    for key in REQUIRED.get(kind_of, ()) if isinstance(kind_of, str) else ():
        if key not in state:
            raise FbnasError(f"{p}: damaged {state['kind']} checkpoint: missing key '{key}'")
    for key, typ in TYPES.items():
        v = state.get(key)
        if key in state and (not isinstance(v, typ) or (typ is int and isinstance(v, bool))):
            raise FbnasError(f"{p}: damaged checkpoint: '{key}' is a {type(v).__name__}")
    model = state.get("model")
    if isinstance(model, dict) and not all(isinstance(v, torch.Tensor) for v in model.values()):
        raise FbnasError(f"{p}: damaged checkpoint: 'model' holds values that are not tensors")
    return state


def _why_unloadable(p: Path, e: Exception) -> str:
    """What torch.load's exception means, in a few words (its own messages run to paragraphs
    with terminal escapes)."""

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    m = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if m:
        return (f"it holds a Python object ({m.group(1)}), and only tensors and plain data are "
                "loaded: loading it would run code, so it is refused")
    if "Weights only load failed" in text or not zipfile.is_zipfile(p):
        return "not a complete torch checkpoint archive: truncated, damaged or another format"
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return first[:160]


def load_child(path: str | Path, device: str | torch.device = "cpu"
               ) -> tuple[Architecture, ChildNet, dict[str, Any]]:
    """(architecture, child network with the checkpoint's weights in eval mode, raw state)
    from a retrain checkpoint (a file, or a retrain run directory holding checkpoint.pt)."""
    p = RunFiles.checkpoint_of(path)
    state = load_checkpoint(p, kind="child")
    arch = Architecture.from_dict(state["arch"], f"{p}: arch")
    model = build_child(arch)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise FbnasError(f"{p}: weights do not fit architecture {arch.short_hash} "
                         f"({first[:160]})") from None
    return arch, model.to(device).eval(), state
