"""Training a child network from scratch (the step after a search): `fbnas retrain`.

ChildTrainer is the standard recipe (SGD + Nesterov momentum or AdamW, linear warm-up then
cosine decay, label smoothing, the data section's augmentation) on the search's w ∪ θ split,
with the same checkpoint/resume/Ctrl-C behaviour as the search. A retrain run directory holds:

    arch.yaml        the architecture trained (its hash is in config.yaml and results.json)
    config.yaml      the resolved config, plus the architecture hash and init source
    checkpoint.pt    kind "child": model, optimizer, RNG, position, history (resumable)
    history.json     per-epoch metrics;  train.log;  tb/ (TensorBoard)
    results.json     predicted and measured latency, accuracy, params, FLOPs (`fbnas runs`)

Model selection never looks at the test split: the reported test accuracy is of the last
epoch's weights.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fbnas.arch import Architecture, ChildNet, build_child
from fbnas.checkpoint import load_checkpoint, seed_everything
from fbnas.config import Config
from fbnas.distributed import DistContext
from fbnas.distributed import current as dist_current
from fbnas.errors import FbnasError
from fbnas.trainer import Interrupted, StopOnSignal, check_kept_settings

CHECKPOINT = "checkpoint.pt"
RESULTS = "results.json"
RESULTS_SCHEMA = 1


# ---- evaluation ------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, device: torch.device | str = "cpu"
             ) -> dict[str, float]:
    """Top-1 / top-5 accuracy and mean cross-entropy over `loader` (model in eval mode, so
    BatchNorm uses the child's own running statistics)."""
    device = torch.device(device)
    model.eval()
    n = top1 = top5 = 0
    ce = 0.0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x)
        ce += float(F.cross_entropy(logits, y, reduction="sum"))
        k = min(5, logits.shape[1])
        pred = logits.topk(k, 1).indices
        top1 += int((pred[:, 0] == y).sum())
        top5 += int((pred == y[:, None]).any(1).sum())
        n += len(y)
    return {"top1": top1 / max(n, 1), "top5": top5 / max(n, 1), "ce": ce / max(n, 1), "n": n}


# ---- child checkpoints -------------------------------------------------------------------------
def load_child(path: str | Path, device: str | torch.device = "cpu"
               ) -> tuple[Architecture, ChildNet, dict[str, Any]]:
    """(architecture, child network with the checkpoint's weights in eval mode, raw state)
    from a retrain checkpoint (a file, or a retrain run directory holding checkpoint.pt)."""
    p = Path(path)
    if p.is_dir():
        p = p / CHECKPOINT
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


def supernet_child_state(search_state: dict[str, Any], arch: Architecture,
                         where: str = "supernet") -> dict[str, torch.Tensor]:
    """The child's state dict taken from a supernet's: stem and head as they are, and for each
    layer the weights of the candidate `arch` chose (`mixed.{i}.candidates.{j}.*` ->
    `blocks.{i}.*`). The architecture must be a member of the search run's space."""
    from fbnas.config import config_from_dict

    cfg = config_from_dict(search_state["config"], where)
    arch.check_fits(cfg.space, f"{where}: architecture {arch.name}")
    src = search_state["model"]
    out: dict[str, torch.Tensor] = {}
    for k, v in src.items():
        if k.startswith(("stem.", "head.")):
            out[k] = v
    for i, (op, cands) in enumerate(zip(arch.ops, cfg.space.layer_candidates(), strict=True)):
        prefix = f"mixed.{i}.candidates.{cands.index(op)}."
        for k, v in src.items():
            if k.startswith(prefix):
                out[f"blocks.{i}.{k[len(prefix):]}"] = v
    return out


# ---- the trainer -----------------------------------------------------------------------------
class ChildTrainer(StopOnSignal):
    """Train `arch` from scratch (or from supernet weights) with `cfg.retrain`'s recipe."""

    # Keys a resumed run may change: where and how it runs, not what it computes.
    RESUMABLE_CHANGES = {("run", "dir"), ("run", "progress"), ("run", "tensorboard"),
                         ("run", "checkpoint_every_steps"), ("retrain", "device"),
                         ("retrain", "measure_latency"), ("retrain", "compile"),
                         ("retrain", "channels_last"),
                         ("data", "workers"), ("data", "root"), ("data", "eval_batch_size")}
    COMPARED = ("data", "retrain")
    # keys added since older checkpoints were written, and the value those runs had
    ADDED_KEYS = {("retrain", "precision"): "float32", ("retrain", "channels_last"): False}

    def __init__(self, cfg: Config, arch: Architecture | None, run_dir: str | Path,
                 resume: bool = False, init_from: str | Path | None = None,
                 log: logging.Logger | None = None, extra: dict[str, Any] | None = None,
                 dist: DistContext | None = None):
        from fbnas.trainer import _make_logger, close_logger, run_log_handlers

        self.cfg, self.run_dir = cfg, Path(run_dir)
        # under torchrun (fbnas.distributed): rank 0 alone writes run files and logs
        self.dist = dist or dist_current()
        # the console only until every input is validated: a refused run writes nothing
        keep = run_log_handlers(self.run_dir, self.dist.rank)
        self.log = log or _make_logger(self.run_dir, self.dist.rank, file=False)
        try:
            self._setup(arch, resume, init_from, extra, own_log=log is None)
        except BaseException:
            if log is None:
                close_logger(self.log, keep)
            raise

    def _setup(self, arch: Architecture | None, resume: bool, init_from: str | Path | None,
               extra: dict[str, Any] | None, own_log: bool) -> None:
        from fbnas.data import build_train_data
        from fbnas.trainer import attach_log_file, resolve_device

        cfg = self.cfg
        r = cfg.retrain
        ckpt = self.run_dir / CHECKPOINT
        state = None
        if resume:
            state = load_checkpoint(ckpt, kind="child")
            saved_arch = Architecture.from_dict(state["arch"], f"{ckpt}: arch")
            if arch is not None and arch.hash() != saved_arch.hash():
                raise FbnasError(f"{ckpt}: trains architecture {saved_arch.short_hash}, not "
                                 f"{arch.short_hash}; resume without --arch or start a new run")
            arch = saved_arch
            self._check_resume(state)
        elif ckpt.exists():
            raise FbnasError(f"{self.run_dir}: already holds a retrain checkpoint; resume it "
                             "with `fbnas retrain --resume DIR` or choose another --out")
        if arch is None:
            raise FbnasError("retrain: give --arch ARCH.yaml (or --resume RUN_DIR)")
        self.arch = arch
        self.device = resolve_device(r.device, "retrain.device")
        if self.dist.distributed and self.device.type == "cuda":
            self.device = self.dist.device  # one GPU per local rank
        from fbnas.precision import Precision

        self.prec = Precision(r.precision, r.channels_last, self.device, "retrain",
                              local_sgd=self.dist.distributed and cfg.run.ddp_sync_every > 1)
        torch.manual_seed(r.seed)  # weight init
        self.model = self.prec.model(build_child(arch).to(self.device))
        self.init_from = str(init_from) if init_from else (state or {}).get("init_from")
        if init_from and state is None:
            self._init_from_supernet(Path(init_from))
        decay, no_decay = [], []
        for p in self.model.parameters():
            (no_decay if p.ndim <= 1 else decay).append(p)  # no weight decay on BN and biases
        groups = [{"params": decay, "weight_decay": r.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        if r.optimizer == "sgd":
            self.opt: torch.optim.Optimizer = torch.optim.SGD(
                groups, lr=r.lr, momentum=r.momentum, nesterov=r.nesterov and r.momentum > 0)
        else:
            self.opt = torch.optim.AdamW(groups, lr=r.lr)
        m = arch.macro
        # the search's seed fixes the split, so val is the search's held-out part
        self.data = build_train_data(cfg.data, m.input_size, m.in_channels, m.num_classes,
                                     seed=cfg.search.seed, distributed=self.dist.shard,
                                     pin_memory=self.device.type == "cuda")
        self.steps_per_epoch = len(self.data.train_loader)  # this rank's batches
        self.forward: Any = self.model
        self._ddp: Any = None
        self._averager: Any = None
        self._rank_bn: list[torch.Tensor] | None = None
        if self.dist.distributed:
            from fbnas.distributed import PeriodicAverager, wrap_ddp

            # gradients averaged in backward (or kept local under run.ddp_sync_every > 1)
            self._ddp = self.forward = wrap_ddp(self.model, self.dist)
            self._averager = PeriodicAverager(self.dist, list(self.model.parameters()),
                                              self.opt, cfg.run.ddp_sync_every)
        if r.compile:
            self.forward = torch.compile(self.forward)
        self.epoch, self.step = 0, 0
        self.history: list[dict[str, Any]] = []
        self.partial: dict[str, Any] = {}
        self.extra = dict(extra or {})
        self.writer = None
        self._stop_requested = False
        if self.dist.is_main and own_log:  # every input is valid: now the run directory
            attach_log_file(self.log, self.run_dir)
        if state is not None:
            self._restore(state)
        else:
            from fbnas.io import ensure_dir, write_yaml_atomic

            if self.dist.is_main:
                ensure_dir(self.run_dir)
                arch.save(self.run_dir / "arch.yaml")
                write_yaml_atomic(self.run_dir / "config.yaml", {
                    **cfg.resolved(), "arch": {"name": arch.name, "hash": arch.hash(),
                                               "file": "arch.yaml"},
                    "init_from": self.init_from,
                    **({"extra": self.extra} if self.extra else {})})
            if self.dist.distributed:  # each rank its own augmentation stream
                from fbnas.distributed import rank_seed

                seed_everything(rank_seed(r.seed, self.dist.rank, 0))
            else:
                seed_everything(r.seed)  # data order and augmentation
        if self._rank_bn:  # this rank's own BN statistics from the checkpoint
            from fbnas.distributed import load_rank_bn

            load_rank_bn(self.model, self._rank_bn)

    # ---- set-up ---------------------------------------------------------------------------
    def _init_from_supernet(self, run_dir: Path) -> None:
        ck = run_dir / "checkpoint.pt" if run_dir.is_dir() else run_dir
        st = load_checkpoint(ck, kind="search")
        child = supernet_child_state(st, self.arch, str(ck))
        self.model.load_state_dict(child)
        self.log.info(f"initialised {len(child)} tensors from the supernet in {ck} "
                      f"(epoch {st['epoch']})")

    def _check_resume(self, state: dict[str, Any]) -> None:
        saved, now = state["config"], self.cfg.resolved()
        where = self.run_dir / CHECKPOINT
        check_kept_settings(saved, now, self.COMPARED, self.RESUMABLE_CHANGES, self.ADDED_KEYS,
                            where)
        k_old = saved.get("run", {}).get("ddp_sync_every", 1)
        if k_old != now["run"]["ddp_sync_every"]:
            raise FbnasError(f"{where}: run.ddp_sync_every was {k_old!r} in this run, now "
                             f"{now['run']['ddp_sync_every']!r}; a resumed run must keep it")
        if saved.get("search", {}).get("seed") != now["search"]["seed"]:
            raise FbnasError(f"{where}: search.seed (the data split) was "
                             f"{saved.get('search', {}).get('seed')!r}, now "
                             f"{now['search']['seed']!r}")

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.prec.load_state_dict(state.get("scalers"))
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.history = list(state["history"])
        self.partial = dict(state.get("partial") or {})
        self.extra = dict(state.get("extra") or self.extra)
        from fbnas.distributed import restore_rank_rng

        # a distributed checkpoint holds each rank's RNG, partial sums and BN statistics
        mine = restore_rank_rng(self.dist, state, at_epoch_start=not self.step,
                                seed=self.cfg.retrain.seed, epoch=self.epoch,
                                where=str(self.run_dir / CHECKPOINT), log=self.log)
        if mine is not None:
            self.partial = dict(mine.get("partial") or {})
            self._rank_bn = list(mine.get("bn") or [])
        self.log.info(f"resumed {self.run_dir} at epoch {self.epoch} step {self.step}")

    def state_dict(self) -> dict[str, Any]:
        from fbnas.checkpoint import rng_state

        return {"kind": "child", "epoch": self.epoch, "step": self.step,
                "model": self.model.state_dict(), "opt": self.opt.state_dict(),
                "rng": rng_state(), "config": self.cfg.resolved(), "arch": self.arch.to_dict(),
                "arch_hash": self.arch.hash(), "history": self.history, "partial": self.partial,
                "init_from": self.init_from, "extra": self.extra,
                "scalers": self.prec.state_dict()}

    def save(self) -> None:
        """Write the checkpoint. Under torchrun every rank calls this at the same step (it
        gathers each rank's RNG state and BN statistics) and rank 0 writes."""
        from fbnas.checkpoint import save_checkpoint

        ranks = None
        if self.dist.distributed:
            from fbnas.distributed import gather_rank_states

            self._averager.sync()  # ddp_sync_every > 1: the ranks' weights may differ
            ranks = gather_rank_states(self.dist, self.model, self.partial)
        if not self.dist.is_main:
            return
        state = self.state_dict()
        if ranks is not None:
            state.update(world_size=self.dist.world_size, ranks=ranks)
        save_checkpoint(self.run_dir / CHECKPOINT, state)

    # ---- training ---------------------------------------------------------------------------
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        r = self.cfg.retrain
        lr = r.lr_at(self.epoch * self.steps_per_epoch + self.step, self.steps_per_epoch)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.model.train()
        local = self._averager is not None and self._averager.active
        # run.ddp_sync_every > 1: no gradient all-reduce; weights averaged every K steps
        with self._ddp.no_sync() if local else contextlib.nullcontext():
            with self.prec.autocast():
                logits = self.forward(self.prec.input(x))
            logits = logits.float()  # the loss in float32 under any retrain.precision
            loss = F.cross_entropy(logits, y, label_smoothing=r.label_smoothing)
            bad = not bool(torch.isfinite(loss))
            if self.dist.distributed:  # every rank stops at the same step
                bad = self.dist.any_true(bad)
            if bad:
                from fbnas.trainer import NonFiniteLoss

                self.save()  # nothing was applied yet: this is the last good state
                raise NonFiniteLoss(f"non-finite loss at epoch {self.epoch + 1}/{r.epochs} step "
                                    f"{self.step + 1}; stopped after saving the last good state "
                                    f"in {self.run_dir / CHECKPOINT} (lower retrain.lr?)")
            self.opt.zero_grad(set_to_none=True)
            self.prec.scale(loss).backward()
        if r.grad_clip:
            self.prec.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), r.grad_clip)
        self.prec.step(self.opt)
        if self._averager is not None:
            self._averager.after_step()
        acc = (logits.detach().argmax(1) == y).float().mean()
        return {"loss": loss.item(), "acc": acc.item(), "lr": lr, "n": float(len(y))}

    def train_epoch(self) -> dict[str, Any]:
        r = self.cfg.retrain
        self.data.set_epoch(self.epoch)
        if not self.step:
            self.partial = {}
        sums: dict[str, float] = dict(self.partial.get("sums", {}))
        t0 = time.perf_counter()
        bar = None
        if self.cfg.run.progress and self.dist.is_main:
            from tqdm import tqdm

            bar = tqdm(total=self.steps_per_epoch, initial=self.step, leave=False,
                       dynamic_ncols=True, desc=f"retrain {self.epoch + 1}/{r.epochs}")
        every = self.cfg.run.checkpoint_every_steps
        try:
            for x, y in self.data.iterate(self.data.train_loader, start=self.step):
                x = x.to(self.device, non_blocking=True)
                y = y.to(self.device, non_blocking=True)
                out = self.train_step(x, y)
                self.step += 1
                n = out["n"]
                sums["loss"] = sums.get("loss", 0.0) + out["loss"] * n
                sums["acc"] = sums.get("acc", 0.0) + out["acc"] * n
                sums["n"] = sums.get("n", 0.0) + n
                sums["seconds"] = sums.get("seconds", 0.0)
                self.partial = {"sums": sums}
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{out['loss']:.3g}", lr=f"{out['lr']:.3g}")
                if every and self.step % every == 0:
                    self.save()
                if self._agreed_stop():
                    sums["seconds"] += time.perf_counter() - t0
                    self.save()
                    raise Interrupted
        finally:
            if bar is not None:
                bar.close()
        seconds = sums.get("seconds", 0.0) + time.perf_counter() - t0
        if self.dist.distributed:
            from fbnas.distributed import sync_bn_stats

            self._averager.sync()  # ddp_sync_every > 1: one model again
            sync_bn_stats(self.dist, self.model)  # the ranks' BN statistics, averaged
            # the epoch's figures over every rank's samples (rank 0's clock)
            keys = ("loss", "acc", "n")
            sums = {**sums, **dict(zip(keys, self.dist.sum_floats(
                [sums.get(k, 0.0) for k in keys]), strict=True))}
        n = max(sums.get("n", 0.0), 1.0)
        rec: dict[str, Any] = {"epoch": self.epoch + 1, "train_loss": sums.get("loss", 0.0) / n,
                               "train_acc": sums.get("acc", 0.0) / n,
                               "lr": self.opt.param_groups[0]["lr"], "seconds": seconds,
                               "images_per_s": sums.get("n", 0.0) / max(seconds, 1e-9)}
        if self.data.val_loader is not None:
            v = self._evaluate(self.data.val_loader)
            rec.update({"val_top1": v["top1"], "val_top5": v["top5"], "val_ce": v["ce"]})
        return rec

    def fit(self) -> dict[str, Any]:
        """Train to the last epoch, then evaluate on test and write results.json. Ctrl-C saves
        the exact position and raises Interrupted; `fbnas retrain --resume` continues."""

        r = self.cfg.retrain
        self.log.info(f"retrain {self.arch.name} [{self.arch.short_hash}]: {r.epochs} epochs, "
                      f"{r.optimizer} lr {r.lr}, {self.steps_per_epoch} steps/epoch, "
                      f"device {self.device}"
                      + (f", {r.precision}" if r.precision != "float32" else "")
                      + (", channels_last" if r.channels_last else "")
                      + (f", from supernet {self.init_from}" if self.init_from else ""))
        if (warn := self.prec.warning("retrain")) is not None:
            self.log.warning(warn)
        self._run_epochs(r.epochs, "fbnas retrain --resume")
        return self.finish()

    def _next_epoch(self) -> None:
        self.epoch, self.step, self.partial = self.epoch + 1, 0, {}

    def _position(self) -> str:
        return f"epoch {self.epoch} step {self.step}"

    def finish(self) -> dict[str, Any]:
        """Test accuracy, params, FLOPs, predicted and measured latency -> results.json."""
        from datetime import datetime

        from fbnas.arch import child_stats
        from fbnas.io import write_json_atomic

        test = self._evaluate(self.data.test_loader)
        if not self.dist.is_main:  # rank 0 alone measures latency and writes results.json
            return {"top1": test["top1"], "top5": test["top5"], "test_ce": test["ce"]}
        stats = child_stats(self.arch)
        table, table_src = find_latency_table(self.cfg, self.arch, self.log)
        predicted = None
        if table is not None:
            try:
                predicted = predict_ms(table, self.arch, self.cfg)
            except FbnasError as e:
                self.log.warning(f"no predicted latency: {e}")
        measured = None
        if self.cfg.retrain.measure_latency and self.cfg.latency.cost == "latency":
            measured = measure_child_ms(self.model, self.arch, self.cfg.latency, table)
        last = self.history[-1] if self.history else {}
        total_s = sum(h.get("seconds", 0.0) for h in self.history)
        total_n = sum(h.get("images_per_s", 0.0) * h.get("seconds", 0.0) for h in self.history)
        res: dict[str, Any] = {
            "fbnas_results": RESULTS_SCHEMA, "kind": "retrain", "run_dir": str(self.run_dir),
            "created": datetime.now().isoformat(timespec="seconds"),
            "arch": {"name": self.arch.name, "hash": self.arch.hash(), "ops": list(self.arch.ops)},
            "space": self.arch.space or self.cfg.space.name, "dataset": self.cfg.data.dataset,
            "device": str(self.device),
            "latency_device": measured["device"] if measured else None,
            "predicted_latency_ms": predicted, "latency_table": table_src,
            "measured_latency_ms": measured["median_ms"] if measured else None,
            "measured_latency_iqr": measured["rel_iqr"] if measured else None,
            "top1": test["top1"], "top5": test["top5"], "test_ce": test["ce"],
            "val_top1": last.get("val_top1"),
            "params": stats["params"], "flops": stats["flops"],
            "epochs": self.epoch, "train_seconds": total_s,
            "images_per_s": total_n / max(total_s, 1e-9),
            "init_from": self.init_from,
            "search_run": self.arch.meta.get("run") if isinstance(self.arch.meta, dict) else None,
            "sweep": self.extra.get("sweep"),
        }
        write_json_atomic(self.run_dir / RESULTS, res)
        self.log.info(results_line(res))
        return res

    # ---- distributed (torchrun; docs/distributed.md) ---------------------------------------
    def _evaluate(self, loader) -> dict[str, float]:
        """`evaluate` on this rank's shard of `loader`, combined over the ranks."""
        v = evaluate(self.model, loader, self.device)
        if not self.dist.distributed:
            return v
        n = v["n"]
        top1, top5, ce, n = self.dist.sum_floats([v["top1"] * n, v["top5"] * n, v["ce"] * n, n])
        d = max(n, 1.0)
        return {"top1": top1 / d, "top5": top5 / d, "ce": ce / d, "n": int(n)}

    # ---- logging ---------------------------------------------------------------------------
    def _log_epoch(self, rec: dict[str, Any]) -> None:
        if not self.dist.is_main:  # rank 0 alone writes history, the log and TensorBoard
            return
        from fbnas.io import write_json_atomic

        write_json_atomic(self.run_dir / "history.json", self.history)
        msg = (f"epoch {rec['epoch']}/{self.cfg.retrain.epochs} loss {rec['train_loss']:.4f} "
               f"acc {rec['train_acc']:.4f} lr {rec['lr']:.4g}")
        if "val_top1" in rec:
            msg += f" val_top1 {rec['val_top1']:.4f}"
        msg += f" ({rec['seconds']:.1f}s, {rec['images_per_s']:.0f} img/s)"
        self.log.info(msg)
        if not self.cfg.run.tensorboard:
            return
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tb"))
        for k, v in rec.items():
            if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(f"retrain/{k}", v, rec["epoch"])


def results_line(res: dict[str, Any]) -> str:
    """The one-line report: predicted and measured latency, accuracy, params, FLOPs."""
    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f} ms"

    return (f"{res['arch']['name']} [{res['arch']['hash'][:12]}]: predicted "
            f"{ms(res['predicted_latency_ms'])}, measured {ms(res['measured_latency_ms'])}, "
            f"top-1 {100 * res['top1']:.2f}%, top-5 {100 * res['top5']:.2f}%, params "
            f"{res['params'] / 1e6:.3f} M, FLOPs {res['flops'] / 1e6:.1f} M")


# ---- latency: predicted from a table, measured end to end --------------------------------------
def find_latency_table(cfg: Config, arch: Architecture, log: logging.Logger | None = None):
    """(table, source) for predicting `arch`'s latency: `latency.table`, else the search run's
    cost_table.json (the arch file's meta.run), else this machine's cached table for the
    config's space; (None, None) when there is none (nothing is measured here)."""
    from fbnas.latency import LatencyTable
    from fbnas.trainer import cached_table_path

    if cfg.latency.cost != "latency":
        return None, None
    candidates: list[Path] = []
    if cfg.latency.table:
        candidates.append(Path(cfg.latency.table))
    run = arch.meta.get("run") if isinstance(arch.meta, dict) else None
    if run:
        candidates.append(Path(run) / "cost_table.json")
    try:
        candidates.append(cached_table_path(cfg))
    except FbnasError:
        pass
    for p in candidates:
        if p.is_file():
            try:
                t = LatencyTable.load(p)
            except FbnasError as e:
                if log is not None:
                    log.warning(f"skipping latency table: {e}")
                continue
            if t.cost == "latency":
                return t, str(p)
    return None, None


def predict_ms(table, arch: Architecture, cfg: Config) -> float:
    """The table's whole-network latency of `arch`, in ms (its calibration/corrections applied
    when the architecture belongs to the config's space)."""
    try:
        arch.check_fits(cfg.space)
        return table.predict(arch, "auto", cfg.space) / 1e3
    except FbnasError:
        return table.predict(arch, "raw") / 1e3


def measure_child_ms(model: torch.nn.Module, arch: Architecture, lat: Any, table=None,
                     protocol=None) -> dict[str, Any]:
    """End-to-end latency of the (trained) child with the latency section's timer settings,
    drift-compensated like the table's entries (same reference op, and the table's reference
    scale when there is one, so the two are in the same units)."""
    import copy

    from fbnas.latency import make_timer
    from fbnas.latency.measure import Protocol, measure

    timer = make_timer(lat.device, threads=lat.threads, batch=lat.batch, dtype=lat.dtype,
                       channels_last=lat.channels_last)
    proto = protocol or Protocol()
    net = copy.deepcopy(model).cpu()
    runs = {"child": timer.prepare(net, (arch.macro.in_channels, *arch.macro.input_size),
                                   "child")}
    m = measure(timer, runs, proto)
    ref_us = (table.reference or {}).get("scale_us") if table is not None else None
    scale_us = (ref_us or m.ref_scale_s * 1e6) if proto.reference else 1e6
    s = m.entries["child"].summary(scale_us / 1e6)
    d = timer.describe()
    device = (f"{d.get('device_name')} ({d['backend']}, {d['threads']} thread"
              f"{'s' if d['threads'] != 1 else ''}, batch {d['batch']}, {d['dtype']})")
    return {"median_ms": s["median_us"] / 1e3, "min_ms": s["min_us"] / 1e3,
            "rel_iqr": s["rel_iqr"], "n": s["n"], "device": device, "timer": d}
