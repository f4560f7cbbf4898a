"""The quickstart sweep, measured: does the search beat random architectures, and how long.

Runs `fbnas sweep` on configs/quickstart.yaml (or --config) as a user would (a fresh
latency-table cache, so the table build is part of the wall time) and prints, from its
sweep.json: the wall time, how many random architectures some searched one dominates (at least
as fast and as accurate within noise), and each searched point's measured latency and test
top-1 relative to the all-ir_k5_e6 reference (ratios of figures measured side by side in one
interleaved run).

    python -m scripts.search.sweep                      # ~ 10 minutes per seed on 2 cores
    python -m scripts.search.sweep --seeds 0,1,2        # one sweep per search seed, then a summary
    python -m scripts.search.sweep --param beta --values 0,4   # the FBNet loss instead
    python -m scripts.search.sweep --summarize runs/quickstart-sweep   # an existing sweep

With several seeds, each seed N is a separate sweep in OUT/seed-N (search.seed = N and random
architectures drawn with seed N), sharing one latency table; the last lines give, per seed, how
many random networks a searched one dominates.

Sweeps on Ray (`fbnas sweep --workers N`), against the serial sweep and after kills:

    # 6 points (3 targets x 2 search seeds in one sweep), serially and on 2 Ray workers, one
    # torch thread per point in both: wall time each, and is every point identical?
    python -m scripts.search.sweep --sweep-seeds 0,1 --retrain-epochs 3 --random 2 \\
        --threads 1 --workers 2 --against-serial --out /tmp/bench_sweep
    # then SIGKILL the driver, and (another sweep) one worker, mid-search; re-run the same
    # command: are the finished points kept, does the killed one resume, and do the results
    # equal OUT/serial's?
    python -m scripts.search.sweep --sweep-seeds 0,1 --retrain-epochs 3 --random 2 \\
        --threads 1 --workers 2 --kill driver,worker --out /tmp/bench_sweep

In these modes every sweep in OUT shares one latency table, measured first (outside the wall
times): the searches' inputs are then the same and their results can be compared bit for bit.
A search's measured fit to its target (`search.fit_measure`, on for the quickstart) times
networks end to end, so the architecture it returns depends on a timing even between two
serial runs; θ does not. Add `--set search.fit_measure=off` to compare architectures too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fbnas.config import load_config
from fbnas.latency.resolve import resolve_costs
from scripts.common import ROOT, SPACES

SAME = ("arch_hash", "predicted_us", "top1", "top5", "val_top1")


def summarize(out: Path, wall: float | None = None) -> None:
    s = json.loads((out / "sweep.json").read_text())
    pts = s["points"]
    ref = next((p for p in pts if p["label"] == "ref-all_k5_e6"), None)
    vals = ", ".join(format(v, "g") if isinstance(v, float) else str(v) for v in s["values"])
    print(f"== fbnas sweep {s['config']}: {s['param']} = {vals}; {s['test_images']} test images")
    print(f"{'point':<16}{'kind':<10}{'pred us':>10}{'meas us':>10}{'IQR':>6}{'top-1':>8}"
          f"{'x lat':>7}{'d top-1':>8}")
    for p in pts:
        x = (p["measured_us"] / ref["measured_us"]) if ref and p["measured_us"] else None
        d = (100 * (p["top1"] - ref["top1"])) if ref else None
        print(f"{p['label']:<16}{p['kind']:<10}{p['predicted_us'] or float('nan'):10.1f}"
              f"{p['measured_us'] or float('nan'):10.1f}"
              f"{100 * (p['measured_iqr'] or 0):5.1f}%{100 * p['top1']:7.2f}%"
              + (f"{x:7.2f}" if x is not None else "      -")
              + (f"{d:+8.2f}" if d is not None else "       -")
              + ("  dominated" if p["dominated"] is True else ""))
    print(f"random architectures dominated by a searched one: {s['random_dominated']}/"
          f"{s['random']} (tolerance: latency {100 * s['latency_tolerance']:.1f}%, top-1 "
          f"{100 * s['accuracy_tolerance']:.2f} pt = 1 binomial s.e.)")
    if "random_dominated_per_seed" in s:
        print("per search seed: " + ", ".join(
            f"seed {k}: {n}/{s['random']}" for k, n in s["random_dominated_per_seed"].items()))
    print(f"sweep wall time: {s['wall_seconds']:.0f} s (in-process)"
          + (f", {wall:.0f} s including start-up" if wall else ""))


# ---- sweeps on Ray: against the serial sweep, and after kills -----------------------------------
def sweep_cmd(args, out: Path, cache: Path, workers: int | None, extra=()) -> list[str]:
    """The `fbnas sweep` command of one sweep of these settings in `out`."""
    flag = "--targets" if args.param == "target" else f"--{args.param}"
    cmd = [sys.executable, "-m", "fbnas", "sweep", "--config", str(Path(args.config).resolve()),
           flag, args.values, "--random", str(args.random), "--retrain-epochs",
           str(args.retrain_epochs), "--out", str(out), "--set", f"latency.cache_dir={cache}",
           "--set", "run.progress=false", *[a for kv in args.set for a in ("--set", kv)]]
    if args.sweep_seeds:
        cmd += ["--seeds", args.sweep_seeds]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if workers and workers > 1:
        cmd += ["--workers", str(workers)]
    return [*cmd, *extra]


def build_table(args, cache: Path) -> None:
    """The sweeps' one latency table, measured before any of them (outside their times)."""
    t = time.perf_counter()
    overrides = [f"latency.cache_dir={cache}", "run.progress=false", *args.set]
    cfg = load_config(args.config, overrides)
    resolve_costs(cfg.space, cfg.latency, log=lambda m: None, save=False)
    print(f"latency table ready in {time.perf_counter() - t:.0f} s ({cache}), shared by every "
          "sweep below")


def timed_sweep(cmd: list[str], log: Path) -> tuple[float, int]:
    t = time.perf_counter()
    with log.open("w") as fh:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT).returncode
    return time.perf_counter() - t, rc


def _model(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def compare(a: Path, b: Path) -> bool:
    """Per point of two finished sweeps: same architecture and figures, bit-identical θ (the
    search checkpoint) and child weights (the retrain checkpoint)? Prints one line each."""
    pa = {p["label"]: p for p in json.loads((a / "sweep.json").read_text())["points"]}
    pb = {p["label"]: p for p in json.loads((b / "sweep.json").read_text())["points"]}
    ok = list(pa) == list(pb)
    print(f"   {'point':<22}{'arch':<14}{'figures':<9}{'theta':<11}{'weights':<9}top-1")
    for label, x in pa.items():
        y = pb.get(label)
        if y is None:
            print(f"   {label:<22}missing in {b}")
            ok = False
            continue
        figs = all(x[k] == y[k] for k in SAME)
        runs = [(Path(x["run_dir"]), Path(y["run_dir"]))]
        search = Path(x["run_dir"]).parent / f"search-{label}"
        theta = "-"
        if search.is_dir():
            sa, sb = _model(search / "checkpoint.pt"), _model(b / search.name / "checkpoint.pt")
            theta = "identical" if all(torch.equal(sa[k], sb[k]) for k in sa
                                       if k.startswith("theta")) else "DIFFERENT"
            runs.append((search, b / search.name))
        weights = all(torch.equal(m[k], n[k]) for ra, rb in runs
                      for m, n in [(_model(ra / "checkpoint.pt"), _model(rb / "checkpoint.pt"))]
                      for k in m)
        ok = ok and figs and weights and theta != "DIFFERENT"
        print(f"   {label:<22}{x['arch_hash'][:12]:<14}{'same' if figs else 'DIFFER':<9}"
              f"{theta:<11}{'same' if weights else 'DIFFER':<9}"
              f"{100 * x['top1']:.2f}% / {100 * y['top1']:.2f}%")
    print(f"   every point identical: {'yes' if ok else 'NO'}")
    return ok


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _finished(out: Path) -> dict[Path, int]:
    """checkpoint.pt -> mtime of every finished search and retrain in `out`."""
    done = [d for d in out.glob("search-*") if (d / "arch_hard.yaml").is_file()]
    done += [d for d in out.glob("retrain-*") if (d / "results.json").is_file()]
    return {d / "checkpoint.pt": (d / "checkpoint.pt").stat().st_mtime_ns for d in done}


def kill_and_rerun(args, what: str, out: Path, cache: Path, reference: Path | None) -> bool:
    """Start the sweep, SIGKILL its driver or one worker while a search is past its first
    checkpoint and some point has finished, then re-run the same command."""
    extra = ["--retries", "0"] if what == "worker" else []  # a dead worker: the re-run resumes
    cmd = sweep_cmd(args, out, cache, args.workers, extra)
    log = out.parent / f"{out.name}.log"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    victim = None
    while proc.poll() is None and victim is None:
        time.sleep(0.5)
        if not _finished(out):
            continue
        for d in sorted(out.glob("search-*")):
            if (d / "checkpoint.pt").is_file() and not (d / "arch_hard.yaml").is_file():
                victim = d
                break
    if victim is None:
        print(f"== kill {what}: the sweep ended before a search was caught mid-way ({log})")
        return False
    tasks = out / ".tasks" / f"search-{victim.name[len('search-'):]}.json"
    below = _descendants(proc.pid)
    if what == "driver":
        pid = proc.pid
    elif tasks.is_file():
        pid = json.loads(tasks.read_text())["pid"]
    else:
        print(f"== kill worker: no {tasks} (is the sweep on Ray?)")
        proc.kill()
        return False
    os.kill(pid, signal.SIGKILL)
    print(f"== kill {what}: SIGKILL pid {pid} at {time.perf_counter() - t0:.0f} s, "
          f"{victim.name} mid-way")
    rc = proc.wait()
    if what == "driver":
        time.sleep(10)
        left = sorted(p for p in below if _alive(p))
        print(f"   processes of the killed sweep still alive 10 s later: {len(left)}"
              + (f" (killed now: {left})" if left else ""))
        for p in left:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
    else:
        print(f"   the sweep went on without it and exited {rc} ({log})")
    before = _finished(out)
    wall, rc = timed_sweep(sweep_cmd(args, out, cache, args.workers), out.parent
                           / f"{out.name}-rerun.log")
    kept = sum(_finished(out).get(k) == v for k, v in before.items())
    resumed = "resumed" in (victim / "train.log").read_text()
    print(f"   re-run: exit {rc} in {wall:.0f} s; finished points kept (not recomputed): "
          f"{kept}/{len(before)}; {victim.name} resumed from its checkpoint: "
          f"{'yes' if resumed else 'NO'}")
    ok = rc == 0 and kept == len(before) and resumed
    if reference is not None and rc == 0:
        print(f"   against {reference}:")
        ok = compare(reference, out) and ok
    return ok


def ray_bench(args, out: Path) -> None:
    cache = out / "table_cache"
    out.mkdir(parents=True, exist_ok=True)
    build_table(args, cache)
    reference = None
    if args.against_serial:
        walls = {}
        for name, workers in (("serial", None), ("workers", args.workers)):
            wall, rc = timed_sweep(sweep_cmd(args, out / name, cache, workers),
                                   out / f"{name}.log")
            if rc != 0:
                sys.exit(f"{name} sweep: exit {rc}, see {out / f'{name}.log'}")
            walls[name] = wall
            print(f"== {name} sweep" + (f" (--workers {workers})" if workers else "")
                  + f": {wall:.0f} s wall (the command), "
                  f"{json.loads((out / name / 'sweep.json').read_text())['wall_seconds']:.0f} s "
                  "in-process")
        print(f"== --workers {args.workers} vs serial: {walls['serial'] / walls['workers']:.2f}x "
              f"(threads per point: {args.threads or 'default'})")
        print(f"== per point, serial vs --workers {args.workers}:")
        compare(out / "serial", out / "workers")
    for d in ("serial", "workers"):
        if reference is None and (out / d / "sweep.json").is_file():
            reference = out / d
    for what in [w for w in (args.kill or "").split(",") if w]:
        if what not in ("driver", "worker"):
            sys.exit(f"--kill: driver or worker, got {what!r}")
        target = out / f"kill-{what}"
        if target.exists():
            sys.exit(f"{target} exists: give a fresh --out or remove it")
        kill_and_rerun(args, what, target, cache, reference)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(SPACES["quickstart"]))
    ap.add_argument("--out", help="sweep folder (default: a temp dir)")
    ap.add_argument("--param", default="target", choices=("target", "beta", "lambda", "alpha"))
    ap.add_argument("--values", default="0.3x,0.5x,0.8x")
    ap.add_argument("--seeds", default="0", help="search seeds, one sweep each")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--also", help="seeds already swept in OUT/seed-N to count in the summary")
    ap.add_argument("--random", type=int, default=5)
    ap.add_argument("--retrain-epochs", type=int, default=15)
    ap.add_argument("--summarize", metavar="SWEEP_DIR", help="only print an existing sweep")
    ap.add_argument("--sweep-seeds", metavar="S1,S2",
                    help="one sweep over the values x these search seeds (fbnas sweep --seeds)")
    ap.add_argument("--threads", type=int, help="fbnas sweep --threads (torch threads per point)")
    ap.add_argument("--workers", type=int, help="fbnas sweep --workers N (on Ray)")
    ap.add_argument("--against-serial", action="store_true",
                    help="run the sweep serially (OUT/serial) and with --workers (OUT/workers): "
                         "wall times, and is each point identical?")
    ap.add_argument("--kill", metavar="driver,worker",
                    help="SIGKILL the sweep's driver / one worker mid-search (OUT/kill-WHAT), "
                         "re-run, check what was kept and resumed, compare with OUT/serial")
    args = ap.parse_args(argv)
    if args.summarize:
        summarize(Path(args.summarize))
        return
    out = Path(args.out or tempfile.mkdtemp(prefix="fbnas_sweep_"))
    if args.against_serial or args.kill:
        if not args.workers or args.workers < 2:
            sys.exit("--against-serial / --kill: give --workers N (N >= 2)")
        ray_bench(args, out)
        return
    seeds = [int(v) for v in args.seeds.split(",")]
    counts = []
    for seed in seeds:
        run_out = out / f"seed-{seed}" if len(seeds) > 1 else out
        t = time.perf_counter()
        subprocess.run(sweep_cmd(args, run_out, out / "table_cache", args.workers, [
                        "--seed", str(seed), *([] if args.sweep_seeds else
                                               ["--set", f"search.seed={seed}"])]),
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        summarize(run_out, time.perf_counter() - t)
        s = json.loads((run_out / "sweep.json").read_text())
        counts.append((seed, s["random_dominated"], s["random"]))
    for seed in [int(v) for v in args.also.split(",")] if args.also else []:
        s = json.loads((out / f"seed-{seed}" / "sweep.json").read_text())
        counts.append((seed, s["random_dominated"], s["random"]))
        seeds.append(seed)
    if len(seeds) > 1:
        print("== random networks dominated by a searched one, per seed: "
              + ", ".join(f"seed {sd}: {d}/{n}" for sd, d, n in counts))


if __name__ == "__main__":
    main()
