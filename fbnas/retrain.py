"""Training a child network from scratch (the step after a search): `fbnas retrain`.

ChildTrainer is the standard recipe (SGD + Nesterov momentum or AdamW, linear warm-up then
cosine decay, label smoothing, the data section's augmentation) on the search's w ∪ θ split,
with the same checkpoint/resume/Ctrl-C behaviour as the search (fbnas.training.loop). A retrain run
directory holds:

    arch.yaml        the architecture trained (its hash is in config.yaml and results.json)
    config.yaml      the resolved config, plus the architecture hash and init source
    checkpoint.pt    kind "child": model, optimizer, RNG, position, history (resumable)
    history.json     per-epoch metrics;  train.log;  tb/ (TensorBoard)
    results.json     predicted and measured latency, accuracy, params, FLOPs (`fbnas runs`)

Model selection never looks at the test split: the reported test accuracy is of the last
epoch's weights.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.tensorboard import SummaryWriter

from fbnas.arch import Architecture, build_child, child_stats
from fbnas.config import Config, ResumePolicy, config_from_dict
from fbnas.data import build_train_data, calibration_images
from fbnas.errors import FbnasError
from fbnas.fit.search_run import SearchRun
from fbnas.io import is_number
from fbnas.latency.end_to_end import measure_child
from fbnas.latency.kinds import is_measured
from fbnas.latency.resolve import find_latency_table, predict_us
from fbnas.runs.results import results_record, write_results
from fbnas.supernet import supernet_child_state
from fbnas.training._guard import fused_optimizer, keep_fused
from fbnas.training._rng import rng_state, seed_everything
from fbnas.training._step import StepFigures, Update, metric
from fbnas.training.distributed import PeriodicAverager, rank_seed, wrap_ddp
from fbnas.training.evaluate import evaluate
from fbnas.training.logs import close_logger
from fbnas.training.loop import EpochRunner, NonFiniteLoss, torch_threads


# ---- the trainer -----------------------------------------------------------------------------
class ChildTrainer(EpochRunner):
    """Train `arch` from scratch (or from supernet weights) with `cfg.retrain`'s recipe."""

    KIND, SECTION, NEW_RUN_HINT = "child", "retrain", "--out"
    RESUME_CMD = "fbnas retrain --resume"
    # what a resumed run may change, or old checkpoints lack: the settings' declarations
    POLICY = ResumePolicy(
        compared=("data", "retrain"),
        # and from other sections: the data split's seed, and how the ranks keep in step
        also_kept=(("search", "seed"), ("run", "ddp_sync_every")))

    def __init__(self, cfg: Config, arch: Architecture | None, run_dir: str | Path,
                 resume: bool = False, init_from: str | Path | None = None,
                 log=None, extra: dict[str, Any] | None = None, dist=None):
        super().__init__(cfg, run_dir, log, dist, arch=arch, resume=resume, init_from=init_from,
                         extra=extra)

    def _setup(self, arch: Architecture | None, resume: bool, init_from: str | Path | None,
               extra: dict[str, Any] | None) -> None:
        cfg = self.cfg
        r = cfg.retrain
        state = self._open_checkpoint(resume)
        if state is not None:
            ckpt = self.files.checkpoint
            saved_arch = Architecture.from_dict(state["arch"], f"{ckpt}: arch")
            if arch is not None and arch.hash() != saved_arch.hash():
                raise FbnasError(f"{ckpt}: trains architecture {saved_arch.short_hash}, not "
                                 f"{arch.short_hash}; resume without --arch or start a new run")
            arch = saved_arch
            self._check_resume(state)
        if arch is None:
            raise FbnasError("retrain: give --arch ARCH.yaml (or --resume RUN_DIR)")
        self.arch = arch
        self._init_device(r.device)
        self._init_precision(r.precision, r.channels_last)
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
        self._init_guard()  # run.nan_check; deferred needs the fused optimizers
        fused = self.guard.deferred
        if r.optimizer == "sgd":
            self.opt: torch.optim.Optimizer = fused_optimizer(
                torch.optim.SGD, groups, fused, lr=r.lr, momentum=r.momentum,
                nesterov=r.nesterov and r.momentum > 0)
        else:
            self.opt = fused_optimizer(torch.optim.AdamW, groups, fused, lr=r.lr)
        m = arch.macro
        # the search's seed fixes the split, so val is the search's held-out part
        self.data = build_train_data(cfg.data, m.input_size, m.in_channels, m.num_classes,
                                     seed=cfg.search.seed, distributed=self.dist.shard,
                                     pin_memory=self.device.type == "cuda",
                                     device=self.device)
        self.steps_per_epoch = len(self.data.train_loader)  # this rank's batches
        self.forward: Any = self.model
        self._ddp: Any = None
        if self.dist.distributed:
            # gradients averaged in backward (or kept local under run.ddp_sync_every > 1)
            self._ddp = self.forward = wrap_ddp(self.model, self.dist)
            self._averager = PeriodicAverager(self.dist, list(self.model.parameters()),
                                              self.opt, cfg.run.ddp_sync_every)
        if r.compile:
            self.forward = torch.compile(self.forward)
        self.extra = dict(extra or {})
        self._open_run_dir()  # every input is valid: now the run directory
        if state is not None:
            self._restore(state)
        else:
            if self.dist.is_main:
                arch.save(self.run_dir / "arch.yaml")
            self._write_config({
                "arch": {"name": arch.name, "hash": arch.hash(), "file": "arch.yaml"},
                "init_from": self.init_from, **({"extra": self.extra} if self.extra else {})})
            if self.dist.distributed:  # each rank its own augmentation stream
                seed_everything(rank_seed(r.seed, self.dist.rank, 0))
            else:
                seed_everything(r.seed)  # data order and augmentation
        self._load_rank_bn()

    @property
    def bn_module(self) -> nn.Module:
        return self.model

    # ---- set-up ---------------------------------------------------------------------------
    def _init_from_supernet(self, run_dir: Path) -> None:
        run = SearchRun.open(run_dir)
        st, ck = run.state, run.checkpoint
        child = supernet_child_state(st, self.arch, str(ck))
        self.model.load_state_dict(child)
        self.log.info(f"initialised {len(child)} tensors from the supernet in {ck} "
                      f"(epoch {st['epoch']})")

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        keep_fused(self.opt, self.guard.deferred)  # this run's kernels, whatever wrote it
        self.prec.load_state_dict(state.get("scalers"))
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.history = list(state["history"])
        self._load_partial(state.get("partial"))
        self.extra = dict(state.get("extra") or self.extra)
        # a distributed checkpoint holds each rank's RNG, partial sums and BN statistics
        self._restore_ranks(state, at_epoch_start=not self.step, seed=self.cfg.retrain.seed)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "child", "epoch": self.epoch, "step": self.step,
                "model": self.model.state_dict(), "opt": self.opt.state_dict(),
                "rng": rng_state(), "config": self.cfg.resolved(), "arch": self.arch.to_dict(),
                "arch_hash": self.arch.hash(), "history": self.history,
                "partial": self._partial_state(),
                "init_from": self.init_from, "extra": self.extra,
                "scalers": self.prec.state_dict()}

    # ---- training ---------------------------------------------------------------------------
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> StepFigures:
        r = self.cfg.retrain
        lr = r.lr_at(self.epoch * self.steps_per_epoch + self.step, self.steps_per_epoch)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.model.train()
        update = Update(self.opt, list(self.model.parameters()), 0, r.grad_clip,
                        ddp=self._ddp, averager=self._averager)
        # every rank stops at the same step (the non-finite flags are all-reduced)
        with self.stepper.update(update) as u:
            with self.prec.autocast():
                logits = self.forward(self.prec.input(x))
            logits = logits.float()  # the loss in float32 under any retrain.precision
            loss = F.cross_entropy(logits, y, label_smoothing=r.label_smoothing)
            self.prec.scale(loss).backward()
            u.terms = {"loss": loss}
        acc = (logits.detach().argmax(1) == y).float().mean()
        # loss and acc stay on the device (no sync per step; read at the epoch's end), weighted
        # by the batch's samples; a step the deferred check skipped counts none
        return StepFigures({"loss": metric(loss), "acc": metric(acc)}, weight=float(len(y)),
                           skip=u.skip, shown={"lr": lr})

    def _non_finite(self, terms: list[str], step: int, count: int = 1) -> None:
        self._rewind(step)  # deferred check: back to the bad step, whose update was skipped
        self.save()  # nothing was applied from that step on: this is the last good state
        what = "loss" if "loss" in terms else "gradient (the loss was finite)"
        raise NonFiniteLoss(f"non-finite {what} at epoch {self.epoch + 1}/"
                            f"{self.cfg.retrain.epochs} step {step + 1}; stopped after saving "
                            f"the last good state in {self.files.checkpoint} (lower "
                            "retrain.lr?)")

    def train_epoch(self) -> dict[str, Any]:
        r = self.cfg.retrain
        self.data.set_epoch(self.epoch)
        if not self.step:
            self.partial = {}
        t0 = time.perf_counter()

        def before_stop() -> None:  # the time spent so far survives the interruption
            self.partial["seconds"] = self.partial.get("seconds", 0.0) + time.perf_counter() - t0

        sums = self._run_phase(self.data.iterate(self.data.train_loader, start=self.step),
                               self.steps_per_epoch, f"retrain {self.epoch + 1}/{r.epochs}",
                               self.train_step, ("loss",), before_stop)
        seconds = self.partial.get("seconds", 0.0) + time.perf_counter() - t0
        means = sums.means()
        rec: dict[str, Any] = {"epoch": self.epoch + 1, "train_loss": means.get("loss", 0.0),
                               "train_acc": means.get("acc", 0.0),
                               "lr": self.opt.param_groups[0]["lr"], "seconds": seconds,
                               "images_per_s": sums.weight / max(seconds, 1e-9)}
        if self.data.val_loader is not None:
            v = self._evaluate(self.data.val_loader)
            rec.update({"val_top1": v["top1"], "val_top5": v["top5"], "val_ce": v["ce"]})
        return rec

    def train(self) -> dict[str, Any]:
        """Train to the last epoch, then evaluate on test and write results.json. Ctrl-C saves
        the exact position and raises Interrupted; `fbnas retrain --resume` continues."""

        r = self.cfg.retrain
        self.log.info(f"retrain {self.arch.name} [{self.arch.short_hash}]: {r.epochs} epochs, "
                      f"{r.optimizer} lr {r.lr}, {self.steps_per_epoch} steps/epoch, "
                      f"device {self.device}"
                      + (f", {r.threads} thread{'s' * (r.threads > 1)}" if r.threads else "")
                      + (f", {r.precision}" if r.precision != "float32" else "")
                      + (", channels_last" if self.prec.channels_last else "")
                      + (f", from supernet {self.init_from}" if self.init_from else ""))
        if (warn := self.prec.warning("retrain")) is not None:
            self.log.warning(warn)
        with torch_threads(r.threads):  # retrain.threads: the training's and the test's
            self._run_epochs(r.epochs)
            return self.finish()

    def finish(self) -> dict[str, Any]:
        """Test accuracy, params, FLOPs, predicted and measured latency -> results.json."""
        test = self._evaluate(self.data.test_loader)
        if not self.dist.is_main:  # rank 0 alone measures latency and writes results.json
            return {"top1": test["top1"], "top5": test["top5"], "test_ce": test["ce"]}
        stats = child_stats(self.arch)
        table, table_src = find_latency_table(self.cfg.space, self.cfg.latency, self.arch,
                                              self.log)
        predicted = None
        if table is not None:
            try:
                predicted = predict_us(table, self.arch, self.cfg.space)
            except FbnasError as e:
                self.log.warning(f"no predicted latency: {e}")
        measured = None
        if self.cfg.retrain.measure_latency and is_measured(self.cfg.latency.cost):
            measured = measure_child(self.model, self.arch, self.cfg.latency, table,
                                        space=self.cfg.space)
        last = self.history[-1] if self.history else {}
        total_s = sum(h.get("seconds", 0.0) for h in self.history)
        total_n = sum(h.get("images_per_s", 0.0) * h.get("seconds", 0.0) for h in self.history)
        res = results_record(
            kind="retrain", run_dir=str(self.run_dir),
            created=datetime.now().isoformat(timespec="seconds"),
            arch={"name": self.arch.name, "hash": self.arch.hash(), "ops": list(self.arch.ops)},
            space=self.arch.space or self.cfg.space.name, dataset=self.cfg.data.dataset,
            device=str(self.device),
            latency_device=measured["device"] if measured else None,
            target_us=target_us_of(self.arch.meta),
            predicted_us=predicted, latency_table=table_src,
            measured_us=measured["median_us"] if measured else None,
            measured_iqr=measured["rel_iqr"] if measured else None,
            top1=test["top1"], top5=test["top5"], test_ce=test["ce"],
            val_top1=last.get("val_top1"), val_ce=last.get("val_ce"),
            params=stats["params"], flops=stats["flops"],
            epochs=self.epoch, train_seconds=total_s,
            images_per_s=total_n / max(total_s, 1e-9),
            init_from=self.init_from,
            search_run=self.arch.meta.get("run") if isinstance(self.arch.meta, dict) else None,
            search_seconds=search_cost_of(self.arch.meta, "seconds"),
            search_trainings=search_cost_of(self.arch.meta, "trainings"),
            sweep=self.extra.get("sweep"), programs=None)
        write_results(self.files.results, res)
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
    def epoch_line(self, rec: dict[str, Any]) -> str:
        msg = (f"epoch {rec['epoch']}/{self.cfg.retrain.epochs} loss {rec['train_loss']:.4f} "
               f"acc {rec['train_acc']:.4f} lr {rec['lr']:.4g}")
        if "val_top1" in rec:
            msg += f" val_top1 {rec['val_top1']:.4f}"
        return msg + f" ({rec['seconds']:.1f}s, {rec['images_per_s']:.0f} img/s)"

    def tb_scalars(self, writer: SummaryWriter, rec: dict[str, Any]) -> None:
        for k, v in rec.items():
            if k != "epoch" and is_number(v):
                writer.add_scalar(f"retrain/{k}", v, rec["epoch"])


def train_child(cfg: Config, arch: Architecture, seed: int, work: str | Path,
                threads: int | None = None) -> dict[str, float]:
    """`arch` trained from scratch with the config's retrain section at retrain.seed = `seed`
    (retrain.threads = `threads` where given; no latency measured) in a scratch folder,
    removed after: validation accuracy and CE of the last epoch, test accuracy and CE, and
    the training's wall seconds (set-up and test included). What random search trains
    (fbnas.bench.duel) and what the final pick's `search.final_train` trains."""
    r = replace(cfg.retrain, seed=seed, measure_latency=False,
                threads=threads if threads is not None else cfg.retrain.threads)
    c = replace(cfg, retrain=r, run=replace(cfg.run, progress=False, tensorboard=False))
    run = Path(work) / f"{arch.short_hash}-{seed}"
    shutil.rmtree(run, ignore_errors=True)
    quiet = logging.getLogger("fbnas.retrain.train_child")
    quiet.setLevel(logging.WARNING)
    t0 = time.perf_counter()
    try:
        t = ChildTrainer(c, arch, run, log=quiet)
        try:
            res = t.train()
        finally:
            close_logger(t.log)
    finally:
        shutil.rmtree(run, ignore_errors=True)
    return {"val_acc": float(res["val_top1"]), "val_ce": float(res["val_ce"]),
            "test_acc": float(res["top1"]), "test_ce": float(res["test_ce"]),
            "seconds": time.perf_counter() - t0}


def probe_training(cfg: Config, arch: Architecture, work: str | Path, steps: int = 6,
                   clock=time.perf_counter) -> dict[str, float]:
    """What one training of `arch` with the config's retrain section costs here, from a few
    of its steps (`search.budget`'s unit, fbnas.search.budget): the seconds of building its
    trainer (`setup`), of one training step (`step`, the median of `steps` after one untimed)
    and of one evaluation batch (`eval`), and how many of each one training holds (`steps`:
    epochs × steps per epoch; `evals`: validation each epoch and the test). Nothing is kept:
    the scratch folder is removed and the weights are thrown away."""
    r = replace(cfg.retrain, measure_latency=False)
    c = replace(cfg, retrain=r, run=replace(cfg.run, progress=False, tensorboard=False))
    run = Path(work) / f"probe-{arch.short_hash}"
    shutil.rmtree(run, ignore_errors=True)
    quiet = logging.getLogger("fbnas.retrain.probe")
    quiet.setLevel(logging.WARNING)
    try:
        with torch_threads(r.threads):
            t0 = clock()
            t = ChildTrainer(c, arch, run, log=quiet)
            setup = clock() - t0
            try:
                batches = iter(t.data.iterate(t.data.train_loader))
                times = []
                for _ in range(steps + 1):
                    x, y = next(batches, None) or next(iter(t.data.iterate(
                        t.data.train_loader)))
                    x, y = x.to(t.device), y.to(t.device)
                    t1 = clock()
                    t.train_step(x, y)
                    times.append(clock() - t1)
                loader = t.data.val_loader or t.data.test_loader
                evals = []
                t.model.eval()
                with torch.no_grad():
                    for i, (x, _) in enumerate(loader):
                        if i > steps:
                            break
                        t1 = clock()
                        t.model(x.to(t.device))
                        evals.append(clock() - t1)
                n_val = len(t.data.val_loader) if t.data.val_loader is not None else 0
                per_epoch = t.steps_per_epoch
            finally:
                close_logger(t.log)
    finally:
        shutil.rmtree(run, ignore_errors=True)
    return {"setup": setup, "step": statistics.median(times[1:]),
            "eval": statistics.median(evals[1:] or evals),
            "steps": r.epochs * per_epoch, "evals": r.epochs * n_val + len(t.data.test_loader)}


def search_cost_of(meta: Any, key: str) -> float | None:
    """What the search that returned an architecture spent (its meta's `search_cost`, written
    by `fbnas train`): `seconds`, or `trainings` (R, where search.budget timed one)."""
    cost = meta.get("search_cost") if isinstance(meta, dict) else None
    v = cost.get(key) if isinstance(cost, dict) else None
    return float(v) if is_number(v) else None


def target_us_of(meta: Any) -> float | None:
    """The latency the search was asked for (its arch file's meta.target), in µs."""
    if isinstance(meta, dict) and meta.get("cost_unit") == "us" and isinstance(
            meta.get("target"), int | float):
        return float(meta["target"])
    return None


def results_line(res: dict[str, Any]) -> str:
    """The one-line report: predicted and measured latency, accuracy, params, FLOPs."""
    def us(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1f} us"

    target = (f"target {us(res['target_us'])}, "
              if res.get("target_us") is not None else "")
    return (f"{res['arch']['name']} [{res['arch']['hash'][:12]}]: {target}predicted "
            f"{us(res['predicted_us'])}, measured {us(res['measured_us'])}, "
            f"top-1 {100 * res['top1']:.2f}%, top-5 {100 * res['top5']:.2f}%, params "
            f"{res['params'] / 1e6:.3f} M, FLOPs {res['flops'] / 1e6:.1f} M")


def checkpoint_calibration(checkpoint: str | os.PathLike, arch: Architecture,
                           state: dict[str, Any], n: int) -> torch.Tensor:
    """An int8 export's calibration images: the first `n` training images of the data the
    checkpoint was trained on (its recorded config's data section; `state` is its contents,
    as `load_child` returns them)."""
    if not isinstance(state.get("config"), dict) or not state["config"]:
        raise FbnasError(f"{checkpoint}: the checkpoint holds no config, so no training "
                         "images to calibrate int8 on")
    cfg = config_from_dict(state["config"], f"{checkpoint}: config", finished=True)
    m = arch.macro
    return calibration_images(cfg.data, m.input_size, m.in_channels, m.num_classes,
                              cfg.search.seed, n)
