"""Multi-process (DistributedDataParallel) runs under `torchrun`: the process group, collective
helpers, and the pieces the trainers use to keep every rank in lock step.

`torchrun` does the rendezvous and sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT; `init_from_env()` reads them and joins the process group (gloo on CPU, nccl on
CUDA, one GPU per local rank). Without them, or with WORLD_SIZE 1, it returns a single-process
context and every helper here is a no-op, so the trainers run the same code either way.

What the trainers synchronise (docs/distributed.md has the full story):

- weights: DistributedDataParallel averages their gradients every step, or, with
  `run.ddp_sync_every: K > 1`, each rank steps on its own gradients and the weights (and the
  optimizer's per-parameter state) are averaged every K steps (`PeriodicAverager`, local SGD);
- θ: kept out of DDP; its gradients are averaged by `all_reduce_mean` before each θ update
  (fbnas.training._step, `Update.average`), so every rank applies the same Adam step and θ stays
  bitwise identical;
- the Gumbel noise: drawn inside `SharedNoise`, from a stream seeded by
  (seed, epoch, phase, step), identical on every rank and independent of the run's history;
- BatchNorm running statistics: averaged at the end of each phase (`sync_bn_stats`);
- stopping: a Ctrl-C/SIGTERM flag is OR-ed over the ranks each step (`any_true`).

Why one module of ~520 lines: every piece here is one side of a collective that another piece
of this file must match (same order of calls, same tensors, same seeds on every rank), and
reading them together is how that is checked; nothing outside imports torch.distributed.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from fbnas.errors import FbnasError
from fbnas.training._rng import rng_state, seed_everything, set_rng_state

BACKENDS = ("auto", "gloo", "nccl")
DEFAULT_TIMEOUT_S = 7200  # rank 0 may measure a latency table while the others wait


@dataclass
class DistContext:
    """Where this process stands in a (possibly one-process) run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    owns_group: bool = False  # init_from_env created the process group (close() ends it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def shard(self) -> tuple[int, int]:
        """(rank, world_size), as fbnas.data's `distributed=` takes it."""
        return self.rank, self.world_size

    # ---- collectives (no-ops in a single process) -------------------------------------------
    def _comm_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """`obj` of rank `src`, on every rank (pickled)."""
        if not self.distributed:
            return obj
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, device=self._comm_device())
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank (pickled)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def all_reduce_mean(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each tensor by its mean over the ranks, in place (one collective)."""
        _flat_all_reduce(self, tensors, mean=True)

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """Each value summed over the ranks (float64, one collective)."""
        if not self.distributed or not values:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t)
        return t.tolist()

    def any_true(self, flag: bool) -> bool:
        """True on every rank if `flag` is true on any rank."""
        if not self.distributed:
            return bool(flag)
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self._comm_device())
        self.all_reduce_max_(t)
        return bool(t.item())

    def all_reduce_max_(self, t: torch.Tensor) -> None:
        """`t` replaced by its elementwise maximum over the ranks, in place. No host read where
        the backend works on `t`'s device (NCCL with CUDA tensors, gloo with CPU tensors)."""
        if not self.distributed:
            return
        dev = self._comm_device()
        if t.device.type == dev.type:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return
        c = t.to(dev)
        dist.all_reduce(c, op=dist.ReduceOp.MAX)
        t.copy_(c)

    def broadcast_tensors(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Overwrite `tensors` with rank `src`'s values, in place (one collective)."""
        ts = list(tensors)
        if not self.distributed or not ts:
            return
        flat = _flatten(self, ts, torch.float64)
        dist.broadcast(flat, src=src)
        _unflatten_into(flat, ts)

    def close(self) -> None:
        """End the process group if `init_from_env` started it."""
        global _CURRENT
        if self.owns_group and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        self.owns_group = False
        if _CURRENT is self:
            _CURRENT = None


_CURRENT: DistContext | None = None


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise FbnasError(f"distributed: {name} is not set (launch with torchrun)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise FbnasError(f"distributed: {name}={raw!r} is not an integer") from None


def init_from_env(device: str = "auto", backend: str = "auto",
                  timeout_s: float | None = None) -> DistContext:
    """Join the process group torchrun describes in the environment, or return a
    single-process context when there is none (no WORLD_SIZE, or WORLD_SIZE 1).

    `device` ("auto", "cpu", "cuda") picks the backend when `backend` is "auto": nccl for CUDA
    (each process takes GPU LOCAL_RANK), gloo for CPU. Rendezvous (single node or many) is
    torchrun's job; this only needs MASTER_ADDR/MASTER_PORT (env://) as torchrun sets them.
    `timeout_s` bounds how long a collective waits for a slow rank (default 2 h, or
    FBNAS_DIST_TIMEOUT_S).
    """
    global _CURRENT
    if backend not in BACKENDS:
        raise FbnasError(f"run.ddp_backend: must be one of {', '.join(BACKENDS)}; "
                         f"got {backend!r}")
    world = _env_int("WORLD_SIZE", 1)
    if dist.is_available() and dist.is_initialized():  # someone else started it: join it
        ctx = _from_group(device)
        _CURRENT = ctx
        return ctx
    if world <= 1:
        ctx = DistContext(device=_resolve(device, 0))
        _CURRENT = ctx
        return ctx
    if not dist.is_available():
        raise FbnasError("distributed: this PyTorch build has no torch.distributed")
    rank = _env_int("RANK")
    local_rank = _env_int("LOCAL_RANK", 0)
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(key):
            raise FbnasError(f"distributed: WORLD_SIZE={world} but {key} is not set (launch "
                             "with torchrun, which sets it)")
    dev = _resolve(device, local_rank)
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend == "nccl" and dev.type != "cuda":
        raise FbnasError("run.ddp_backend: nccl needs CUDA devices (use gloo on CPU)")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if timeout_s is None:
        timeout_s = float(os.environ.get("FBNAS_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    kwargs: dict[str, Any] = {}
    if dev.type == "cuda" and "device_id" in inspect.signature(
            dist.init_process_group).parameters:
        kwargs["device_id"] = dev
    dist.init_process_group(backend=backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    ctx = DistContext(rank=rank, world_size=world, local_rank=local_rank, device=dev,
                      backend=backend, owns_group=True)
    _CURRENT = ctx
    return ctx


def _resolve(device: str, local_rank: int) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise FbnasError("device: cuda requested but no CUDA device is available")
        n = torch.cuda.device_count()
        if local_rank >= n:
            raise FbnasError(f"distributed: LOCAL_RANK {local_rank} but this node has {n} CUDA "
                             f"device(s); start at most {n} processes per node")
        return torch.device("cuda", local_rank)
    return torch.device(device)


def _from_group(device: str) -> DistContext:
    local_rank = _env_int("LOCAL_RANK", 0)
    backend = str(dist.get_backend())
    dev = _resolve(device, local_rank) if device != "auto" or backend == "nccl" else (
        torch.device("cpu"))
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                       local_rank=local_rank, device=dev, backend=backend)


def current() -> DistContext:
    """The context `init_from_env` made, else one derived from an already initialised
    process group, else a single-process context."""
    if _CURRENT is not None:
        return _CURRENT
    if dist.is_available() and dist.is_initialized():
        return _from_group("auto")
    return DistContext()


# ---- tensors ---------------------------------------------------------------------------------
def _flatten(ctx: DistContext, ts: list[torch.Tensor], mixed: torch.dtype) -> torch.Tensor:
    """`ts` as one flat tensor on the communication device, in their common dtype (`mixed`
    when they differ)."""
    dtype = ts[0].dtype if all(t.dtype == ts[0].dtype for t in ts) else mixed
    return torch.cat([t.detach().reshape(-1).to(ctx._comm_device(), dtype) for t in ts])


def _unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    i = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[i:i + n].view_as(t).to(t.device, t.dtype))
            i += n


def _flat_all_reduce(ctx: DistContext, tensors: Sequence[torch.Tensor], mean: bool) -> None:
    ts = list(tensors)
    if not ctx.distributed or not ts:
        return
    flat = _flatten(ctx, ts, torch.float32)
    dist.all_reduce(flat)
    if mean:
        flat /= ctx.world_size
    _unflatten_into(flat, ts)


def seed_from(*ints: int) -> int:
    """A well-spread 63-bit seed from integers (a seed, a stream id, a rank, ...)."""
    words = np.random.SeedSequence([int(i) % (1 << 64) for i in ints]).generate_state(2)
    return ((int(words[0]) << 32) | int(words[1])) & ((1 << 63) - 1)


RANK_STREAM = 0x52414E4B  # the per-rank stream of torch's global RNG (data augmentation)


def rank_seed(seed: int, rank: int, epoch: int = 0) -> int:
    """Seed of rank `rank`'s own random stream (augmentation with data.workers 0) in a run
    started (epoch 0) or re-derived (resumed with another number of processes) at `epoch`."""
    return seed_from(seed, RANK_STREAM, rank, epoch)


def rank_entry(ctx: DistContext, state: dict[str, Any], *, at_epoch_start: bool, where: str,
               log: Any = None) -> dict[str, Any] | None:
    """This rank's own part of a checkpoint (RNG, partial sums, BN statistics) when the run that
    wrote it had as many processes as this one; None for a single-process checkpoint resumed by
    a single process, and for another number of processes, which may only resume at the start
    of an epoch (the per-rank data shards and step counts differ) and is then not an exact
    continuation."""
    saved, ranks = state.get("world_size", 1), state.get("ranks")
    if isinstance(saved, bool) or not isinstance(saved, int) or saved < 1 or (
            ranks is not None and not (isinstance(ranks, list) and len(ranks) == saved and all(
                isinstance(r, dict) and isinstance(r.get("rng"), dict) for r in ranks))):
        raise FbnasError(f"{where}: damaged distributed state (world_size {saved!r} and its "
                         "per-rank entries do not match)")
    if saved == ctx.world_size:
        return ranks[ctx.rank] if ranks else None
    if not at_epoch_start:
        raise FbnasError(f"{where}: was saved mid-epoch by a run of {saved} process(es), this "
                         f"one has {ctx.world_size}; resume it with {saved} (e.g. torchrun "
                         f"--nproc-per-node {saved}), or from a checkpoint at an epoch's end")
    if log is not None and ctx.is_main:
        log.warning(f"{where}: written by {saved} process(es), resumed by {ctx.world_size}: "
                    "continues from the epoch's start with re-derived random streams (not the "
                    "exact continuation the same number of processes gives)")
    return None


def bn_buffers(module: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """(running_mean, running_var, num_batches_tracked) of every BatchNorm in `module`."""
    out = []
    for m in module.modules():
        if (isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
                and m.running_mean is not None):
            out.append((m.running_mean, m.running_var, m.num_batches_tracked))
    return out


def gather_rank_states(ctx: DistContext, module: nn.Module, partial: dict[str, Any]
                       ) -> list[dict[str, Any]]:
    """Every rank's own state for a checkpoint: RNG, `partial` sums and BN statistics of
    `module` (collective: every rank calls it at the same step)."""

    bn = [t.detach().cpu().clone() for trip in bn_buffers(module) for t in trip
          if t is not None]
    return ctx.all_gather_object({"rng": rng_state(), "partial": partial, "bn": bn})


def load_rank_bn(module: nn.Module, values: Sequence[torch.Tensor]) -> None:
    """Put this rank's BN statistics from a checkpoint (`gather_rank_states`) into `module`."""
    own = [t for trip in bn_buffers(module) for t in trip if t is not None]
    with torch.no_grad():
        for t, v in zip(own, values, strict=True):
            t.copy_(v)


def restore_rank_rng(ctx: DistContext, state: dict[str, Any], *, at_epoch_start: bool,
                     seed: int, epoch: int, where: str, log: Any = None
                     ) -> dict[str, Any] | None:
    """Resume this process's random streams from a checkpoint: its own rank's RNG state when
    the run had as many processes, the checkpoint's for a single process, or (another number
    of processes) streams re-derived from `seed` and `epoch`, which is not exact. Returns this
    rank's entry (its partial sums and BN statistics) or None, as `rank_entry`."""

    mine = rank_entry(ctx, state, at_epoch_start=at_epoch_start, where=where, log=log)
    if mine is not None:
        set_rng_state(mine["rng"])
    elif ctx.distributed:
        seed_everything(rank_seed(seed, ctx.rank, epoch))
    else:
        set_rng_state(state["rng"])
    return mine


def sync_bn_stats(ctx: DistContext, module: nn.Module, weight: float = 1.0) -> None:
    """Make every rank's BatchNorm running statistics the `weight`-weighted mean over the ranks
    (num_batches_tracked: the largest); `weight` is e.g. the samples this rank's statistics
    were estimated on (0: this rank's do not count)."""
    if not ctx.distributed:
        return
    bufs = bn_buffers(module)
    if not bufs:
        return
    stats = [t for mean, var, _ in bufs for t in (mean, var)]
    dev = ctx._comm_device()
    w = float(weight)
    flat = torch.cat([t.detach().reshape(-1).to(dev, torch.float64) * w for t in stats]
                     + [torch.tensor([w], dtype=torch.float64, device=dev)])
    dist.all_reduce(flat)
    total = float(flat[-1])
    if total > 0:
        _unflatten_into(flat[:-1] / total, stats)
    counts = [n for _, _, n in bufs if n is not None]
    if counts:
        c = torch.stack([n.detach().to(dev, torch.int64).reshape(()) for n in counts])
        dist.all_reduce(c, op=dist.ReduceOp.MAX)
        _unflatten_into(c, counts)


# ---- DistributedDataParallel -----------------------------------------------------------------
class DDP(nn.parallel.DistributedDataParallel):
    """DistributedDataParallel whose other attributes are the wrapped module's, so code written
    for the bare module (`model.sample_path(...)`, `model.weight_parameters()`) runs on it."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("module")
            if inner is None or name == "module":
                raise
            return getattr(inner, name)


def wrap_ddp(module: nn.Module, ctx: DistContext, ignore: Iterable[nn.Parameter] = (),
             find_unused_parameters: bool = False) -> DDP:
    """`module` in DDP, except the parameters in `ignore` (DDP neither broadcasts nor averages
    them). Buffers are not broadcast at every forward: the trainers average BatchNorm
    statistics themselves at phase ends (`sync_bn_stats`)."""
    skip = {id(p) for p in ignore}
    names = [n for n, p in module.named_parameters() if id(p) in skip]
    if names:
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            module, names)
    kwargs: dict[str, Any] = {"find_unused_parameters": find_unused_parameters}
    if "forward_sync_buffers" in inspect.signature(
            nn.parallel.DistributedDataParallel.__init__).parameters:
        kwargs["forward_sync_buffers"] = False  # torch >= 2.13: still synced once at init
    else:
        kwargs["broadcast_buffers"] = False
    if ctx.device.type == "cuda":
        kwargs["device_ids"] = [ctx.device.index]
    return DDP(module, **kwargs)


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


# ---- local SGD: periodic averaging of weights and optimizer state -----------------------------
class PeriodicAverager:
    """`run.ddp_sync_every: K`: the weights and the optimizer's per-parameter state (momentum,
    Adam moments) are averaged over the ranks every K steps, and whenever `sync()` is called
    (phase ends, checkpoints). With K = 1 the gradients are averaged by DDP instead and this
    does nothing."""

    def __init__(self, ctx: DistContext, params: Sequence[nn.Parameter],
                 opt: torch.optim.Optimizer, every: int):
        self.ctx, self.params, self.opt, self.every = ctx, list(params), opt, int(every)
        self.pending = 0  # local steps since the last average

    @property
    def active(self) -> bool:
        return self.ctx.distributed and self.every > 1

    def after_step(self) -> None:
        if not self.active:
            return
        self.pending += 1
        if self.pending >= self.every:
            self.sync()

    def _tensors(self) -> list[torch.Tensor]:
        out = [p.data for p in self.params]
        for p in self.params:
            st = self.opt.state.get(p, {})
            for k in sorted(st):
                v = st[k]
                if torch.is_tensor(v) and v.is_floating_point() and v.shape == p.shape:
                    out.append(v)
        return out

    def sync(self) -> None:
        if not self.active or not self.pending:
            self.pending = 0
            return
        ts = self._tensors()
        n = sum(t.numel() for t in ts)
        # every rank must reduce the same layout (same parameters with optimizer state)
        check = torch.tensor([n, -n], dtype=torch.int64, device=self.ctx._comm_device())
        dist.all_reduce(check, op=dist.ReduceOp.MAX)
        if int(check[0]) != n or int(-check[1]) != n:
            raise FbnasError("distributed: ranks hold different optimizer states; cannot "
                             "average them (run.ddp_sync_every)")
        self.ctx.all_reduce_mean(ts)
        self.pending = 0


# ---- identical random numbers on every rank ------------------------------------------------------
@contextlib.contextmanager
def shared_random(device: torch.device, seed: int) -> Iterator[None]:
    """Run the block on torch's global RNG (CPU, and `device` if CUDA) seeded with `seed`,
    restoring the previous state afterwards: every rank that passes the same seed draws the same
    numbers, and the rank's own stream (data augmentation) is left untouched."""
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.random.default_generator.manual_seed(seed)
        if devices:
            with torch.cuda.device(devices[0]):
                torch.cuda.manual_seed(seed)
        yield


class SharedNoise:
    """Random draws that are the same on every rank: `with noise(): ...` runs the block on a
    stream seeded by `key()` (the trainer's seed, epoch, phase and step) and the call's number
    within that key (fbnas.trainer samples its paths so). Identical θ (kept so by the averaged
    θ gradients) and identical noise give every rank the same sampled architecture, and the
    noise of a step does not depend on what ran before it, so a resumed run draws what an
    uninterrupted one would."""

    def __init__(self, key: Callable[[], Sequence[int]], device: torch.device):
        self.key, self.device = key, device
        self._last: tuple[int, ...] | None = None
        self._n = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        key = tuple(int(k) for k in self.key())
        self._n = self._n + 1 if key == self._last else 0
        self._last = key
        with shared_random(self.device, seed_from(*key, self._n)):
            yield


__all__ = ["BACKENDS", "DDP", "DistContext", "PeriodicAverager", "SharedNoise", "bn_buffers",
           "current", "init_from_env", "rank_entry", "rank_seed", "seed_from", "shared_random",
           "sync_bn_stats", "unwrap", "wrap_ddp"]
