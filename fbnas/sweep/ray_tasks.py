"""`fbnas sweep --workers N` / `--ray-address ADDR`: a sweep's searches and retrains as Ray tasks.

Each search and each retrain of a sweep point is one Ray task asking for the resources it
uses (`num_cpus` = its torch threads, `num_gpus` = `gpus_per_task` where it trains on CUDA),
on a local Ray started for the sweep (`workers` x threads CPUs) or on a running cluster. A
searched point's retrain is submitted when its search finishes, the references' retrains at
once, the random architectures' once every search has finished (they are drawn to differ from
the searched ones). The driver prints one line per event (started, finished, failed with its
one-line reason; a task says it started, with its pid and host, in OUT/.tasks/) and a table at
the end. A failed point (an error, or its worker died more
than `retries` times) does not stop the others; the sweep then stops before timing and says
which points to re-run. When every point is done, Ray is let go and `Sweep.finish` times all
children end to end in this process, on this machine, as the serial sweep does.

Re-running resumes: every task works in its point's run directory as the serial sweep does
(finished: re-read and checked, interrupted: resumed from its checkpoint), also after its
worker was killed. A point's work depends only on its config, so its results are the serial
sweep's, bit for bit, at the same torch thread count (`fbnas sweep --threads T` for both).
A search's measured fit to a latency target (`search.fit_measure`) times networks end
to end, which must not happen while other tasks train on the machine: the search tasks fit by
the table alone, and once every search has finished, before any retrain starts, the driver
times and re-fits each searched point's network (`fit.select.refit`) with the workers idle, and
writes the result to the point's arch_hard.yaml (a re-run keeps a fit already measured). The
architectures then depend on that timing, as a serial sweep's do; θ stays bit-identical. On a
cluster, OUT, the data and the latency table cache must be on a filesystem that every node
sees at the same path (or give `latency.table`).

`FBNAS_SWEEP_KILL=<run dir name>` (e.g. `search-beta4`) is a test and benchmark hook: the task
of that run directory, when it starts without a checkpoint, SIGKILLs its own worker as soon
as its first checkpoint is written.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from fbnas.arch import Architecture
from fbnas.config import Config
from fbnas.errors import FbnasError
from fbnas.fit.search_run import SearchRun
from fbnas.fit.select import refit
from fbnas.io import ensure_dir, load_json, write_json_atomic
from fbnas.latency.kinds import is_measured
from fbnas.latency.resolve import resolve_costs
from fbnas.runs.files import RunFiles
from fbnas.runs.provenance import check_same_code, driver_code, import_ray, worker_env
from fbnas.sweep._point import retrain_point, search_done, search_point
from fbnas.sweep.driver import SearchPlan, Sweep, SweepPoint
from fbnas.training.loop import Interrupted

KILL_ENV = "FBNAS_SWEEP_KILL"
TASKS = ".tasks"  # OUT/.tasks/<phase>-<label>.json: the pid and host running that task


def _kill_at_first_checkpoint(run: Path) -> None:
    """The test hook: SIGKILL this process once `run/checkpoint.pt` exists."""
    def watch() -> None:
        while not RunFiles(run).checkpoint.is_file():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, daemon=True).start()


def run_task(phase: str, label: str, cfg: Config, arch: Architecture | None,
             extra: dict[str, Any] | None, threads: int, cwd: str, kill: str | None,
             events: str, code: dict[str, Any] | None = None) -> dict[str, Any]:
    """One search or retrain, in a Ray worker: the same work as the serial sweep's (with the
    driver's fbnas: `code`, checked)."""
    if code is not None:
        check_same_code(code, f"sweep {phase} {label}")
    if os.path.isdir(cwd):  # relative paths in the config mean what they mean to the driver
        os.chdir(cwd)
    torch.set_num_threads(threads)
    run = Path(cfg.run.dir)
    earlier = search_done(cfg) if phase == "search" else RunFiles(run).results.is_file()
    how = ("started" if not RunFiles(run).checkpoint.is_file() else
           "re-reading its finished run" if earlier else "resuming from its checkpoint")
    # where the driver sees who runs what (a file: it is there before any kill can come)
    write_json_atomic(Path(events) / f"{phase}-{label}.json",
                      {"how": how, "pid": os.getpid(), "host": socket.gethostname()})
    if kill == run.name and how == "started":
        _kill_at_first_checkpoint(run)
    t0 = time.perf_counter()
    if phase == "search":
        out: dict[str, Any] = {"arch": search_point(cfg)}
    else:
        out = {"results": retrain_point(cfg, arch, extra or {})}
    return {**out, "earlier": earlier, "seconds": time.perf_counter() - t0}


@dataclass
class Job:
    phase: str  # search | retrain
    label: str
    plan: SearchPlan | None = None
    point: SweepPoint | None = None
    status: str = "queued"  # queued | running | done | earlier | failed | not run
    seconds: float | None = None
    pid: int | None = None
    reason: str = ""


class RaySweep:
    """Runs `sweep`'s points as Ray tasks, then times them all in this process."""

    def __init__(self, sweep: Sweep, workers: int | None = None, address: str | None = None,
                 gpus_per_task: float | None = None, retries: int = 1, log=print):
        if address is None and (workers is None or workers < 2):
            raise FbnasError(f"--workers: a Ray sweep needs 2 or more, got {workers}")
        if gpus_per_task is not None and not 0 <= gpus_per_task:
            raise FbnasError(f"--gpus-per-task: must be >= 0, got {gpus_per_task}")
        if retries < 0:
            raise FbnasError(f"--retries: must be >= 0, got {retries}")
        what = f"fbnas sweep --workers {workers}" if address is None else \
            f"fbnas sweep --ray-address {address}"
        self.ray = import_ray(what)
        self.sweep, self.workers, self.address = sweep, workers, address
        self.threads = sweep.threads or (
            max(1, (os.cpu_count() or 1) // workers) if address is None else 1)
        self.gpus_per_task, self.retries, self.log = gpus_per_task, retries, log
        self.jobs: list[Job] = []

    # ---- Ray ---------------------------------------------------------------------------------
    def _start(self) -> bool:
        """Connect to Ray (a local one for this sweep unless given an address or already
        connected); True if this sweep owns the connection."""
        ray = self.ray
        self._task = ray.remote(run_task)
        if ray.is_initialized():
            return False
        if self.address is not None:
            ray.init(address=self.address, log_to_driver=False)
        else:
            ray.init(num_cpus=self.workers * self.threads, include_dashboard=False,
                     log_to_driver=False, runtime_env=worker_env())
        return True

    def _gpus(self, device: str) -> float:
        if device == "cpu":
            return 0
        if self.gpus_per_task is not None:
            return self.gpus_per_task
        return 1 if self.ray.cluster_resources().get("GPU", 0) > 0 else 0

    def _submit(self, job: Job, cfg: Config, device: str, arch=None, extra=None) -> Any:
        fn = self._task.options(
            num_cpus=self.threads, num_gpus=self._gpus(device), max_retries=self.retries,
            name=f"fbnas {job.phase} {job.label}")
        self.jobs.append(job)
        return fn.remote(job.phase, job.label, cfg, arch, extra, self.threads, os.getcwd(),
                         os.environ.get(KILL_ENV), str(self._events), driver_code())

    # ---- the sweep ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        sw, ray = self.sweep, self.ray
        t0 = time.perf_counter()
        ensure_dir(sw.out)
        c = sw.plan[0].cfg
        if any(not search_done(sp.cfg) for sp in sw.plan):
            # the latency table (and the data) once, here, before the workers load the machine
            resolve_costs(c.space, c.latency, self.log, save=False, progress=c.run.progress)
        sw._n_test()
        self.driver_fit = (is_measured(c.latency.cost) and c.loss.target is not None
                           and c.search.fit_target and c.search.fit_measure != "off")
        if self.driver_fit:
            self.log("sweep: the searched networks are timed and fitted to their targets here "
                     "once every search has finished, before the retrains (search.fit_measure)")
        self._events = ensure_dir(sw.out / TASKS)
        for f in self._events.glob("*.json"):  # an earlier run's
            f.unlink()
        owned = self._start()
        try:
            points = self._run_points()
        except KeyboardInterrupt:
            self.log("sweep: interrupted; the runs keep their last checkpoints")
            raise Interrupted from None
        finally:
            if owned:
                ray.shutdown()
        self._table()
        failed = [j for j in self.jobs if j.status in ("failed", "not run")]
        if failed:
            labels = list(dict.fromkeys(j.label for j in failed))
            self.log(f"sweep: {sum(j.status == 'failed' for j in failed)} failed; re-run the "
                     f"same command to retry {', '.join(labels)} (finished points are kept)")
            return {"failed": [{"phase": j.phase, "label": j.label, "status": j.status,
                                "reason": j.reason} for j in failed]}
        self.log(f"sweep: every point done in {time.perf_counter() - t0:.0f} s; timing the "
                 "children here")
        return sw.finish(points, t0)

    def _run_points(self) -> list[SweepPoint]:
        ray, sw = self.ray, self.sweep
        pending: dict[Any, Job] = {}
        r_dev, s_dev = sw.cfg.retrain.device, sw.cfg.search.device
        searched: dict[str, SweepPoint] = {}
        defer = self.driver_fit  # retrains wait for the driver's measured fits
        for sp in sw.plan:
            job = Job("search", sp.label, plan=sp)
            cfg = sp.cfg if not defer else replace(
                sp.cfg, search=replace(sp.cfg.search, fit_measure="off"))
            pending[self._submit(job, cfg, s_dev)] = job

        def retrain(p: SweepPoint) -> None:
            if not sw.retrain:  # a sweep of searches only
                return
            if sw.from_bench(p):  # a lookup, here
                self.jobs.append(Job("retrain", p.label, point=p, status="done", seconds=0.0))
                return
            cfg, extra = sw.retrain_job(p)
            job = Job("retrain", p.label, point=p)
            pending[self._submit(job, cfg, r_dev, p.arch, extra)] = job

        refs = sw.reference_points()
        for p in [] if defer else refs:
            retrain(p)
        randoms: list[SweepPoint] | None = None
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            self._drain()
            for ref in ready:
                job = pending.pop(ref)
                try:
                    out = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - every failure is reported, none stops
                    job.status, job.reason = "failed", self._reason(e, job)
                    self.log(f"sweep: {job.phase} {job.label} failed: {job.reason}")
                    continue
                job.status = "earlier" if out["earlier"] else "done"
                job.seconds = out["seconds"]
                if job.phase == "search":
                    p = sw.searched(job.plan, out["arch"])
                    searched[job.label] = p
                    what = f"arch {p.arch.short_hash}"
                    if not defer:
                        retrain(p)
                else:
                    job.point.results = dict(out["results"])
                    top1 = out["results"].get("top1")
                    what = f"top-1 {100 * top1:.2f}%" if top1 is not None else "done"
                self.log(f"sweep: {job.phase} {job.label} "
                         + ("finished earlier" if out["earlier"] else
                            f"finished in {out['seconds']:.0f} s") + f": {what}")
            if randoms is None and not any(j.phase == "search" for j in pending.values()):
                if defer:  # every search is done and nothing runs: time the fits here
                    for sp in sw.plan:
                        if sp.label in searched:
                            searched[sp.label] = self._measured_fit(sp, searched[sp.label])
                            retrain(searched[sp.label])
                    for p in refs:
                        retrain(p)
                if len(searched) == len(sw.plan):
                    randoms = sw.random_points([searched[sp.label] for sp in sw.plan])
                    for p in randoms:
                        retrain(p)
                else:
                    randoms = []
                    if sw.n_random:
                        self.jobs.append(Job("retrain", "random architectures",
                                             status="not run",
                                             reason="drawn once every search has finished"))
        ordered = [searched[sp.label] for sp in sw.plan if sp.label in searched]
        return ordered + refs + (randoms or [])

    def _measured_fit(self, sp: SearchPlan, p: SweepPoint) -> SweepPoint:
        """The point's searched network timed here and re-fitted to its target (`fit.select.refit`),
        saved as its arch_hard.yaml; a network measured by an earlier run of the sweep is
        kept."""
        if "measured" in (p.arch.meta or {}):
            return p
        run = Path(sp.cfg.run.dir)
        self.log(f"sweep: search {sp.label}: measured fit")
        arch = refit(SearchRun.open(run), sp.cfg.search.fit_measure,
                     lambda m: self.log(f"  {m}"))
        arch.save(RunFiles(run).arch)
        return self.sweep.searched(sp, arch)

    def _drain(self) -> None:
        """Print the tasks that started since the last look (each writes TASKS/<phase>-<label>
        .json with its pid as it starts; a new pid is a retry after its worker died)."""
        for j in self.jobs:
            f = self._events / f"{j.phase}-{j.label}.json"
            if j.status not in ("queued", "running") or not f.is_file():
                continue
            try:
                ev = load_json(f)
            except FbnasError:  # being written
                continue
            if ev.get("pid") == j.pid:
                continue
            retry = " (a retry: its worker died)" if j.status == "running" else ""
            j.status, j.pid = "running", ev.get("pid")
            self.log(f"sweep: {j.phase} {j.label} {ev.get('how')}{retry} (pid {j.pid} on "
                     f"{ev.get('host')})")

    def _reason(self, e: BaseException, job: Job) -> str:
        """The one-line reason a task failed."""
        ray = self.ray
        if isinstance(e, ray.exceptions.RayTaskError):
            cause = getattr(e, "cause", None)
            if isinstance(cause, Interrupted):
                return "interrupted (saved; a re-run resumes it)"
            if isinstance(cause, FbnasError):
                return str(cause).splitlines()[0]
            if cause is not None:
                return f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
        if isinstance(e, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                          ray.exceptions.LocalRayletDiedError)):
            pid = f" (pid {job.pid})" if job.pid else ""
            return (f"its worker{pid} died (killed, or out of memory) after "
                    f"{self.retries} retr{'y' if self.retries == 1 else 'ies'}")
        first = str(e).strip().splitlines()
        return f"{type(e).__name__}: {first[0] if first else ''}"

    def _table(self) -> None:
        """One row per point: how its search and its retrain went."""
        rows: dict[str, dict[str, str]] = {}
        for j in self.jobs:
            cell = {"done": f"done {j.seconds:.0f} s" if j.seconds is not None else "done",
                    "earlier": "done earlier"}.get(j.status, j.status)
            rows.setdefault(j.label, {})[j.phase] = cell
        self.log(f"\n{'point':<22}{'search':<16}{'retrain':<16}")
        for label, r in rows.items():
            self.log(f"{label:<22}{r.get('search', '-'):<16}"
                     f"{r.get('retrain', 'not run' if 'search' in r else '-'):<16}")
        for j in self.jobs:
            if j.status == "failed":
                self.log(f"  {j.phase} {j.label}: {j.reason}")
