"""What the scripts share: device sync and timing, interleaved rounds, spread statistics,
synthetic trainers and batches, the supernet-vs-parts measurement, saved-activation bytes,
and running another checkout's fbnas in a child process.

Every script runs from the repository root as `python -m scripts.NAME`; none edits sys.path.
A script that times another checkout's fbnas starts a child process whose PYTHONPATH names
that checkout (`with_code`).

The fbnas names imported here exist in older checkouts too (scripts/speed/gpu.py --code runs
this module under a baseline's fbnas).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

import fbnas
from fbnas.arch import Architecture, arch_from_indices
from fbnas.config import Config, apply_overrides, config_from_dict, load_config
from fbnas.io import load_config_data
from fbnas.latency.counted import build_cost_table
from fbnas.retrain import ChildTrainer
from fbnas.search_space import SearchSpace
from fbnas.supernet import Supernet
from fbnas.trainer import SearchTrainer
from fbnas.training.logs import close_logger

ROOT = Path(__file__).resolve().parents[1]
SPACES = {n: ROOT / "configs" / f"{n}.yaml"
          for n in ("quickstart", "fbnet_cifar10", "fbnet_imagenet")}
# the shipped ground-truth benchmark: its config and its file
BENCH_CONFIG = ROOT / "configs" / "bench_digits.yaml"
BENCH_FILE = ROOT / "configs" / "bench_digits.json.gz"

# a run that prints no progress bars and writes no TensorBoard files
QUIET = ["run.progress=false", "run.tensorboard=false"]
T = TypeVar("T")


def space_config(name: str) -> Path:
    """A shipped config by its space's name (SPACES), or a config file."""
    return SPACES.get(name) or Path(name)


# ---- clocks ------------------------------------------------------------------------------------
def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA; the CPU runs synchronously)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device | str = "cpu") -> float:
    """Seconds one call of `fn` takes, the device synchronised before and after. A `fn` that
    returns a float has timed itself (e.g. a sum of parts each timed alone): that is returned."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out if isinstance(out, float) else time.perf_counter() - t0


def alternate(items: Sequence[T], r: int) -> list[T]:
    """`items` in round r's order: forward on even rounds, reversed on odd ones, so a slow
    spell of the machine hits every item alike."""
    return list(items) if r % 2 == 0 else list(items)[::-1]


def interleave(jobs: dict[Any, Callable[[], Any]], rounds: int,
               device: torch.device | str = "cpu", *, warmup: int = 0,
               before: Callable[[Any], None] | None = None,
               after: Callable[[Any], None] | None = None,
               on_round: Callable[[int, dict[Any, float]], None] | None = None
               ) -> dict[Any, list[float]]:
    """Time every job once per round, in `alternate` order, after `warmup` untimed rounds:
    {job: seconds per round}. `before(name)` / `after(name)` run around each timed call
    (outside the clock); `on_round(r, {job: seconds})` after each timed round."""
    times: dict[Any, list[float]] = {k: [] for k in jobs}
    for r in range(warmup + rounds):
        got = {}
        for k in alternate(list(jobs), r):
            if before is not None:
                before(k)
            got[k] = timed(jobs[k], device)
            if after is not None:
                after(k)
        if r >= warmup:
            for k, v in got.items():
                times[k].append(v)
            if on_round is not None:
                on_round(r - warmup, got)
    return times


# ---- statistics ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spread:
    """Median, range and quartiles of repeated measurements. Quartiles as
    statistics.quantiles(n=4) (`inclusive`: as numpy.percentile's default); one value is its
    own quartiles."""

    median: float
    lo: float
    hi: float
    q1: float
    q3: float

    @classmethod
    def of(cls, xs: Sequence[float], inclusive: bool = False) -> Spread:
        xs = [float(x) for x in xs]
        q = (statistics.quantiles(xs, n=4, method="inclusive" if inclusive else "exclusive")
             if len(xs) > 1 else [xs[0]] * 3)
        return cls(statistics.median(xs), min(xs), max(xs), q[0], q[2])

    @property
    def rel_iqr(self) -> float:
        """(q3 - q1) / median."""
        return (self.q3 - self.q1) / self.median

    def range(self, fmt: str = ".3f", scale: float = 1.0) -> str:
        """'median (min-max)'."""
        return (f"{self.median * scale:{fmt}} ({self.lo * scale:{fmt}}-"
                f"{self.hi * scale:{fmt}})")

    def iqr(self, fmt: str = ".3f") -> str:
        """'median (IQR q1-q3, min lo, max hi)'."""
        return (f"{self.median:{fmt}} (IQR {self.q1:{fmt}}-{self.q3:{fmt}}, min "
                f"{self.lo:{fmt}}, max {self.hi:{fmt}})")


# ---- configs and trainers on synthetic data ------------------------------------------------------
def synthetic_sets(batch: int, size: int, device: str, run_dir: str | Path) -> list[str]:
    """Overrides for a quiet run on `size` synthetic images in batches of `batch` (no loader
    workers), with the FLOPs cost (nothing measured), on `device`, in `run_dir`."""
    return ["data.dataset=synthetic", f"data.synthetic_size={size}", f"data.batch_size={batch}",
            "data.workers=0", "latency.cost=flops", f"search.device={device}",
            f"run.dir={run_dir}", *QUIET]


def run_config(config: str | Path, sets: Sequence[str] = (),
               space: SearchSpace | None = None) -> Config:
    """The config file with `--set`-style overrides; `space` replaces its space (e.g. a
    `truncated` one)."""
    if space is None:
        return load_config(config, list(sets))
    raw = {**load_config_data(config)[1], "space": space.to_dict()}
    return config_from_dict(apply_overrides(raw, list(sets)), str(config))


def configured_mode(mode: str) -> str:
    """The search.mode to configure for timing `mode`'s steps: `mode` itself, or, for one that
    search.mode refuses as the θ mode (single_path), reinforce, whose trainer
    `search_trainer(sampler=mode)` then switches to `mode`'s sampler (θ steps through its
    relaxation, as GDAS runs them). An older checkout (speed.gpu --code) knows no refusal."""
    try:
        from fbnas.search.modes import get_mode
    except ImportError:  # a checkout from before fbnas/search/ (e4987fe): nothing refused
        return mode
    return "reinforce" if getattr(get_mode(mode), "refused", "") else mode


def search_trainer(cfg: Config, theta_active: bool = True, sampler: str | None = None,
                   **kw: Any) -> SearchTrainer:
    """A SearchTrainer in cfg.run.dir; with `theta_active`, past the warm-up epochs (the
    weight steps sample paths as the search mode does, θ steps are on); `sampler`: the
    registered mode its steps sample paths with instead of search.mode's
    (`configured_mode`)."""
    t = SearchTrainer(cfg, cfg.run.dir, **kw)
    if theta_active:
        t.epoch = cfg.search.warmup_epochs
    if sampler is not None:
        t.net.mode = sampler
    return t


def search_step(t: SearchTrainer, x: torch.Tensor, y: torch.Tensor, steps: int = 1) -> None:
    """`steps` x (SearchTrainer.weight_step + theta_step): what `fbnas train` runs."""
    for _ in range(steps):
        t.weight_step(x, y)
        t.theta_step(x, y)


def first_batch(t: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The first batch of a trainer's weight loader, on its device."""
    x, y = next(iter(t.data.w_loader))
    return x.to(t.device), y.to(t.device)


@contextlib.contextmanager
def closing(trainers: Any) -> Iterator[Any]:
    """Close the run logs of the trainers in `trainers` (a dict or list, filled inside)."""
    try:
        yield trainers
    finally:
        for t in (trainers.values() if isinstance(trainers, dict) else trainers):
            close_logger(t.log)


def random_batch(space: SearchSpace, batch: int, device: torch.device | str = "cpu",
                 generator: torch.Generator | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """N(0, 1) images of the space's input shape and uniform labels."""
    m = space.macro
    x = torch.randn(batch, m.in_channels, *m.input_size, generator=generator).to(device)
    y = torch.randint(m.num_classes, (batch,), generator=generator).to(device)
    return x, y


def truncated(space: SearchSpace, n: int) -> tuple[SearchSpace, str]:
    """The space with n searchable layers (stem and head kept), and a note saying how.

    n >= number of stages: every stage keeps at least one layer (so every stride, and the
    head's input resolution, is as in the full space) and repeats are cut in proportion.
    n < number of stages: n stages, strided ones first, one layer each.
    """
    if n <= 0 or n >= space.num_layers:
        return space, ""
    d = space.to_dict()
    stages = d["stages"]
    if n >= len(stages):
        counts = [1] * len(stages)
        while sum(counts) < n:  # give a layer to the stage furthest below its share
            i = max((i for i, st in enumerate(stages) if counts[i] < st["repeats"]),
                    key=lambda i: (stages[i]["repeats"] - counts[i]) / stages[i]["repeats"])
            counts[i] += 1
        how = f"repeats per stage {counts} instead of {[st['repeats'] for st in stages]}"
    else:
        order = sorted(range(len(stages)), key=lambda i: (stages[i]["stride"] == 1, i))
        keep = set(order[:n])
        counts = [1 if i in keep else 0 for i in range(len(stages))]
        how = (f"one layer from each of stages {sorted(keep)} (strided first; the other "
               "stages dropped)")
    d["stages"] = [{**st, "repeats": c} for st, c in zip(stages, counts, strict=True) if c]
    d["name"] = f"{d['name']}-{n}layers"
    return SearchSpace.from_dict(d, "truncated space"), how


# ---- the supernet against the sum of its parts ---------------------------------------------------
def supernet_fwd_bwd(net: Supernet, x: torch.Tensor, y: torch.Tensor, tau: float = 1.0
                     ) -> None:
    """One full-mode forward + CE backward of the supernet, m without grad (as in a weight
    step), gradients dropped."""
    with torch.no_grad():
        m = net.sample_weights(tau)
    logits, _ = net(x, m=m)
    F.cross_entropy(logits, y).backward()
    net.zero_grad(set_to_none=True)


class Parts:
    """The supernet's parts, each on a random input of its shape: the stem, every candidate
    block of every layer, the head. A call times each part's own forward + backward of
    out.sum() alone and returns the sum (seconds); calls alternate the parts' order."""

    def __init__(self, net: Supernet, space: SearchSpace, x: torch.Tensor):
        b, dev = x.shape[0], x.device
        self.device, self.calls = dev, 0
        self.parts: list[tuple[str, torch.nn.Module, torch.Tensor]] = [("stem", net.stem, x)]
        for la, mixed in zip(space.layers(), net.mixed, strict=True):
            inp = torch.randn(b, la.c_in, la.h, la.w, device=dev, requires_grad=True)
            self.parts += [(f"L{la.index}:{name}", block, inp)
                           for name, block in zip(mixed.op_names, mixed.candidates, strict=True)]
        c, _, h, w, _ = space.macro.head_shape()
        self.parts.append(("head", net.head, torch.randn(b, c, h, w, device=dev,
                                                         requires_grad=True)))

    @property
    def blocks(self) -> int:
        """Candidate blocks among the parts (stem and head aside)."""
        return len(self.parts) - 2

    @staticmethod
    def step(module: torch.nn.Module, inp: torch.Tensor) -> None:
        out = module(inp)
        if out.requires_grad:  # an identity skip on an input without grad has no graph
            out.float().sum().backward()
        module.zero_grad(set_to_none=True)
        inp.grad = None

    def __call__(self) -> float:
        order = alternate(self.parts, self.calls)
        self.calls += 1
        return sum(timed(lambda m=m, i=i: self.step(m, i), self.device) for _, m, i in order)


# ---- activations saved for backward --------------------------------------------------------------
class SavedBytes:
    """Distinct storages autograd saves for backward while in use (`with SavedBytes(net) as
    s: forward`), parameters and buffers excluded, attributed to the MixedOp layer that saved
    them first (None: stem, head, loss); `inputs`: each layer's input storage."""

    def __init__(self, net: Supernet):
        self.exclude = {self.key(t)[0] for t in (*net.parameters(), *net.buffers())}
        self.owner: dict[int, int | None] = {}  # storage key -> layer that saved it first
        self.by_layer: dict[int | None, int] = defaultdict(int)
        self.inputs: dict[int, tuple[int, int]] = {}  # layer -> (storage key, bytes)
        self.layer: int | None = None
        self.net = net
        self.handles: list[Any] = []
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    @staticmethod
    def key(t: torch.Tensor) -> tuple[int, int]:
        """(storage address, bytes); opaque (e.g. mkldnn) tensors by identity."""
        try:
            st = t.untyped_storage()
            return st.data_ptr(), st.nbytes()
        except (RuntimeError, NotImplementedError):
            return id(t), t.numel() * t.element_size()

    def enter(self, li: int) -> Callable:
        def hook(_mod, args):
            self.layer = li
            self.inputs[li] = self.key(args[0])
        return hook

    def leave(self, *_: Any) -> None:
        self.layer = None

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key, nbytes = self.key(t)
        if key not in self.exclude and key not in self.owner:
            self.owner[key] = self.layer
            self.by_layer[self.layer] += nbytes
        return t

    def total(self) -> int:
        return sum(self.by_layer.values())

    def __enter__(self) -> SavedBytes:
        for li, op in enumerate(self.net.mixed):
            self.handles.append(op.register_forward_pre_hook(self.enter(li)))
            self.handles.append(op.register_forward_hook(self.leave))
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.hooks.__exit__(*exc)
        for h in self.handles:
            h.remove()
        self.handles = []


# ---- memory the process holds -------------------------------------------------------------------
MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"  # glibc: allocations at or over it are mappings of their own


def resident_bytes_exact() -> bool:
    """Whether resident memory follows tensors exactly: glibc's mmap threshold fixed (it adapts
    upwards otherwise, and freed tensors stay in the heap), so every tensor over it is a
    mapping of its own, returned when freed (Linux /proc)."""
    return os.environ.get(MMAP_ENV) is not None and Path("/proc/self/statm").is_file()


def exact_resident_memory(threshold: int = 4096) -> None:
    """Re-execute this script (`python -m scripts.X ARGS`) with glibc's mmap threshold fixed,
    once, where it is not: call it first thing under `if __name__ == "__main__"` only. At 4 KiB
    (every tensor of a page or more mapped alone) a full-mode forward's resident memory held
    matched the bytes SavedBytes counts within 2% (ImageNet space, 56x56, batch 8; at batch 4
    a weight step's within 0.3%, a θ step's 5-8% under; a 64 KiB threshold left the small
    tensors in the heap, 10-35% off)."""
    if os.environ.get(MMAP_ENV) is None and Path("/proc/self/statm").is_file():
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
                  {**os.environ, MMAP_ENV: str(threshold)})


class HeldBytes:
    """Resident memory gained since entering (`held()`: what is alive now, e.g. the
    activations a forward keeps for backward, its output included; `peak()`: the highest
    point since entering, the kernel's VmHWM reset at entry). Exact for tensors over the
    threshold only with `resident_bytes_exact()` (both None otherwise): unlike SavedBytes it
    sees what activation checkpointing keeps too."""

    def __enter__(self) -> HeldBytes:
        self.ok = resident_bytes_exact()
        if self.ok:
            Path("/proc/self/clear_refs").write_text("5")  # reset the peak
            self.start = self._rss()
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    @staticmethod
    def _rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def held(self) -> int | None:
        return self._rss() - self.start if self.ok else None

    def peak(self) -> int | None:
        if not self.ok:
            return None
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 - self.start
        return None


# ---- fbnas commands in processes of their own --------------------------------------------------
def fbnas_process(command: str, config: str | Path, sets: Sequence[str], *args: str) -> None:
    """`python -m fbnas COMMAND --config CONFIG ARGS --set ...` (QUIET, then `sets`) in a
    process of its own with one thread; its stderr's end in the error where it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "fbnas", command, "--config", str(config), *args,
           *(x for s in [*QUIET, *sets] for x in ("--set", s))]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")


def search_process(config: str | Path, run: Path, sets: Sequence[str]) -> None:
    """One `fbnas train` in a process of its own (one thread), its networks fitted to the
    target by the table (search.fit_measure off: concurrent searches must not time networks),
    unless `run` has finished (an arch_hard.yaml)."""
    if (run / "arch_hard.yaml").is_file():
        return
    fbnas_process("train", config, [f"run.dir={run}", "search.fit_measure=off", *sets])


def retrain_process(config: str | Path, arch: Path, seed: int, sets: Sequence[str],
                    *args: str) -> None:
    """One `fbnas retrain` of `arch` under retrain.seed `seed` in a process of its own (one
    thread), without timing the network (retrain.measure_latency false)."""
    fbnas_process("retrain", config, [f"retrain.seed={seed}", "retrain.measure_latency=false",
                                      *sets], "--arch", str(arch), *args)


# ---- another checkout's fbnas --------------------------------------------------------------------
def fbnas_root() -> Path:
    """The checkout the imported fbnas comes from."""
    return Path(fbnas.__file__).resolve().parents[1]


def with_code(code: Path) -> dict[str, str]:
    """The environment of a child process that imports fbnas from the checkout `code`."""
    return {**os.environ, "PYTHONPATH": str(Path(code).resolve())}


def run_module_with_code(code: Path, module: str, argv: Sequence[str]) -> int:
    """Run `python -m scripts.MODULE ARGV` with these scripts and the fbnas of checkout `code`:
    the child starts in a temporary folder holding only a link to this `scripts` package, with
    PYTHONPATH naming `code` (so `scripts` comes from here, `fbnas` from there; paths in ARGV
    must be absolute). Returns its exit status."""
    if os.environ.get("FBNAS_SCRIPTS_CODE"):  # a child that did not get `code`'s fbnas
        raise SystemExit(f"fbnas imported from {fbnas_root()}, not {code}")
    with tempfile.TemporaryDirectory(prefix="fbnas-scripts-") as tmp:
        (Path(tmp) / "scripts").symlink_to(Path(__file__).resolve().parent,
                                           target_is_directory=True)
        return subprocess.run([sys.executable, "-m", f"scripts.{module}", *argv],
                              cwd=tmp, env={**with_code(code), "FBNAS_SCRIPTS_CODE": str(code)}
                              ).returncode


# ---- a band of networks trained with the child recipe (pilot_task, recipe_convergence) -----
def band(cfg: Config, flops: float | None, at: float, width: float, n: int, draw: int
         ) -> tuple[float, list[tuple[Architecture, float]], int]:
    """(centre, the drawn networks with their FLOPs, how many the band holds): every network
    of the space counted by the FLOPs table, those within ±`width` of `centre` (`flops`, or
    the `at` quantile of the space's networks), `n` of them drawn by `draw`."""
    space = cfg.space
    table = build_cost_table(space, "flops")
    cands = space.decision_candidates()
    nets = []
    for idx in np.ndindex(*(len(c) for c in cands)):
        a = arch_from_indices(space, list(idx), "n" + "".join(map(str, idx)))
        nets.append((a, table.predict(a, "raw")))
    centre = flops if flops is not None else float(np.quantile([f for _, f in nets], at))
    inside = [(a, f) for a, f in nets if abs(f / centre - 1) <= width]
    return centre, random.Random(draw).sample(inside, min(n, len(inside))), len(inside)


def train(job: tuple[Config, dict, int]) -> dict:
    """One (network, seed): the child recipe in a scratch folder; its test and val top-1."""
    cfg, arch_d, seed = job
    torch.set_num_threads(1)
    arch = Architecture.from_dict(arch_d, "pilot")
    c = replace(cfg, retrain=replace(cfg.retrain, seed=seed, measure_latency=False),
                run=replace(cfg.run, progress=False, tensorboard=False))
    quiet = logging.getLogger("fbnas.pilot.train")
    quiet.setLevel(logging.WARNING)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        t = ChildTrainer(c, arch, Path(tmp) / "run", log=quiet)
        try:
            res = t.train()
        finally:
            close_logger(t.log)
    return {"name": arch.name, "ops": list(arch.ops), "seed": seed, "test": res["top1"],
            "val": res["val_top1"], "seconds": round(time.perf_counter() - t0, 1)}


def band_arguments(ap, networks: int, seeds: str) -> None:
    """The flags search.pilot_task and search.recipe_convergence share: the config and its
    overrides, the band's networks, seeds, width, centre and draw, the worker processes, the
    resumable --out file and --report."""
    ap.add_argument("--config", default="configs/cluttered_digits.yaml")
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="a config override, as fbnas's --set (repeatable)")
    ap.add_argument("--networks", type=int, default=networks)
    ap.add_argument("--seeds", default=seeds, help="retrain.seed values, comma-separated")
    ap.add_argument("--band", type=float, default=0.03, help="relative half-width of the band")
    ap.add_argument("--at", type=float, default=0.5,
                    help="the band's centre as a quantile of the space's networks' FLOPs")
    ap.add_argument("--draw", type=int, default=0, help="seed of the draw of networks")
    ap.add_argument("--workers", type=int, default=1, help="processes, one thread each")
    ap.add_argument("--out", default=None, help="JSON lines of the trainings (resumes)")
    ap.add_argument("--report", action="store_true",
                    help="train nothing: the figures of what --out holds")


def band_config(a) -> Config:
    """The config of `band_arguments`' --config and --set, its trainings on the CPU."""
    cfg = load_config(a.config, a.sets)
    return replace(cfg, retrain=replace(cfg.retrain, device="cpu"))
