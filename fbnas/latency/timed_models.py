"""Networks to time end to end, from files: fbnas architectures, retrain checkpoints, fbnas
exports, and any TorchScript file or `torch.export` program (`.pt2`), so baselines and searched
networks are timed side by side in one interleaved measurement (`fbnas latency measure`).

A `ModelSpec` names what to load; `load_model` turns it into (architecture or None, module,
input shape) in whichever process times it (a TorchScript module cannot be sent to another
process, so a worker under another allocator loads its own copy). `measure_specs` times them
all together.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fbnas.arch import Architecture, build_child
from fbnas.backends import FORMATS, Timer
from fbnas.backends.base import input_chw
from fbnas.backends.worker import under_allocator
from fbnas.errors import FbnasError
from fbnas.latency.measure import Measurement, Protocol, measure
from fbnas.training.checkpoint import load_child


@dataclass(frozen=True)
class ModelSpec:
    """One network to time: `kind` is arch (a YAML file, a fresh child) or model (a file)."""

    label: str
    kind: str
    path: str
    input_shape: tuple[int, int, int] | None = None  # C,H,W for files that carry none


def parse_input_shape(raw: str | None, where: str = "--input-shape"
                      ) -> tuple[int, int, int] | None:
    """'3,224,224' (or 3x224x224) -> (3, 224, 224); one-line error otherwise."""
    if raw is None:
        return None
    parts = str(raw).replace("x", ",").replace(" ", "").split(",")
    try:
        dims = tuple(int(v) for v in parts)
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise FbnasError(f"{where}: expected C,H,W as three positive integers "
                         f"(e.g. 3,224,224), got {raw!r}")
    return dims  # type: ignore[return-value]


def _is_checkpoint(p: Path) -> bool:
    try:
        with zipfile.ZipFile(p) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile):
        return True  # let the checkpoint loader say what is wrong with it
    return not any(n.endswith("constants.pkl") or "/code/" in n for n in names)


def load_model(spec: ModelSpec, batch: int, threads: int = 1
               ) -> tuple[Architecture | None, nn.Module, tuple[int, int, int]]:
    """(architecture if the file carries one, the module, C,H,W) for one spec: a fresh child of
    an architecture, a retrain checkpoint, or an exported file as its format (by suffix; any
    other file is tried as TorchScript) hands it over (`Format.timed_module`; a `.pte` runs in
    ExecuTorch with its threadpool sized to `threads`)."""
    p = Path(spec.path)
    if spec.kind == "arch":
        a = Architecture.load(p)
        torch.manual_seed(0)
        return a, build_child(a), input_chw(a)
    if p.is_dir() or p.suffix in (".pt", ".pth") and _is_checkpoint(p):
        a, net, _ = load_child(p)
        return a, net, input_chw(a)
    e = FORMATS.find(lambda e: p.suffix in e.obj.suffixes)
    fmt = e.obj if e is not None else FORMATS.get("torchscript")
    return fmt.timed_module(p, spec.input_shape, batch, threads)


@under_allocator
def measure_specs(timer: Timer, specs: list[ModelSpec], protocol: Protocol | None = None,
                  beside: dict[str, tuple[nn.Module, tuple[int, int, int]]] | None = None
                  ) -> tuple[list[dict], Measurement]:
    """Load every spec and time them all in one interleaved, drift-compensated measurement,
    with the in-memory modules `beside` (label -> (module, C,H,W): a table's probe networks).
    Returns per spec {label, kind, path, hash (None for a plain model), input_shape} and the
    measurement (keyed by label)."""
    info, runs = [], {k: timer.prepare(mod, chw, k) for k, (mod, chw) in (beside or {}).items()}
    for s in specs:
        a, net, chw = load_model(s, timer.batch, timer.threads)
        runs[s.label] = timer.prepare(net, chw, s.label)
        info.append({"label": s.label, "kind": s.kind, "path": s.path,
                     "hash": a.hash() if a is not None else None,
                     "arch": a.to_dict() if a is not None else None, "input_shape": list(chw)})
    return info, measure(timer, runs, protocol)


@under_allocator
def measure_modules(timer: Timer, modules: dict[str, tuple[nn.Module, tuple[int, int, int]]],
                    protocol: Protocol | None = None, watch: list[str] | None = None
                    ) -> Measurement:
    """Time in-memory modules (label -> (module, C,H,W)) in one interleaved measurement
    (`watch`: the labels an early stop waits for, `measure`)."""
    runs = {k: timer.prepare(m, chw, k) for k, (m, chw) in modules.items()}
    return measure(timer, runs, protocol, watch=watch)


@under_allocator
def measure_runtimes(timer: Timer, modules: dict[str, tuple[nn.Module, tuple[int, int, int]]],
                     runtimes: list[Timer], protocol: Protocol | None = None) -> Measurement:
    """Time every module in eager (`timer`) and in each exported runtime of `runtimes` (timers
    such as ort and executorch, same threads and batch) in one interleaved measurement, so
    that the runtimes are compared side by side, under the same drift. Keys are
    'BACKEND:label'. The runtime timers share the eager timer's clock (they sample with it)."""
    for rt in runtimes:
        if (rt.threads, rt.batch) != (timer.threads, timer.batch):
            raise FbnasError(f"measure_runtimes: {rt.backend} times {rt.threads} thread(s), "
                             f"batch {rt.batch}; eager {timer.threads}, batch {timer.batch}")
    runs = {}
    for t in (timer, *runtimes):
        for k, (m, chw) in modules.items():
            runs[f"{t.backend}:{k}"] = t.prepare(m, chw, f"{t.backend}:{k}")
    return measure(timer, runs, protocol)
