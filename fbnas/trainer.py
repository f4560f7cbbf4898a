"""SearchTrainer: the FBNet alternating search.

Per epoch: weight steps (SGD + momentum, cosine schedule) on the weight split, then — after
`warmup_epochs` of weights only — θ steps (Adam) on the disjoint θ split. Weight steps use
the cross-entropy of a Gumbel-sampled path (θ gets no gradient); θ steps use the cost-aware
loss (weights get no gradient). τ is annealed after warm-up. Validation uses the argmax
architecture, deterministically, on the held-out validation split (never the test split).

Checkpoints are written atomically at the end of every epoch (and every
`run.checkpoint_every_steps` steps if set, and on Ctrl-C), holding the model, both optimizers,
the scheduler, RNG states, the position (epoch, phase, step), the resolved config and the cost
table's fingerprint: `fbnas train --resume RUN_DIR` continues and ends with the same θ as an
uninterrupted run.

Under `torchrun` (fbnas.distributed, docs/distributed.md) each rank trains on its shard: weight
steps run through DistributedDataParallel, θ's gradients are averaged before each Adam step,
the Gumbel noise is the same on every rank, and rank 0 alone writes the run directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.handlers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fbnas.arch import Architecture, sample_hard
from fbnas.checkpoint import load_checkpoint, rng_state, save_checkpoint, seed_everything
from fbnas.config import Config
from fbnas.distributed import DistContext
from fbnas.distributed import current as dist_current
from fbnas.errors import FbnasError
from fbnas.io import ensure_dir, write_json_atomic, write_yaml_atomic
from fbnas.loss import build_loss
from fbnas.precision import Precision
from fbnas.supernet import Supernet

CHECKPOINT = "checkpoint.pt"
_UNITS = {"latency": "us", "flops": "FLOPs", "params": "params"}


class NonFiniteLoss(FbnasError):
    """A loss term became NaN or inf."""


class Interrupted(Exception):
    """The run was stopped by Ctrl-C after saving its exact position."""


class StopOnSignal:
    """Ctrl-C / SIGTERM handling and the epoch loop shared by the search and retrain trainers:
    a signal asks the run to stop after the current step (and save); a second one aborts.
    Needs `self.dist`, `self.log`, `self._stop_requested`, `self.epoch`, `self.history`,
    `self.run_dir`, `self.writer`, `train_epoch`, `save`, `_log_epoch` and `_next_epoch`."""

    def _run_epochs(self, epochs: int, resume_cmd: str) -> None:
        """Train to epoch `epochs`, saving after each; on Ctrl-C/SIGTERM save the exact
        position, say how to continue (`resume_cmd RUN_DIR`) and raise Interrupted."""
        try:
            with self._stop_signals():
                while self.epoch < epochs:
                    rec = self.train_epoch()
                    self.history.append(rec)
                    self._next_epoch()
                    self.save()
                    self._log_epoch(rec)
                    if self._agreed_stop():
                        raise Interrupted
        except Interrupted:
            if self.dist.is_main:
                self.log.warning(f"interrupted: saved {self.run_dir / CHECKPOINT} at "
                                 f"{self._position()}; continue with "
                                 f"`{resume_cmd} {self.run_dir}`")
            raise
        finally:
            if self.writer is not None:
                self.writer.flush()

    def request_stop(self, *_: Any) -> None:
        """Ask the run to stop after the current step (what Ctrl-C does); a second call aborts
        (under torchrun, not one within 2 s: the copy of the same Ctrl-C the launcher forwards
        to a rank that got it from the terminal too)."""
        now = time.monotonic()
        if self._stop_requested:
            if self.dist.distributed and now - getattr(self, "_stop_time", now) < 2.0:
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
        import signal
        import threading

        old = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old[sig] = signal.signal(sig, self.request_stop)
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)


@dataclass
class CostSource:
    """Per-(layer, op) costs and where they came from."""

    rows: list[dict[str, float]]
    fixed: float
    fingerprint: str
    unit: str
    description: str
    table: Any = None  # the LatencyTable (or counted table) for predictions


def resolve_device(name: str, key: str = "search.device") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FbnasError(f"{key}: cuda requested but no CUDA device is available")
    return torch.device(name)


def cached_table_path(cfg: Config, timer=None) -> Path:
    """Where `fbnas train` caches the latency table measured for this config's space and
    latency settings on this machine."""
    import hashlib

    from fbnas.latency import make_timer
    from fbnas.latency.table import space_hash

    lat, space = cfg.latency, cfg.space
    if timer is None:
        timer = make_timer(lat.device, threads=lat.threads, batch=lat.batch, dtype=lat.dtype,
                           channels_last=lat.channels_last)
    fp_dev = timer.describe()
    key = json.dumps({k: fp_dev.get(k) for k in sorted(fp_dev) if k != "created"},
                     sort_keys=True)
    tag = hashlib.sha256((key + space_hash(space)).encode()).hexdigest()[:16]
    return Path(lat.cache_dir).expanduser() / f"{space.name}-{lat.device}-{tag}.json"


def resolve_costs(cfg: Config, log: Callable[[str], None] = print,
                  run_dir: Path | None = None, prefer_saved: bool = False,
                  save: bool = True) -> CostSource:
    """Load, reuse from cache, or build the cost table the config asks for (a resumed run,
    `prefer_saved`, takes the copy saved in its run directory when the config names no
    table file)."""
    from fbnas.latency import LatencyTable, build_cost_table, build_table, make_timer

    lat, space = cfg.latency, cfg.space
    saved = run_dir / "cost_table.json" if run_dir is not None else None
    if prefer_saved and saved is not None and saved.is_file():
        # a resumed run keeps the table it was searched with, whatever the cache holds now
        table = LatencyTable.load(saved)
        if table.cost == lat.cost:
            rows, fixed = table.costs_for(space)
            return CostSource(rows, fixed, table.fingerprint(), _UNITS[table.cost],
                              f"cost table {saved}", table)
    if lat.table:
        table = LatencyTable.load(lat.table)
        if table.cost != lat.cost:
            raise FbnasError(f"{lat.table}: is a {table.cost} table but latency.cost is "
                             f"{lat.cost!r}")
        table.check_run(batch=lat.batch, dtype=lat.dtype)
        desc = f"{lat.cost} table {lat.table}"
    elif lat.cost in ("flops", "params"):
        table = build_cost_table(space, lat.cost)
        desc = f"counted {lat.cost} table"
    else:
        timer = make_timer(lat.device, threads=lat.threads, batch=lat.batch, dtype=lat.dtype,
                           channels_last=lat.channels_last)
        cache = cached_table_path(cfg, timer)
        table = LatencyTable.load(cache) if cache.is_file() else None
        if table is not None and not table.missing(space):
            log(f"reusing cached latency table {cache}")
            desc = f"latency table {cache} (cached, measured on this machine)"
        else:
            log(f"measuring a latency table for this machine ({lat.device}) -> {cache}")
            table = build_table(space, timer, table=table, out=cache, progress=cfg.run.progress,
                                log=log)
            desc = f"latency table {cache} (measured now)"
    if run_dir is not None and save:
        table.save(run_dir / "cost_table.json")
    rows, fixed = table.costs_for(space)
    return CostSource(rows, fixed, table.fingerprint(), _UNITS[table.cost], desc, table)


class SearchTrainer(StopOnSignal):
    def __init__(self, cfg: Config, run_dir: str | Path, costs: CostSource | None = None,
                 log: logging.Logger | None = None, resume: bool = False,
                 dist: DistContext | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        # under torchrun (fbnas.distributed): rank 0 alone writes run files and logs
        self.dist = dist or dist_current()
        # the console only until every input is validated: a refused run writes nothing
        keep = run_log_handlers(self.run_dir, self.dist.rank)
        self.log = log or _make_logger(self.run_dir, self.dist.rank, file=False)
        try:
            self._setup(resume, costs, own_log=log is None)
        except BaseException:
            if log is None:
                close_logger(self.log, keep)
            raise

    def _setup(self, resume: bool, costs: CostSource | None, own_log: bool) -> None:
        cfg = self.cfg
        s = cfg.search
        self.device = resolve_device(s.device)
        if self.dist.distributed and self.device.type == "cuda":
            self.device = self.dist.device  # one GPU per local rank
        # autocast and layout (fbnas.precision); scaler 0 for the weights, 1 for θ under fp16
        self.prec = Precision(s.precision, s.channels_last, self.device, "search", scalers=2,
                              local_sgd=self.dist.distributed and cfg.run.ddp_sync_every > 1)
        ckpt_path = self.run_dir / CHECKPOINT
        state = None
        if resume:
            state = load_checkpoint(ckpt_path, kind="search")
            self._check_resume(state)
        elif ckpt_path.exists():
            raise FbnasError(f"{self.run_dir}: already holds a search checkpoint; resume it "
                             "with `fbnas train --resume DIR` or choose another run.dir")
        self.costs = costs or self._shared_costs(resume)
        # seeded after the costs: measuring a table draws random numbers, a cached one does not
        seed_everything(s.seed)
        if state is not None and state["cost_fingerprint"] != self.costs.fingerprint:
            raise FbnasError(f"{ckpt_path}: the run was searched with another cost table "
                             f"(fingerprint {state['cost_fingerprint'][:12]}, now "
                             f"{self.costs.fingerprint[:12]}); resume with the original table")
        self.model = Supernet(cfg.space, self.costs.rows, self.costs.fixed, mode=s.mode,
                              checkpoint_activations=s.checkpoint_activations).to(self.device)
        self.prec.model(self.model)
        self.loss = build_loss(cfg.loss)
        self.loss.check_range(*self.model.cost_bounds())
        self.w_opt = torch.optim.SGD(self.model.weight_parameters(), lr=s.w_lr,
                                     momentum=s.w_momentum, weight_decay=s.w_weight_decay,
                                     nesterov=s.w_nesterov and s.w_momentum > 0)
        self.w_sched = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.w_opt, T_max=s.epochs, eta_min=s.w_lr_min)
        self.theta_opt = torch.optim.Adam(self.model.arch_parameters(), lr=s.theta_lr,
                                          weight_decay=s.theta_weight_decay)
        from fbnas.data import build_search_data

        self.data = build_search_data(
            cfg.data, input_size=cfg.space.macro.input_size,
            in_channels=cfg.space.macro.in_channels, num_classes=cfg.space.macro.num_classes,
            seed=s.seed, distributed=self.dist.shard, pin_memory=self.device.type == "cuda")
        if self.dist.is_main:  # every input is valid: now the run directory
            ensure_dir(self.run_dir)
            if own_log:
                attach_log_file(self.log, self.run_dir)
            if state is None and self.costs.table is not None:
                self.costs.table.save(self.run_dir / "cost_table.json")
        self.epoch, self.phase, self.step = 0, "w", 0
        self.history: list[dict[str, Any]] = []
        self.partial: dict[str, Any] = {}
        self.skipped_steps = 0
        self.writer = None
        self._stop_requested = False
        self._ddp: Any = None  # the weight path's DDP wrapper (distributed runs)
        self._rank_bn: list[torch.Tensor] | None = None
        if state is not None:
            self._restore(state)
        elif self.dist.is_main:
            write_yaml_atomic(self.run_dir / "config.yaml", cfg.resolved())
        if self.dist.distributed:
            self._setup_distributed(fresh=state is None)

    # ---- resume ---------------------------------------------------------------------------
    # Keys a resumed run may change: where and how it runs, not what it computes.
    RESUMABLE_CHANGES = {("run", "dir"), ("run", "progress"), ("run", "tensorboard"),
                         ("run", "checkpoint_every_steps"), ("search", "device"),
                         ("data", "workers"), ("data", "root"), ("data", "eval_batch_size"),
                         ("run", "ddp_backend"), ("search", "checkpoint_activations"),
                         ("search", "channels_last")}
    # keys added since older checkpoints were written, and the value those runs had
    ADDED_KEYS = {("run", "ddp_sync_every"): 1, ("search", "mode"): "full",
                  ("search", "checkpoint_activations"): False,
                  ("search", "precision"): "float32", ("search", "channels_last"): False}

    def _check_resume(self, state: dict[str, Any]) -> None:
        saved, now = state["config"], self.cfg.resolved()
        where = self.run_dir / CHECKPOINT
        if saved["space"] != now["space"]:
            diff = next((k for k in saved["space"]
                         if saved["space"].get(k) != now["space"].get(k)), "space")
            raise FbnasError(f"{where}: was searched in another search space (space.{diff} "
                             "differs); resume with the original config")
        check_kept_settings(saved, now, ("data", "latency", "loss", "search", "run"),
                            self.RESUMABLE_CHANGES, self.ADDED_KEYS, where)

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.w_opt.load_state_dict(state["w_opt"])
        self.theta_opt.load_state_dict(state["theta_opt"])
        self.w_sched.load_state_dict(state["w_sched"])
        self.epoch, self.phase, self.step = state["epoch"], state["phase"], state["step"]
        self.history = list(state["history"])
        self.partial = dict(state.get("partial") or {})
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.prec.load_state_dict(state.get("scalers"))
        from fbnas.distributed import restore_rank_rng

        # a distributed checkpoint holds each rank's RNG, partial sums and BN statistics
        mine = restore_rank_rng(self.dist, state, at_epoch_start=self.phase == "w"
                                and not self.step, seed=self.cfg.search.seed, epoch=self.epoch,
                                where=str(self.run_dir / CHECKPOINT), log=self.log)
        if mine is not None:
            self.partial = dict(mine.get("partial") or {})
            self._rank_bn = list(mine.get("bn") or [])
        self.log.info(f"resumed {self.run_dir} at epoch {self.epoch} phase {self.phase} "
                      f"step {self.step}")

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "search", "epoch": self.epoch, "phase": self.phase, "step": self.step,
            "model": self.net.state_dict(), "w_opt": self.w_opt.state_dict(),
            "theta_opt": self.theta_opt.state_dict(), "w_sched": self.w_sched.state_dict(),
            "tau": self.tau, "rng": rng_state(), "config": self.cfg.resolved(),
            "cost_fingerprint": self.costs.fingerprint, "history": self.history,
            "partial": self.partial, "skipped_steps": self.skipped_steps,
            "scalers": self.prec.state_dict(),
        }

    def save(self) -> None:
        """Write the checkpoint and theta.json. Under torchrun every rank calls this at the same
        step (it is collective: it gathers each rank's RNG state) and rank 0 writes."""
        ranks = self._gather_rank_states() if self.dist.distributed else None
        if not self.dist.is_main:
            return
        state = self.state_dict()
        if ranks is not None:
            state.update(world_size=self.dist.world_size, ranks=ranks)
        save_checkpoint(self.run_dir / CHECKPOINT, state)
        write_json_atomic(self.run_dir / "theta.json", {
            "epoch": self.epoch, "ops": [list(c) for c in self.cfg.space.layer_candidates()],
            "theta": [t.detach().cpu().tolist() for t in self.net.theta]})

    @property
    def net(self) -> Supernet:
        """The supernet itself (`self.model` is its DDP wrapper during distributed w steps)."""
        return getattr(self.model, "module", self.model)

    # ---- schedule ---------------------------------------------------------------------------
    @property
    def tau(self) -> float:
        return self.cfg.search.tau(self.epoch)

    def theta_active(self, epoch: int | None = None) -> bool:
        return (self.epoch if epoch is None else epoch) >= self.cfg.search.warmup_epochs

    # ---- one step of each kind ---------------------------------------------------------------
    def _check_finite(self, terms: dict[str, torch.Tensor]) -> bool:
        bad = [k for k, v in terms.items() if not bool(torch.isfinite(v).all())]
        if self.dist.distributed and self.dist.any_true(bool(bad)) and not bad:
            bad = ["loss (on another rank)"]  # every rank skips or stops at the same step
        if not bad:
            return True
        where = (f"epoch {self.epoch + 1}/{self.cfg.search.epochs}, {self.phase} step "
                 f"{self.step + 1}")
        if self.cfg.search.nan_policy == "skip":
            self.skipped_steps += 1
            self.log.warning(f"non-finite {', '.join(bad)} at {where}: step skipped")
            return False
        self.save()  # nothing was applied yet: this is the last good state
        raise NonFiniteLoss(f"non-finite loss term {', '.join(bad)} at {where}; stopped after "
                            f"saving the last good state in {self.run_dir / CHECKPOINT} "
                            "(set search.nan_policy: skip to skip such steps)")

    def weight_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        self.model.train()
        with torch.no_grad():  # search.mode decides which paths are sampled and computed
            p = self.model.sample_path(self.tau, self.cfg.search.hard)
        with self.prec.autocast():
            logits, cost = self.model(self.prec.input(x), m=p.m, active=p.active,
                                      cost_m=p.cost_m)
        logits = logits.float()  # the losses in float32 under any search.precision
        ce = self.loss.ce(logits, y)
        if not self._check_finite({"ce": ce}):
            return {}
        params = self.model.weight_parameters()
        self.w_opt.zero_grad(set_to_none=True)
        self.prec.scale(ce, 0).backward()
        if self.cfg.search.grad_clip:
            self.prec.unscale_(self.w_opt, 0)
            nn.utils.clip_grad_norm_(params, self.cfg.search.grad_clip)
        self.prec.step(self.w_opt, 0)
        acc = (logits.detach().argmax(1) == y).float().mean()
        return {"ce": ce.item(), "acc": acc.item(), "cost": cost.item()}

    def theta_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        self.model.train()
        p = self.model.sample_path(self.tau, self.cfg.search.hard)  # per search.mode
        with self.prec.autocast():
            logits, cost = self.model(self.prec.input(x), m=p.m, active=p.active,
                                      cost_m=p.cost_m)
        terms = self.loss(logits.float(), y, cost.float())
        if not self._check_finite({"ce": terms.ce, "cost_term": terms.cost_term,
                                   "total": terms.total}):
            return {}
        theta = self.model.arch_parameters()
        # weights get no gradient here. A layer's θ can be absent from the graph: in
        # single_path a sampled identity `skip` in a shortcut layer adds nothing (x + 0), and
        # with `loss.kind: ce` nothing else reaches that θ; its gradient is then 0.
        total = self.prec.scale(terms.total, 1)
        grads = (torch.autograd.grad(total, theta, allow_unused=True) if total.requires_grad
                 else [None] * len(theta))
        for t, g in zip(theta, grads, strict=True):
            t.grad = torch.zeros_like(t) if g is None else g
        if self.dist.distributed and self.prec.scalers:
            # fp16: average before the scaler's overflow check, so every rank skips alike
            self.dist.all_reduce_mean([t.grad for t in theta])
        self.prec.step(self.theta_opt, 1)
        self.theta_opt.zero_grad(set_to_none=True)
        acc = (logits.detach().argmax(1) == y).float().mean()
        return {"loss": terms.total.item(), "ce": terms.ce.item(),
                "cost_term": terms.cost_term.item(), "acc": acc.item(), "cost": cost.item()}

    def _calib_batches(self):
        n = 0
        limit = self.cfg.search.bn_calib_samples
        if self.dist.distributed:  # each rank calibrates on its shard; the total is the same
            limit = -(-limit // self.dist.world_size)
        for x, _ in self.data.calib_loader:
            if n >= limit:
                return
            x = x[: limit - n]
            n += len(x)
            yield x.to(self.device, non_blocking=True)

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Accuracy and CE of the argmax architecture on the validation split, after
        re-estimating its BatchNorm statistics on (un-augmented) weight-split images."""
        m = self.model.argmax_weights()
        active = [[i] for i in self.model.argmax_indices()]
        out = {"argmax_cost": float(self.model.expected_cost(m))}
        if self.data.val_loader is None:  # val_fraction 0: no selection split
            return out
        if self.cfg.search.bn_calib_samples and self.data.calib_loader is not None:
            used = self.model.recalibrate_bn(self._calib_batches(), m, active)
            if self.dist.distributed:  # the ranks' estimates, weighted by their samples
                from fbnas.distributed import sync_bn_stats

                sync_bn_stats(self.dist, self.net, weight=used)
        self.model.eval()
        n = correct = 0
        ce_sum = 0.0
        for x, y in self.data.val_loader:
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            logits, _ = self.model(x, m=m, active=active)
            ce_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
            n += len(y)
        if self.dist.distributed:  # each rank evaluated its shard of the validation split
            correct, n, ce_sum = self.dist.sum_floats([correct, n, ce_sum])
        return {**out, "val_acc": correct / max(n, 1), "val_ce": ce_sum / max(n, 1)}

    # ---- epochs ----------------------------------------------------------------------------------
    def _run_phase(self, phase: str, loader, step_fn, bar_fn) -> dict[str, float]:
        if not self.step:
            self.partial.pop("sums", None)
            self.partial.pop("count", None)
        sums: dict[str, float] = dict(self.partial.get("sums", {}))
        count = int(self.partial.get("count", 0))
        every = self.cfg.run.checkpoint_every_steps
        it = self.data.iterate(loader, start=self.step)
        bar = bar_fn(loader, phase)
        try:
            for x, y in it:
                x = x.to(self.device, non_blocking=True)
                y = y.to(self.device, non_blocking=True)
                out = self._dist_step(phase, step_fn, x, y) if self._ddp else step_fn(x, y)
                self.step += 1
                for k, v in out.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1 if out else 0
                self.partial = {**self.partial, "sums": sums, "count": count}
                if bar is not None:
                    bar.update(1)
                    if out:
                        bar.set_postfix({k: f"{v:.3g}" for k, v in out.items()
                                         if k in ("ce", "acc", "cost")})
                if every and self.step % every == 0:
                    self.save()
                if self._agreed_stop():
                    self.save()
                    raise Interrupted
        finally:
            if bar is not None:
                bar.close()
        if self.dist.distributed:  # the phase's means over every rank's steps
            sums, count = self._end_phase(sums, count)
        return {k: v / max(count, 1) for k, v in sums.items()}

    def _bar(self, loader, phase):
        if not self.cfg.run.progress or not self.dist.is_main:
            return None
        from tqdm import tqdm

        total = len(loader)
        return tqdm(total=total, initial=min(self.step, total), leave=False, dynamic_ncols=True,
                    desc=f"epoch {self.epoch + 1}/{self.cfg.search.epochs} {phase}")

    def train_epoch(self) -> dict[str, Any]:
        """Run (or finish) the current epoch; returns its metrics."""
        e = self.epoch
        self.data.set_epoch(e)
        t0 = time.perf_counter()
        rec: dict[str, Any] = self.partial.setdefault("rec", {})
        if self.phase == "w":
            w = self._run_phase("w", self.data.w_loader, self.weight_step, self._bar)
            rec.update({f"w_{k}": v for k, v in w.items()})
            rec["w_lr"] = self.w_opt.param_groups[0]["lr"]
            self.w_sched.step()
            self.phase, self.step, self.partial = "theta", 0, {"rec": rec}
            # the step counter restarts: with run.checkpoint_every_steps N a kill loses at most
            # N - 1 steps only if each phase's end is saved too
            if self.cfg.run.checkpoint_every_steps and self.theta_active(e):
                self.save()
        if self.phase == "theta":
            if self.theta_active(e):
                th = self._run_phase("theta", self.data.theta_loader, self.theta_step, self._bar)
                rec.update({f"theta_{k}": v for k, v in th.items()})
            self.phase, self.step, self.partial = "val", 0, {"rec": rec}
            if self.cfg.run.checkpoint_every_steps:
                self.save()
        rec.update(self.validate())
        rec.update({"epoch": e + 1, "tau": self.tau, "theta_lr": self.theta_opt.param_groups[0]
                    ["lr"], "theta_active": self.theta_active(e),
                    "seconds": time.perf_counter() - t0,
                    "probs": [p.cpu().tolist() for p in self.model.probabilities()],
                    "entropy": self.model.entropy().cpu().tolist()})
        return rec

    def fit(self) -> dict[str, Any]:
        """Run to the last epoch. Ctrl-C finishes the current step, saves the exact position
        and raises Interrupted; `--resume` continues from there."""
        s = self.cfg.search
        self.log.info(f"search '{self.cfg.space.name}': {s.epochs} epochs ({s.warmup_epochs} "
                      f"warm-up), {self.costs.description}, device {self.device}"
                      + (f", {s.precision}" if s.precision != "float32" else "")
                      + (", channels_last" if s.channels_last else ""))
        if (warn := self.prec.warning("search")) is not None:
            self.log.warning(warn)
        self._run_epochs(s.epochs, "fbnas train --resume")
        arch = self.final_arch()
        if self.dist.is_main:
            arch.save(self.run_dir / "arch_hard.yaml")
        result = {"arch": arch.ops, "hash": arch.hash(), "history": self.history,
                  "predicted_cost": self.costs.fixed + sum(
                      r[o] for r, o in zip(self.costs.rows, arch.ops, strict=True))}
        self.log.info(f"done: argmax architecture {arch.short_hash} "
                      f"({result['predicted_cost']:.1f} {self.costs.unit} predicted) -> "
                      f"{self.run_dir / 'arch_hard.yaml'}")
        return result

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.phase, self.step, self.partial = "w", 0, {}

    def _position(self) -> str:
        return f"epoch {self.epoch} phase {self.phase} step {self.step}"

    def final_arch(self) -> Architecture:
        a = sample_hard(self.cfg.space, self.model.theta, name=f"{self.cfg.space.name}_search")
        return Architecture(a.macro, a.ops, a.name, a.space, {"run": str(self.run_dir)})

    # ---- distributed (torchrun; docs/distributed.md) ---------------------------------------------
    def _shared_costs(self, resume: bool) -> CostSource:
        """Rank 0 loads or measures the cost table (and saves it in the run directory); the
        other ranks receive its rows and fingerprint, or its error."""
        cfg = self.cfg

        def resolve() -> CostSource:
            # saved in the run directory once every other input is validated too
            return resolve_costs(cfg, self.log.info, self.run_dir, prefer_saved=resume and (
                cfg.latency.cost == "latency") and not cfg.latency.table, save=False)

        if not self.dist.distributed:
            return resolve()
        costs, payload = None, None
        if self.dist.is_main:
            try:
                costs = resolve()
                payload = ("ok", costs.rows, costs.fixed, costs.fingerprint, costs.unit,
                           costs.description)
            except FbnasError as e:
                payload = ("error", str(e))
                self.dist.broadcast_object(payload)
                raise
        payload = self.dist.broadcast_object(payload)
        if costs is not None:
            return costs
        if payload[0] == "error":
            raise FbnasError(f"rank 0: {payload[1]}")
        return CostSource(*payload[1:])

    def _setup_distributed(self, fresh: bool) -> None:
        """DDP for the weight path, averaged θ gradients, rank-identical Gumbel noise."""
        from fbnas.distributed import (
            PeriodicAverager,
            SharedSampling,
            average_grads_before_step,
            rank_seed,
            wrap_ddp,
        )

        d, net = self.dist, self.model
        theta = net.arch_parameters()
        # θ stays outside DDP: weight steps give it no gradient, and its own gradients (θ steps,
        # which bypass DDP) are averaged just before each Adam step.
        d.broadcast_tensors(theta)
        average_grads_before_step(d, self.theta_opt)
        # only the sampled candidates run in single_path / two_path: the others get no gradient
        self._ddp = wrap_ddp(net, d, ignore=theta,
                             find_unused_parameters=self.cfg.search.mode != "full")
        if self._rank_bn:  # this rank's BN statistics from the checkpoint (after DDP's broadcast)
            from fbnas.distributed import load_rank_bn

            load_rank_bn(net, self._rank_bn)
        phases = {"w": 1, "theta": 2, "val": 3}
        SharedSampling(net, lambda: (self.cfg.search.seed, self.epoch,
                                     phases.get(self.phase, 0), self.step), self.device)
        self._averager = PeriodicAverager(d, net.weight_parameters(), self.w_opt,
                                          self.cfg.run.ddp_sync_every)
        if fresh:  # each rank its own augmentation stream (the model is already built)
            seed_everything(rank_seed(self.cfg.search.seed, d.rank, 0))

    def _dist_step(self, phase: str, step_fn, x: torch.Tensor, y: torch.Tensor
                   ) -> dict[str, float]:
        """One step under torchrun: a w step runs its forward/backward through DDP (gradients
        averaged, or with run.ddp_sync_every > 1 kept local under no_sync); θ steps run on the
        bare supernet (θ's gradients are averaged by the θ optimizer's pre-hook)."""
        if phase != "w":
            return step_fn(x, y)
        ddp, net = self._ddp, self.model
        self.model = ddp
        try:
            if self._averager.active:
                with ddp.no_sync():
                    out = step_fn(x, y)
            else:
                out = step_fn(x, y)
        finally:
            self.model = net
        self._averager.after_step()
        return out

    def _end_phase(self, sums: dict[str, float], count: int) -> tuple[dict[str, float], int]:
        """Average what is still local (weights under ddp_sync_every > 1, BN statistics) and
        sum the phase's metrics over the ranks."""
        from fbnas.distributed import sync_bn_stats

        self._averager.sync()
        sync_bn_stats(self.dist, self.net)
        keys = sorted(sums)
        tot = self.dist.sum_floats([float(count)] + [sums[k] for k in keys])
        return dict(zip(keys, tot[1:], strict=True)), int(tot[0])

    def _gather_rank_states(self) -> list[dict[str, Any]]:
        """Every rank's own state (RNG, partial sums, BN statistics), for the checkpoint; the
        weights are averaged first when ddp_sync_every > 1 left them apart."""
        from fbnas.distributed import gather_rank_states

        self._averager.sync()
        return gather_rank_states(self.dist, self.net, self.partial)

    # ---- logging ---------------------------------------------------------------------------------
    def _log_epoch(self, rec: dict[str, Any]) -> None:
        if not self.dist.is_main:  # rank 0 alone writes history, the log and TensorBoard
            return
        write_json_atomic(self.run_dir / "history.json", self.history)
        msg = (f"epoch {rec['epoch']}/{self.cfg.search.epochs} tau {rec['tau']:.3f} "
               f"w_ce {rec.get('w_ce', float('nan')):.3f} w_acc {rec.get('w_acc', 0):.3f}")
        if "theta_loss" in rec:
            msg += (f" theta_loss {rec['theta_loss']:.3f} E[cost] {rec['theta_cost']:.1f}"
                    f"{self.costs.unit}")
        if "val_acc" in rec:
            msg += f" val_acc {rec['val_acc']:.3f}"
        msg += f" argmax_cost {rec['argmax_cost']:.1f}{self.costs.unit} ({rec['seconds']:.1f}s)"
        self.log.info(msg)
        if not self.cfg.run.tensorboard:
            return
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tb"))
        w, e = self.writer, rec["epoch"]
        for k, v in rec.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "epoch":
                group = ("loss" if k.endswith(("ce", "loss", "cost_term")) else
                         "acc" if k.endswith("acc") else "cost" if "cost" in k else "sched")
                w.add_scalar(f"{group}/{k}", v, e)
        for li, (probs, ent) in enumerate(zip(rec["probs"], rec["entropy"], strict=True)):
            ops = self.cfg.space.layer_candidates()[li]
            w.add_scalars(f"theta/layer{li:02d}", dict(zip(ops, probs, strict=True)), e)
            w.add_scalar(f"entropy/layer{li:02d}", ent, e)
        w.add_scalar("entropy/mean", sum(rec["entropy"]) / len(rec["entropy"]), e)


def check_kept_settings(saved: dict[str, Any], now: dict[str, Any], sections: Sequence[str],
                        resumable: set[tuple[str, str]], added: dict[tuple[str, str], Any],
                        where: Path) -> None:
    """A resumed run must keep its settings: every key of `sections` in the checkpoint's
    resolved config `saved` equals `now`'s, except the `resumable` ones; a key missing from an
    older checkpoint counts as its `added` value."""
    for section in sections:
        a, b = saved.get(section, {}), now.get(section, {})
        for key in sorted(set(a) | set(b)):
            old = a.get(key, added.get((section, key)))
            if (section, key) not in resumable and old != b.get(key):
                raise FbnasError(f"{where}: {section}.{key} was {old!r} in this run, "
                                 f"now {b.get(key)!r}; a resumed run must keep its settings "
                                 "(start a new run to change them)")


def run_trainer(make: Callable[[DistContext], Any], device: str, backend: str
                ) -> tuple[DistContext, Any]:
    """The `fbnas train` / `fbnas retrain` run: join the torchrun process group (a single
    process otherwise), build the trainer with `make(ctx)`, fit it, close its log and the group.
    Returns (context, fit's result), or (context, None) when Ctrl-C/SIGTERM stopped it."""
    from fbnas.distributed import init_from_env

    ctx = init_from_env(device=device, backend=backend)
    try:
        trainer = make(ctx)
        try:
            return ctx, trainer.fit()
        except Interrupted:
            return ctx, None
        finally:
            close_logger(trainer.log)
    finally:
        ctx.close()


def _logger_name(run_dir: Path, rank: int = 0) -> str:
    return f"fbnas.run.{run_dir.resolve()}" + (f".rank{rank}" if rank else "")


def run_log_handlers(run_dir: Path, rank: int = 0) -> set[logging.Handler]:
    """The handlers the run's logger has now (to close only those added after)."""
    return set(logging.getLogger(_logger_name(run_dir, rank)).handlers)


def _make_logger(run_dir: Path, rank: int = 0, file: bool = True) -> logging.Logger:
    """The run's logger: the console, and run_dir/train.log on rank 0 (`file=False`: the
    console, and a buffer that `attach_log_file` writes to train.log once the run starts)."""
    if rank:  # another rank of a torchrun job: warnings only, to stderr, nothing in run_dir
        log = logging.getLogger(_logger_name(run_dir, rank))
        log.setLevel(logging.WARNING)
        log.propagate = False
        if not log.handlers:
            sh = logging.StreamHandler()
            sh.setFormatter(logging.Formatter(f"[rank {rank}] %(message)s"))
            log.addHandler(sh)
        return log
    log = logging.getLogger(_logger_name(run_dir))
    log.setLevel(logging.INFO)
    log.propagate = False
    if not any(type(h) is logging.StreamHandler for h in log.handlers):
        sh = logging.StreamHandler()
        sh.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(sh)
    if file:
        attach_log_file(log, run_dir)
    elif not any(isinstance(h, logging.FileHandler) for h in log.handlers):
        # lines logged while inputs are validated (e.g. a table being measured) reach
        # train.log too, once there is one; flushed by hand only
        log.addHandler(logging.handlers.MemoryHandler(1 << 20, flushLevel=logging.CRITICAL + 1))
    return log


def attach_log_file(log: logging.Logger, run_dir: Path) -> None:
    """Add run_dir/train.log (created if needed) to `log`, once, writing what was buffered."""
    buffers = [h for h in log.handlers if isinstance(h, logging.handlers.MemoryHandler)]
    fh = next((h for h in log.handlers if isinstance(h, logging.FileHandler)), None)
    if fh is None:
        ensure_dir(run_dir)
        fh = logging.FileHandler(run_dir / "train.log")
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s",
                                          "%H:%M:%S"))
        log.addHandler(fh)
    for mh in buffers:
        mh.setTarget(fh)
        mh.flush()
        log.removeHandler(mh)
        mh.close()


def close_logger(log: logging.Logger, keep: set[logging.Handler] | frozenset = frozenset()
                 ) -> None:
    """Close and remove the logger's handlers (but those in `keep`: another live trainer's)."""
    for h in list(log.handlers):
        if h in keep:
            continue
        if isinstance(h, logging.handlers.MemoryHandler):
            h.setTarget(None)  # a refused run's buffer goes nowhere
        h.close()
        log.removeHandler(h)

