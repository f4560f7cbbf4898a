"""Networks to time end to end, from files: fbnas architectures, retrain checkpoints, fbnas
exports, and any TorchScript file or `torch.export` program (`.pt2`), so baselines and searched
networks are timed side by side in one interleaved measurement (`fbnas latency measure`).

A `ModelSpec` names what to load; `load_model` turns it into (architecture or None, module,
input shape) in whichever process times it (a TorchScript module cannot be sent to another
process, so a worker under another allocator loads its own copy). `measure_specs` times them
all together.
"""

from __future__ import annotations

import contextlib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fbnas.arch import Architecture, build_child
from fbnas.errors import FbnasError, first_line
from fbnas.evaluate import load_child
from fbnas.export import PteModule, exported_metadata, load_exported, require_extras
from fbnas.latency.allocator import under_allocator
from fbnas.latency.measure import Measurement, Protocol, measure
from fbnas.latency.runtimes import size_executorch_pool
from fbnas.latency.timers import Timer


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


def _pt2_shape(program, p: Path) -> tuple[int, ...]:
    """The (static) input shape a torch.export program was traced with."""
    spec = program.graph_signature
    names = set(spec.user_inputs)
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in names:
            val = node.meta.get("val")
            if val is not None and hasattr(val, "shape"):
                # -1 for a symbolic (dynamic) dimension, such as fbnas export's batch axis
                return tuple(-1 if isinstance(d, torch.SymInt) else int(d) for d in val.shape)
    raise FbnasError(f"{p}: the program has no tensor input to time")


def _static_shape(shape: tuple[int, ...], chw: tuple[int, int, int] | None, batch: int,
                  p: Path) -> tuple[int, int, int]:
    """C,H,W to time a program with: its traced input shape (checked against --input-shape
    and the timer's batch) or, for a dynamic one, `chw`."""
    if len(shape) == 4 and min(shape[1:]) > 0:
        if chw is not None and tuple(chw) != shape[1:]:
            raise FbnasError(f"{p}: exported for input {shape[1:]}, not --input-shape "
                             f"{','.join(map(str, chw))}")
        if shape[0] not in (batch, -1):
            raise FbnasError(f"{p}: exported for batch {shape[0]}, but the timer's batch "
                             f"is {batch}; export it for that batch or pass --batch "
                             f"{shape[0]}")
        return shape[1:]  # type: ignore[return-value]
    if chw is None:
        raise FbnasError(f"{p}: its input shape is dynamic; give --input-shape C,H,W")
    return tuple(chw)  # type: ignore[return-value]


class PteNet(nn.Module):
    """An ExecuTorch program as a module the timers can prepare (no parameters to move)."""

    def __init__(self, path: Path, threads: int = 1):
        super().__init__()
        if not path.is_file():
            raise FbnasError(f"{path}: no such file")
        require_extras("pte")
        size_executorch_pool(threads)  # before the program loads
        try:
            self._pte = PteModule(path)
            self.input_shape = self._pte.input_shape()
        except Exception as e:  # noqa: BLE001 - any failure to read is the file's
            raise FbnasError(f"{path}: cannot load as an ExecuTorch program "
                             f"({first_line(e)})") from None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._pte(x)


def load_model(spec: ModelSpec, batch: int, threads: int = 1
               ) -> tuple[Architecture | None, nn.Module, tuple[int, int, int]]:
    """(architecture if the file carries one, the module, C,H,W) for one spec. A `.pte` runs in
    ExecuTorch with its threadpool sized to `threads`."""
    p = Path(spec.path)
    if spec.kind == "arch":
        a = Architecture.load(p)
        torch.manual_seed(0)
        return a, build_child(a), (a.macro.in_channels, *a.macro.input_size)
    if p.suffix == ".onnx":
        raise FbnasError(f"{p}: ONNX models are timed by onnxruntime's own tools; give the "
                         "TorchScript or .pt2 export, or the retrain checkpoint")
    if p.suffix == ".pte":
        net = PteNet(p, threads)
        return None, net, _static_shape(net.input_shape, spec.input_shape, batch, p)
    if p.suffix == ".pt2":
        if not p.is_file():
            raise FbnasError(f"{p}: no such file")
        try:
            program = torch.export.load(str(p))
        except Exception as e:  # noqa: BLE001 - any failure to read is the file's
            raise FbnasError(f"{p}: cannot load as a torch.export program "
                             f"({first_line(e)})") from None
        a = None
        with contextlib.suppress(FbnasError):  # an fbnas export carries its architecture
            a = Architecture.from_dict(exported_metadata(p, "pt2")["arch"],
                                       f"{p}: embedded architecture")
        chw = spec.input_shape or (None if a is None
                                   else (a.macro.in_channels, *a.macro.input_size))
        chw = _static_shape(_pt2_shape(program, p), chw, batch, p)
        net = program.module()
        # A program runs the graph it was traced with, whatever its train/eval flag; torch
        # makes its train and eval methods raise, and the timer sets eval mode: drop them.
        for name in ("train", "eval"):
            net.__dict__.pop(name, None)
        return a, net, chw
    if p.is_dir() or p.suffix in (".pt", ".pth") and _is_checkpoint(p):
        a, net, _ = load_child(p)
        return a, net, (a.macro.in_channels, *a.macro.input_size)
    net = load_exported(p, "torchscript")
    try:
        meta = exported_metadata(p, "torchscript")
    except FbnasError:  # a TorchScript file fbnas did not write: time it as it is
        if spec.input_shape is None:
            raise FbnasError(f"{p}: a TorchScript model without an fbnas architecture inside; "
                             "give its input shape with --input-shape C,H,W") from None
        return None, net, spec.input_shape
    a = Architecture.from_dict(meta["arch"], f"{p}: embedded architecture")
    return a, net, (a.macro.in_channels, *a.macro.input_size)


@under_allocator
def measure_specs(timer: Timer, specs: list[ModelSpec], protocol: Protocol | None = None
                  ) -> tuple[list[dict], Measurement]:
    """Load every spec and time them all in one interleaved, drift-compensated measurement.
    Returns per spec {label, kind, path, hash (None for a plain model), input_shape} and the
    measurement (keyed by label)."""
    info, runs = [], {}
    for s in specs:
        a, net, chw = load_model(s, timer.batch, timer.threads)
        runs[s.label] = timer.prepare(net, chw, s.label)
        info.append({"label": s.label, "kind": s.kind, "path": s.path,
                     "hash": a.hash() if a is not None else None,
                     "arch": a.to_dict() if a is not None else None, "input_shape": list(chw)})
    return info, measure(timer, runs, protocol)


@under_allocator
def measure_modules(timer: Timer, modules: dict[str, tuple[nn.Module, tuple[int, int, int]]],
                    protocol: Protocol | None = None) -> Measurement:
    """Time in-memory modules (label -> (module, C,H,W)) in one interleaved measurement."""
    runs = {k: timer.prepare(m, chw, k) for k, (m, chw) in modules.items()}
    return measure(timer, runs, protocol)


@under_allocator
def measure_runtimes(timer: Timer, modules: dict[str, tuple[nn.Module, tuple[int, int, int]]],
                     runtimes: list[Timer], protocol: Protocol | None = None) -> Measurement:
    """Time every module in eager (`timer`) and in each exported runtime of `runtimes` (timers
    of `fbnas.latency.runtimes`, same threads and batch) in one interleaved measurement, so
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
