"""EpochRunner: what every fbnas trainer does around its algorithm.

The epoch loop (train an epoch, save, log, stop on Ctrl-C/SIGTERM with every rank agreeing),
a phase's step loop (progress bar, a checkpoint every `run.checkpoint_every_steps` steps, the
stop check, the step figures summed on the device and, under torchrun, over the ranks), the
device and precision, the update step (`self.stepper`, fbnas.training._step), the resume guard, the
run directory with its config.yaml and train.log, per-rank state in distributed checkpoints,
and the TensorBoard writer. A trainer subclasses it and supplies `_setup` (its model,
optimizers, data), `train_epoch`, `state_dict`, `epoch_line`, `tb_scalars`, `bn_module` (the
module whose BatchNorm statistics each rank keeps) and `_non_finite` (what a NaN/inf step
does).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

from fbnas.errors import FbnasError
from fbnas.io import ensure_dir, write_json_atomic, write_yaml_atomic
from fbnas.runs.files import RunFiles
from fbnas.training._guard import NonFiniteGuard, deferred_wanted, fused_missing
from fbnas.training._step import PhaseSums, StepFigures, Stepper, host_values
from fbnas.training.checkpoint import load_checkpoint, save_checkpoint
from fbnas.training.distributed import (
    DistContext,
    gather_rank_states,
    init_from_env,
    load_rank_bn,
    restore_rank_rng,
    sync_bn_stats,
)
from fbnas.training.distributed import current as dist_current
from fbnas.training.logs import (
    Progress,
    attach_log_file,
    close_logger,
    make_logger,
    run_log_handlers,
)
from fbnas.training.precision import Precision


class NonFiniteLoss(FbnasError):
    """A loss term became NaN or inf."""


class Interrupted(Exception):
    """The run was stopped by Ctrl-C after saving its exact position."""


def resolve_device(name: str, key: str = "search.device") -> torch.device:
    """`auto` -> cuda when available, else cpu; `cuda` without a GPU is a one-line error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FbnasError(f"{key}: cuda requested but no CUDA device is available")
    return torch.device(name)


@contextlib.contextmanager
def torch_threads(n: int | None):
    """torch's CPU thread count set to `n` inside (None: left as it is), restored after."""
    if n is None:
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


class ResumeCheck(Protocol):
    """What a resumed run may change (`fbnas.config.ResumePolicy`): raises if the checkpoint's
    resolved config `saved` and the run's `now` differ where they must not."""

    def check(self, saved: dict[str, Any], now: dict[str, Any], where: Path) -> None: ...


class EpochRunner:
    """Base of the search and retrain trainers (see the module docstring)."""

    KIND: ClassVar[str]  # the checkpoint's kind: "search" or "child"
    SECTION: ClassVar[str]  # the config section of the trainer: "search" or "retrain"
    RESUME_CMD: ClassVar[str]  # how a user continues a run: "fbnas train --resume"
    NEW_RUN_HINT: ClassVar[str]  # how a user starts another run: "run.dir" or "--out"
    POLICY: ClassVar[ResumeCheck]

    def __init__(self, cfg: Any, run_dir: str | Path, log: logging.Logger | None = None,
                 dist: DistContext | None = None, **setup: Any):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.files = RunFiles(self.run_dir)
        # under torchrun (fbnas.training.distributed): rank 0 alone writes run files and logs
        self.dist = dist or dist_current()
        self.epoch, self.step = 0, 0
        self.history: list[dict[str, Any]] = []
        # the epoch in progress: what the trainer keeps (partial) and the phase's sums
        self.partial: dict[str, Any] = {}
        self.sums = PhaseSums()
        self.writer: SummaryWriter | None = None
        self._stop_requested = False
        self._stop_time = 0.0
        self._rank_bn: list[torch.Tensor] | None = None
        self._averager: Any = None  # distributed runs: fbnas.training.distributed.PeriodicAverager
        self._polled_at = 0.0  # the deferred non-finite flags' last read (fbnas.training._guard)
        # the per-step check until the trainer's _setup calls _init_guard with its device
        self._set_guard(NonFiniteGuard(False, "stop", torch.device("cpu"), self.dist))
        # the console only until every input is validated: a refused run writes nothing
        keep = run_log_handlers(self.run_dir, self.dist.rank)
        self._own_log = log is None
        self.log = log or make_logger(self.run_dir, self.dist.rank, file=False)
        try:
            self._setup(**setup)
        except BaseException:
            if self._own_log:
                close_logger(self.log, keep)
            raise

    # ---- what a trainer supplies ------------------------------------------------------------
    def _setup(self, **kw: Any) -> None:
        raise NotImplementedError

    def train_epoch(self) -> dict[str, Any]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def epoch_line(self, rec: dict[str, Any]) -> str:
        """The epoch's line in the log."""
        raise NotImplementedError

    def tb_scalars(self, writer: SummaryWriter, rec: dict[str, Any]) -> None:
        """Write the epoch's record to TensorBoard."""
        raise NotImplementedError

    @property
    def bn_module(self) -> nn.Module:
        """The module whose BatchNorm statistics each rank keeps (the bare model)."""
        raise NotImplementedError

    # ---- set-up helpers ---------------------------------------------------------------------
    def _init_device(self, name: str) -> None:
        """`self.device` from the trainer section's device setting; one GPU per local rank."""
        self.device = resolve_device(name, f"{self.SECTION}.device")
        if self.dist.distributed and self.device.type == "cuda":
            self.device = self.dist.device

    def _init_precision(self, precision: str, channels_last: bool | str, scalers: int = 1
                        ) -> None:
        """Autocast, loss scalers and layout (fbnas.training.precision)."""
        self.prec = Precision(precision, channels_last, self.device, self.SECTION,
                              scalers=scalers,
                              local_sgd=self.dist.distributed and self.cfg.run.ddp_sync_every > 1)

    def _init_guard(self, policy: str = "stop") -> None:
        """The non-finite loss check (`run.nan_check`, fbnas.training._guard); after the precision.
        `policy` is what a non-finite step does: stop the run, or skip the step."""
        setting = self.cfg.run.nan_check
        deferred = deferred_wanted(setting, self.device, self.prec.precision)
        if setting == "deferred" and self.prec.precision == "fp16":
            self.log.info("run.nan_check deferred: fp16's loss scaler checks every step on the "
                          "host; the check stays per step")
        if deferred and (why := fused_missing(self.device)) is not None:
            if setting == "deferred":
                raise FbnasError(f"run.nan_check: deferred needs fused optimizers that skip an "
                                 f"update on {self.device.type} ({why}); use step")
            self.log.info(f"run.nan_check auto: checking each step on the host ({why})")
            deferred = False
        self._set_guard(NonFiniteGuard(deferred, policy, self.device, self.dist))

    def _set_guard(self, guard: NonFiniteGuard) -> None:
        self.guard = guard
        self.stepper = Stepper(getattr(self, "prec", None), guard, self.dist,
                               self._non_finite, lambda: self.step)

    def _non_finite(self, terms: list[str], step: int, count: int = 1) -> None:
        """Non-finite `terms` at `step` (0-based, in the current phase; `count` steps since the
        last poll): skip (log and count) or wind back to `step`, save and raise."""
        raise NotImplementedError

    def _rewind(self, step: int) -> None:
        """Take the position back to `step` of the current phase, whose update and those after
        it were skipped (the deferred check under nan_policy stop)."""
        self.step = step

    def _poll_guard(self) -> None:
        """Read the deferred check's flags; act on a non-finite step found."""
        self._polled_at = time.monotonic()
        found = self.guard.poll()
        if found is not None:
            self._non_finite(found.terms, found.first, found.count)

    def _poll_due(self) -> bool:
        """Every 0.5 s; under torchrun every 32 steps (each rank must decide at the same step,
        and a Ctrl-C is agreed on at these steps too)."""
        if self.dist.distributed:
            return self.step % 32 == 0
        return time.monotonic() - self._polled_at >= 0.5

    def _open_checkpoint(self, resume: bool) -> dict[str, Any] | None:
        """The checkpoint to resume from (checked against the config by `_check_resume`), or
        None for a new run, which must not overwrite one."""
        path = self.files.checkpoint
        if not resume:
            if path.exists():
                what = "search" if self.KIND == "search" else "retrain"
                raise FbnasError(f"{self.run_dir}: already holds a {what} checkpoint; resume "
                                 f"it with `{self.RESUME_CMD} DIR` or choose another "
                                 f"{self.NEW_RUN_HINT}")
            return None
        return load_checkpoint(path, kind=self.KIND)

    def _check_resume(self, state: dict[str, Any]) -> None:
        self.POLICY.check(state["config"], self.cfg.resolved(), self.files.checkpoint)

    def _open_run_dir(self) -> None:
        """Every input is valid: create the run directory and start train.log (rank 0)."""
        if self.dist.is_main:
            ensure_dir(self.run_dir)
            if self._own_log:
                attach_log_file(self.log, self.run_dir)

    def _write_config(self, extra: dict[str, Any] | None = None) -> None:
        """config.yaml: the resolved config (plus what the trainer adds), on rank 0; with
        `data.classes`, classes.json: the classes the run keeps."""
        if self.dist.is_main:
            write_yaml_atomic(self.files.config,
                              {**self.cfg.resolved(), **(extra or {})})
            self._write_classes()

    def _write_classes(self) -> None:
        """classes.json: the `data.classes` subset (the dataset's class indices and names kept,
        label i being the i-th), and a log line; nothing without a subset."""
        data = getattr(self, "data", None)
        kept = getattr(data, "class_indices", None)
        if kept is None:
            return
        d = self.cfg.data
        names = list(data.class_names)
        write_json_atomic(self.files.classes, {
            "dataset": d.dataset, "root": d.root, "classes": len(kept),
            "class_seed": d.class_seed, "indices": list(kept), "names": names})
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        self.log.info(f"data.classes: {len(kept)} classes (class_seed {d.class_seed}): "
                      f"{shown}; the list is in {self.files.classes}")

    def _restore_ranks(self, state: dict[str, Any], at_epoch_start: bool, seed: int) -> None:
        """RNG state (this rank's, in a distributed checkpoint), partial sums and BN
        statistics; the BN statistics are loaded by `_load_rank_bn` once the model is wrapped."""
        mine = restore_rank_rng(self.dist, state, at_epoch_start=at_epoch_start, seed=seed,
                                epoch=self.epoch, where=str(self.files.checkpoint),
                                log=self.log)
        if mine is not None:
            self._load_partial(mine.get("partial"))
            self._rank_bn = list(mine.get("bn") or [])
        self.log.info(f"resumed {self.run_dir} at {self._position()}")

    def _load_rank_bn(self) -> None:
        if self._rank_bn:  # this rank's own BN statistics from the checkpoint
            load_rank_bn(self.bn_module, self._rank_bn)

    # ---- checkpoints ------------------------------------------------------------------------
    def save(self) -> None:
        """Write the checkpoint. Under torchrun every rank calls this at the same step (it is
        collective: it gathers each rank's RNG state and BN statistics) and rank 0 writes."""
        ranks = None
        if self.dist.distributed:
            if self._averager is not None:
                self._averager.sync()  # ddp_sync_every > 1: the ranks' weights may differ
            ranks = gather_rank_states(self.dist, self.bn_module, self._partial_state())
        if not self.dist.is_main:
            return
        state = self.state_dict()
        if ranks is not None:
            state.update(world_size=self.dist.world_size, ranks=ranks)
        save_checkpoint(self.files.checkpoint, state)
        self._after_save()

    def _after_save(self) -> None:
        """Files a trainer writes beside each checkpoint (rank 0)."""

    # ---- the loops --------------------------------------------------------------------------
    def _run_epochs(self, epochs: int | Callable[[], int]) -> None:
        """Train to epoch `epochs` (a number, or read after each epoch where a plan may move
        it), saving after each; on Ctrl-C/SIGTERM save the exact position, say how to
        continue and raise Interrupted."""
        try:
            with self._stop_signals():
                while self.epoch < (epochs() if callable(epochs) else epochs):
                    rec = self.train_epoch()
                    self.history.append(rec)
                    self._next_epoch()
                    self.save()
                    self.log_epoch(rec)
                    if self._agreed_stop():
                        raise Interrupted
        except Interrupted:
            if self.dist.is_main:
                self.log.warning(f"interrupted: saved {self.files.checkpoint} at "
                                 f"{self._position()}; continue with "
                                 f"`{self.RESUME_CMD} {self.run_dir}`")
            raise
        finally:
            if self.writer is not None:
                self.writer.flush()

    def _run_phase(self, batches: Iterable[Any], total: int, desc: str,
                   step: Callable[[torch.Tensor, torch.Tensor], StepFigures],
                   shown: tuple[str, ...] = (),
                   before_stop: Callable[[], None] | None = None) -> PhaseSums:
        """The rest of one pass over `batches` (resumed at `self.step`): `step` on each batch
        moved to the device, its figures summed in `self.sums` (on the device); a checkpoint
        every `run.checkpoint_every_steps` steps; on a stop request, `before_stop`, save and
        raise Interrupted. Returns the phase's sums as host floats, over every rank (after
        averaging what ranks keep locally: local-SGD weights, BN statistics)."""
        if not self.step:
            self.sums = PhaseSums()
        bar = None  # a bar on a terminal, else a plain line every 30 s (fbnas.training.logs)
        if self.cfg.run.progress and self.dist.is_main:
            bar = Progress(total, desc, initial=self.step)
        every = self.cfg.run.checkpoint_every_steps
        try:
            for x, y in batches:
                x = x.to(self.device, non_blocking=True)
                y = y.to(self.device, non_blocking=True)
                out = step(x, y)
                self.step += 1
                self.sums.add(out)
                if bar is not None:
                    bar.update(1)
                    if bar.due():  # the figures are read from the device only when shown
                        figs = {**{k: out[k] for k in shown if k in out}, **out.shown} if out \
                            else {}
                        bar.show(host_values(figs))
                save = bool(every) and self.step % every == 0
                poll = self.guard.deferred and (save or self._poll_due())
                # under torchrun agreeing on a stop is a collective read; with the deferred
                # check it waits for the poll steps (every 32), so no step waits for the device
                agree = not (self.guard.deferred and self.dist.distributed) or poll
                stop = agree and self._agreed_stop()
                if self.guard.deferred and (poll or stop):
                    self._poll_guard()  # a non-finite step found here stops before any save
                if save:
                    self.save()
                if stop:
                    if before_stop is not None:
                        before_stop()
                    self.save()
                    raise Interrupted
            if self.guard.deferred:
                self._poll_guard()  # the phase's end: nothing non-finite is carried past it
        finally:
            if bar is not None:
                bar.close()
        sums = self.sums.host()  # one read of the phase's sums
        self.sums = PhaseSums()  # the phase is done: a checkpoint from here on holds none
        if self.dist.distributed:
            if self._averager is not None:
                self._averager.sync()  # ddp_sync_every > 1: one model again
            sync_bn_stats(self.dist, self.bn_module)  # the ranks' BN statistics, averaged
            sums = sums.all_reduce(self.dist)
        return sums

    def _partial_state(self) -> dict[str, Any]:
        """The epoch in progress as a checkpoint keeps it (plain floats)."""
        return {**self.partial, **self.sums.state()}

    def _load_partial(self, partial: dict[str, Any] | None) -> None:
        p = dict(partial or {})
        old = p.get("sums") or {}
        if "seconds" in old and "seconds" not in p:  # fbnas <= 0.1 kept it among the sums
            p["seconds"] = old["seconds"]
        self.sums = PhaseSums.from_state(p)
        for k in ("sums", "weight", "count"):
            p.pop(k, None)
        self.partial = p

    def _next_epoch(self) -> None:
        self.epoch, self.step, self.partial, self.sums = self.epoch + 1, 0, {}, PhaseSums()

    def _position(self) -> str:
        return f"epoch {self.epoch} step {self.step}"

    # ---- logging ----------------------------------------------------------------------------
    def log_epoch(self, rec: dict[str, Any]) -> None:
        """history.json, the log line and TensorBoard (rank 0 alone)."""
        if not self.dist.is_main:
            return
        write_json_atomic(self.files.history, self.history)
        self.log.info(self.epoch_line(rec))
        if not self.cfg.run.tensorboard:
            return
        if self.writer is None:
            self.writer = SummaryWriter(str(self.files.tensorboard))
        self.tb_scalars(self.writer, rec)

    # ---- stopping ---------------------------------------------------------------------------
    def request_stop(self, *_: Any) -> None:
        """Ask the run to stop after the current step (what Ctrl-C does); a second call aborts
        (under torchrun, not one within 2 s: the copy of the same Ctrl-C the launcher forwards
        to a rank that got it from the terminal too)."""
        now = time.monotonic()
        if self._stop_requested:
            if self.dist.distributed and now - self._stop_time < 2.0:
                return
            raise KeyboardInterrupt
        self._stop_requested, self._stop_time = True, now
        self.log.warning("stopping after the current step to save a checkpoint "
                         "(Ctrl-C again aborts without saving)")

    def _agreed_stop(self) -> bool:
        """Whether to stop now; under torchrun, true on every rank if any rank was signalled,
        so all ranks stop (and save) at the same step."""
        if self.dist.distributed:
            self._stop_requested = self.dist.any_true(self._stop_requested)
        return self._stop_requested

    @contextlib.contextmanager
    def _stop_signals(self):
        """Route Ctrl-C, and the SIGTERM a scheduler sends before it kills a job, to
        `request_stop` while the block runs (main thread only); restore the handlers after."""
        old = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old[sig] = signal.signal(sig, self.request_stop)
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)


def run_trainer(make: Callable[[DistContext], Any], device: str, backend: str
                ) -> tuple[DistContext, Any]:
    """The `fbnas train` / `fbnas retrain` run: join the torchrun process group (a single
    process otherwise), build the trainer with `make(ctx)`, train it, close its log and the
    group. Returns (context, the training's result), or (context, None) when Ctrl-C/SIGTERM
    stopped it."""
    ctx = init_from_env(device=device, backend=backend)
    try:
        trainer = make(ctx)
        try:
            return ctx, trainer.train()
        except Interrupted:
            return ctx, None
        finally:
            close_logger(trainer.log)
    finally:
        ctx.close()
