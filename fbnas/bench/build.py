"""`fbnas bench build`: train every network of a small space under several seeds with the child
recipe, time each one end to end, and write the benchmark file (fbnas.bench.table).

Each (network, seed) is `fbnas retrain`'s training (`ChildTrainer`, the config's `retrain` and
`data` sections, `retrain.seed` = the seed), recording train / validation / test figures at
every budget (an epoch count of that one schedule: the smaller budgets are the same run's
earlier epochs, NAS-Bench-201's convention, not shorter schedules); so `fbnas retrain --config
BENCH.yaml --arch A.yaml --set retrain.seed=S` reproduces the entry at the full budget, to the
last digit (the test evaluations at the smaller budgets leave every random number generator as
it was). The config must set `retrain.threads`: the thread count changes the float reduction
order, so the build (serial or on Ray, one task of that many CPUs per network) and a user's
retrain train at that count. A Ray task first checks that its worker imports the driver's
fbnas sources; the file records the code it was built with (`fbnas.runs.provenance`).
Latency: the table's prediction, and the measured fit's end-to-end protocol (networks timed
among the table's probe networks, anchored to them), in chunks.

The file is written after every network, atomically: a killed build resumes where it stopped
(the networks done are kept); a build against another space or training config is refused.

A sampled benchmark (`sample`, a `fbnas.bench.sample.SampleSpec`) trains, instead of every
network, a reference sample drawn uniformly from the networks predicted within each target
band (the draw is written into the file before the first network trains, and a resumed build
trains that draw), plus any networks added (`add`, or later `add_to_bench`: the networks a
search or a baseline returned), each with the same seeds, recipe, records and timing.
"""

from __future__ import annotations

import itertools
import logging
import math
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fbnas import __version__
from fbnas.arch import Architecture, arch_from_indices, arch_indices, child_stats
from fbnas.backends.base import cpu_model
from fbnas.bench.sample import SampleSpec, draw_reference, reference_indices, same_draw
from fbnas.bench.table import Bench, training_record
from fbnas.config import Config
from fbnas.errors import FbnasError
from fbnas.io import clock
from fbnas.latency.end_to_end import panel, time_archs, timer_for_table
from fbnas.latency.kinds import is_measured
from fbnas.latency.resolve import resolve_costs
from fbnas.latency.table import space_hash
from fbnas.retrain import ChildTrainer
from fbnas.runs.provenance import (
    check_same_code,
    code_record,
    describe_code,
    driver_code,
    import_ray,
    worker_env,
)
from fbnas.settings import TIMING_ROUNDS
from fbnas.training._rng import rng_state, set_rng_state
from fbnas.training.logs import close_logger

MAX_NETWORKS = 5000  # a benchmark trains every network: a larger space is a mistake
TIME_CHUNK = 32  # networks timed together among the probes


def width_record(space, arch: Architecture) -> dict[str, list[int]]:
    """What a benchmark records of a network's searched widths: its stages' channels."""
    return ({"channels": [st.channels for st in arch.macro.stages]} if space.searches_widths
            else {})


def all_archs(space) -> list[Architecture]:
    """Every architecture of `space` (every op and searched width), in index order."""
    cands = space.decision_candidates()
    n = math.prod(len(c) for c in cands)
    if n > MAX_NETWORKS:
        raise FbnasError(f"space '{space.name}': {n} networks; a benchmark trains every one, "
                         f"at most {MAX_NETWORKS} (or build a sampled benchmark: --sample N)")
    return [arch_from_indices(space, list(idx), f"{space.name}_{i}")
            for i, idx in enumerate(itertools.product(*(range(len(c)) for c in cands)))]


def default_budgets(epochs: int) -> list[int]:
    """A third of the epochs and all of them."""
    return sorted({max(1, epochs // 3), epochs})


class BudgetTrainer(ChildTrainer):
    """`ChildTrainer` that also evaluates the test split at each budget epoch (RNG untouched)."""

    def __init__(self, *a, budgets: Sequence[int] = (), **kw):
        self.budgets = set(budgets)
        super().__init__(*a, **kw)

    def train_epoch(self) -> dict[str, Any]:
        rec = super().train_epoch()
        if rec["epoch"] in self.budgets:
            state = rng_state()  # a test pass draws a loader seed: the run must not notice
            t = self._evaluate(self.data.test_loader)
            set_rng_state(state)
            rec.update({"test_top1": t["top1"], "test_ce": t["ce"]})
        return rec


def train_one(cfg: Config, arch: Architecture, seed: int, budgets: Sequence[int], work: Path
              ) -> dict[str, dict[str, float]]:
    """Train `arch` with retrain.seed = `seed` in a scratch folder; budget -> record."""
    c = replace(cfg, retrain=replace(cfg.retrain, seed=seed, epochs=max(budgets),
                                     measure_latency=False),
                run=replace(cfg.run, progress=False, tensorboard=False))
    run = work / f"{arch.short_hash}-{seed}"
    shutil.rmtree(run, ignore_errors=True)
    quiet = logging.getLogger("fbnas.bench.train")
    quiet.setLevel(logging.WARNING)
    try:
        t = BudgetTrainer(c, arch, run, log=quiet, budgets=budgets)
        try:
            t.train()
        finally:
            close_logger(t.log)
    finally:
        shutil.rmtree(run, ignore_errors=True)
    out, seconds = {}, 0.0
    for rec in t.history:
        seconds += rec["seconds"]
        if rec["epoch"] in budgets:
            out[str(rec["epoch"])] = {
                "train_acc": rec["train_acc"], "train_loss": rec["train_loss"],
                "val_acc": rec.get("val_top1"), "val_ce": rec.get("val_ce"),
                "test_acc": rec["test_top1"], "test_ce": rec["test_ce"],
                "seconds": round(seconds, 3)}
    return out


def train_seeds(cfg: Config, arch: Architecture, seeds: Sequence[int], budgets: Sequence[int],
                work: str | Path, code: dict[str, Any] | None = None) -> dict[str, Any]:
    """`train_one` under each seed: seed -> budget -> record. A Ray task is given the driver's
    `code` and first checks that its worker imports the same fbnas."""
    if code is not None:
        check_same_code(code, f"bench build, network {arch.short_hash}")
    return {str(s): train_one(cfg, arch, s, budgets, Path(work)) for s in seeds}


def _train_on_ray(cfg: Config, todo: list[tuple[int, Architecture]], missing, budgets,
                  work: str, workers: int, record, log: Callable[[str], None]) -> None:
    """The networks as Ray tasks of `retrain.threads` CPUs each (`workers` at once; each
    trains at that thread count, as the serial build and `fbnas retrain` do); the driver
    records each as it finishes, so a killed build keeps every network that finished."""
    ray = import_ray(f"fbnas bench build --workers {workers}")
    threads = cfg.retrain.threads
    owned = not ray.is_initialized()
    if owned:
        ray.init(num_cpus=workers * threads, include_dashboard=False, log_to_driver=False,
                 runtime_env=worker_env())
    task = ray.remote(train_seeds).options(num_cpus=threads)
    log(f"bench: {len(todo)} networks on {workers} Ray workers, {threads} thread"
        f"{'s' * (threads > 1)} each (retrain.threads)")
    code = driver_code()
    try:
        pending = {task.remote(cfg, a, missing(a), budgets, work, code): (i, a)
                   for i, a in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            i, a = pending.pop(ready[0])
            try:
                runs = ray.get(ready[0])
            except ray.exceptions.RayTaskError as e:  # the task's own one-line error
                if isinstance(getattr(e, "cause", None), FbnasError):
                    raise FbnasError(str(e.cause)) from None
                raise
            record(i, a, runs)
    finally:
        if owned:
            ray.shutdown()


def machine() -> dict[str, Any]:
    """The building machine; `cpu_capability` is the vector code torch's kernels dispatch to
    (AVX2, AVX512, ...), which changes the float results as the thread count does."""
    return {"platform": platform.platform(), "processor": platform.processor(),
            "cpu_model": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpus": torch.get_num_threads(), "python": sys.version.split()[0]}


# torch's CPU capabilities, lowest first, and the environment that holds a host of a higher one
# to each (torch's own kernels: ATEN_CPU_CAPABILITY; the convolutions: oneDNN's ISA cap). Set
# before torch is imported, it trains to the last digit what a host of that capability trains
# (checked on an AVX512 host against a file built on an AVX2 one; docs/bench.md)
CAPABILITIES = ("DEFAULT", "AVX2", "AVX512")
CAPABILITY_ENV = {"AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def capability_env(recorded: str | None, here: str | None = None) -> dict[str, str] | None:
    """The environment under which this host (capability `here`, default torch's now) trains
    as a host of capability `recorded` did: {} where they are the same, None where it cannot
    (a lower host, or a capability with no way to hold a higher host to it)."""
    here = torch.backends.cpu.get_cpu_capability() if here is None else here
    if recorded == here:
        return {}
    if (recorded in CAPABILITY_ENV and here in CAPABILITIES
            and CAPABILITIES.index(here) > CAPABILITIES.index(recorded)):
        return dict(CAPABILITY_ENV[recorded])
    return None


def capability_hint(recorded: str | None) -> str:
    """How to train here as a host of capability `recorded` did, in words."""
    env = capability_env(recorded)
    if env is None:
        return (f"this host ({torch.backends.cpu.get_cpu_capability()}) cannot train as a "
                f"{recorded} host does")
    return " ".join(f"{k}={v}" for k, v in env.items()) or "as it is"


def build_bench(cfg: Config, out: str | Path, seeds: Sequence[int] = (0, 1),
                budgets: Sequence[int] | None = None, rounds: int = TIMING_ROUNDS,
                limit: int | None = None, workers: int | None = None,
                log: Callable[[str], None] = print, sample: SampleSpec | None = None,
                add: Sequence[tuple[Architecture, str]] = (), only_added: bool = False
                ) -> Bench:
    """Train (or resume) and time every network of `cfg.space` into the benchmark `out`, or,
    with `sample`, its reference sample and the networks of `add` ((architecture, where it came
    from) pairs; `only_added`: train only the added networks now).
    `limit`: stop after that many networks trained in this call (a partial build resumes).
    `workers` >= 2: train that many networks at once as Ray tasks of `retrain.threads` CPUs."""
    space = cfg.space
    if cfg.retrain.threads is None:
        raise FbnasError(f"{cfg.source}: retrain.threads is not set; a benchmark records what "
                         f"`fbnas retrain --config {cfg.source}` trains, which depends on the "
                         "thread count: set it (1: one thread per network)")
    budgets = sorted(set(budgets or default_budgets(cfg.retrain.epochs)))
    if budgets[-1] != cfg.retrain.epochs:
        raise FbnasError(f"bench budgets {budgets}: the largest must be retrain.epochs "
                         f"({cfg.retrain.epochs}), so that `fbnas retrain` reproduces it")
    seeds = sorted(set(int(s) for s in seeds))
    path = Path(out)
    if sample is None and add:
        raise FbnasError(f"{add[0][1]}: only a sampled benchmark (--sample N) takes added "
                         "networks; an exhaustive one holds every network of its space")
    archs = all_archs(space) if sample is None else []
    costs = resolve_costs(cfg.space, cfg.latency, log, progress=cfg.run.progress)
    table = costs.table
    meta = {"space": space.to_dict(), "space_hash": space_hash(space),
            "training": training_record(cfg), "budgets": budgets, "seeds": seeds,
            "latency": {"cost": table.cost, "unit": costs.unit, "fingerprint": costs.fingerprint,
                        "device": table.meta.get("device"), "backend": table.meta.get("backend")},
            "versions": {"fbnas": __version__, "torch": torch.__version__},
            # the code and machine that trained; a sitting on others adds its own (resume)
            "code": [{**code_record(), "machine": machine()}],
            "machine": machine(), "build_seconds": 0.0, "config": cfg.source}
    bench = Bench.load(path) if path.is_file() else Bench(meta, {}, path)
    for k in ("space_hash", "training", "budgets", "seeds"):
        if bench.meta[k] != meta[k]:
            raise FbnasError(f"{path}: was built with another {k} than {cfg.source} gives; "
                             "build into a new file")
    if sample is not None:
        archs = _sampled_archs(cfg, bench, path, sample, add, costs, log)
    elif bench.sampled:
        raise FbnasError(f"{path}: a sampled benchmark ({bench.spec.flags()}); resume it with "
                         "those flags, or add networks with `fbnas bench add`")
    here = meta["code"][0]
    built = bench.meta.setdefault("code", [])

    def sitting(c: dict[str, Any]) -> tuple:
        return c.get("source_hash"), c.get("machine")
    if not built or sitting(built[-1]) != sitting(here):
        if built:
            was = built[-1].get("machine", {}).get("cpu_capability")
            now = here["machine"]["cpu_capability"]
            isa = ("" if was is None or was == now else
                   f"; its networks were trained by {was} kernels, these are {now}: "
                   f"to train as they did, resume with {capability_hint(was)}")
            log(f"bench: {path} was built so far by {describe_code(built[-1])} on "
                f"{built[-1].get('machine', {}).get('platform')}; resuming with "
                f"{describe_code(here)} on {here['machine']['platform']} (other code or "
                f"another machine can train the same network to other last digits){isa}")
        built.append(here)
    if bench.sampled:
        bench.save()  # the draw and the added networks, before any training
    wanted = set(bench.added()) if only_added else None
    todo = [(i, a) for i, a in enumerate(archs) if not bench.complete(a.hash())
            and (wanted is None or a.hash() in wanted)]
    if limit is not None:
        todo = todo[:limit]
    t_start = last = time.perf_counter()

    def record(i: int, a: Architecture, runs: dict[str, Any]) -> None:
        h = a.hash()
        if h not in bench.networks:
            stats = child_stats(a)
            bench.networks[h] = {"ops": list(a.ops), **width_record(space, a),
                                 "params": stats["params"],
                                 "flops": stats["flops"],
                                 "predicted": round(table.predict(a, "auto", space), 3),
                                 "runs": {}}
        net = bench.networks[h]
        net["runs"].update(runs)
        nonlocal last  # wall time: Ray's networks overlap
        bench.meta["build_seconds"] = round(bench.meta["build_seconds"]
                                            + time.perf_counter() - last, 1)
        last = time.perf_counter()
        bench.save()
        full = [net["runs"][str(s)][str(budgets[-1])] for s in seeds]
        val = " ".join(f"{r['val_acc']:.3f}" for r in full if r["val_acc"] is not None)
        test = " ".join(f"{r['test_acc']:.3f}" for r in full)
        seconds = sum(r[str(budgets[-1])]["seconds"] for r in runs.values())
        log(f"[{i + 1}/{len(archs)}] {' '.join(a.ops)}: val {val}, test {test}  "
            f"({seconds:.1f} s of training, {clock(time.perf_counter() - t_start)})")

    def missing(a: Architecture) -> list[int]:
        runs = bench.networks.get(a.hash(), {}).get("runs", {})
        return [s for s in seeds if not all(str(b) in runs.get(str(s), {}) for b in budgets)]

    with tempfile.TemporaryDirectory(prefix="fbnas-bench-") as tmp:
        if workers is None or workers < 2:
            for i, a in todo:
                record(i, a, train_seeds(cfg, a, missing(a), budgets, tmp))
        else:
            _train_on_ray(cfg, todo, missing, budgets, tmp, workers, record, log)
        if is_measured(table.cost):
            _time_all(cfg, bench, table, rounds, log)
    return bench


def _sampled_archs(cfg: Config, bench: Bench, path: Path, spec: SampleSpec,
                   add: Sequence[tuple[Architecture, str]], costs, log: Callable[[str], None]
                   ) -> list[Architecture]:
    """A sampled build's networks: the reference sample (drawn now into a new file; a
    resumed build trains the file's draw, which must be `spec`'s) then the added ones (those
    of `add` recorded in the file's metadata first)."""
    space = cfg.space
    if bench.networks and not bench.sampled:
        raise FbnasError(f"{path}: an exhaustive benchmark; build the sampled one into a new "
                         "file")
    if not bench.sampled:
        bench.meta["sample"] = draw_reference(space, costs.model(space), spec, costs.unit, log)
    elif bench.spec != spec:
        raise FbnasError(f"{path}: its reference sample was drawn with {bench.spec.flags()}, "
                         f"not {spec.flags()}; resume it with those, or build into a new file")
    else:
        again = draw_reference(space, costs.model(space), spec, costs.unit, lambda s: None)
        if not same_draw(again, bench.meta["sample"]):
            log(f"bench: {path}: this config's costs now draw another reference sample than "
                "the file's (a re-measured table?); training the file's draw")
    sample = bench.meta["sample"]
    added = {n["hash"] for n in sample["added"]}
    for a, where in add:
        a.check_fits(space, where)
        if a.hash() not in added:
            sample["added"].append({"hash": a.hash(), "indices": arch_indices(space, a),
                                    "from": where})
            added.add(a.hash())
    every = dict(reference_indices(sample))  # a network both drawn and added trains once
    for n in sample["added"]:
        every.setdefault(n["hash"], n["indices"])
    return [arch_from_indices(space, idx, f"{space.name}_{h[:12]}") for h, idx in every.items()]


def add_to_bench(cfg: Config, out: str | Path, add: Sequence[tuple[Architecture, str]],
                 rounds: int = TIMING_ROUNDS, workers: int | None = None,
                 log: Callable[[str], None] = print) -> Bench:
    """Add networks (a search's or a baseline's picks) to the sampled benchmark `out`, trained
    under its seeds and budgets with `cfg`'s recipe (which must be the file's) and timed as
    its other networks; only the added networks not yet complete are trained."""
    b = Bench.load(out)
    if not b.sampled:
        raise FbnasError(f"{out}: an exhaustive benchmark holds every network of its space; "
                         "nothing to add")
    if not add:
        raise FbnasError("bench add: give the architecture files to add")
    return build_bench(cfg, out, b.seeds, b.budgets, rounds, None, workers, log, b.spec, add,
                       only_added=True)


def _time_all(cfg: Config, bench: Bench, table, rounds: int, log: Callable[[str], None]
              ) -> None:
    """Each trained network not yet timed, end to end among the table's probe networks."""
    todo = [k for k in bench if bench.networks[k].get("measured") is None]
    if not todo:
        return
    timer = timer_for_table(cfg.latency, table)
    pan = panel(cfg.space, table)
    for j in range(0, len(todo), TIME_CHUNK):
        chunk = todo[j:j + TIME_CHUNK]
        t0 = time.perf_counter()
        got = time_archs(timer, {k: bench.arch(k) for k in chunk}, table, pan, rounds)
        for k in chunk:
            bench.networks[k]["measured"] = round(got[k]["median_us"], 3)
            bench.networks[k]["measured_rel_iqr"] = round(got[k]["rel_iqr"], 4)
        bench.meta["build_seconds"] = round(bench.meta["build_seconds"]
                                            + time.perf_counter() - t0, 1)
        bench.save()
        log(f"timed {min(j + TIME_CHUNK, len(todo))}/{len(todo)} networks end to end")
