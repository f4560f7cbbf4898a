"""Is a task hard enough for a benchmark of its space?

Takes --networks networks of one cost band (FLOPs within ±--band of one value: the --at
quantile of the space's networks, its median by default, or --flops; counted, so no latency
table has to be timed), trains each with the child recipe (`fbnas retrain`'s ChildTrainer,
the config's retrain and data sections, retrain.seed = each of --seeds; one torch thread per
worker process) and prints, per
network, the mean test top-1 over the seeds and its sd; then the RMS seed sd, the standard
error of a network's truth (RMS sd / sqrt(seeds)), the 95th and 80th percentiles of the
networks' means and their gap, the gap in units of that standard error, and the best
network's mean. A task is accepted when the gap is at least 3 standard errors and the
best network is not saturated (about 95% or less).

The percentile gap of a few networks is itself noisy (with 8 networks p95 and p80 are read
between the top two), so the pilot also prints the gap a normal spread of the networks' truths
implies: the observed means' variance is the truths' plus SE², so the truths' sd is
sqrt(sd_between² - SE²) and their 95th - 80th percentile gap 0.803 times that (z 1.645 - 0.842),
with a bootstrap interval over the networks.

    python -m scripts.search.pilot_task --config configs/cluttered_digits.yaml --workers 2 \\
        --at 0.3 --log /tmp/pilot.log --out /tmp/pilot.jsonl

Each finished training is appended to --out (JSON lines): a re-run with the same --out skips
the (network, seed) pairs it holds, so a killed pilot resumes; `--report` prints the figures
of what it holds (for the --seeds given) and trains nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import statistics
import time
from pathlib import Path

import numpy as np

from fbnas.io import write_text_atomic
from scripts.common import band, band_arguments, band_config, train


def summary(rows: list[dict], seeds: list[int]) -> dict:
    """The pilot's figures from its (network, seed) records, in accuracy points."""
    by: dict[str, dict[int, float]] = {}
    for r in rows:
        by.setdefault(r["name"], {})[r["seed"]] = 100 * r["test"]
    full = {k: [v[s] for s in seeds] for k, v in by.items() if all(s in v for s in seeds)}
    means = {k: statistics.fmean(v) for k, v in full.items()}
    sds = {k: statistics.stdev(v) for k, v in full.items()}
    rms = math.sqrt(statistics.fmean(s * s for s in sds.values()))
    se = rms / math.sqrt(len(seeds))
    p95, p80 = (float(np.percentile(list(means.values()), q)) for q in (95, 80))
    between = statistics.stdev(means.values())
    model = model_gap(between, se)
    # the normal model's ratio over networks drawn again (seeded: the report is reproducible)
    names = sorted(full)
    m, v = np.array([means[k] for k in names]), np.array([sds[k] ** 2 for k in names])
    pick = np.random.default_rng(0).integers(len(names), size=(BOOTSTRAP, len(names)))
    b_se = np.sqrt(v[pick].mean(axis=1) / len(seeds))
    b_between = m[pick].std(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = model_gap(b_between, b_se) / b_se
    return {"networks": len(full), "means": means, "sds": sds, "rms_sd": rms, "se": se,
            "p95": p95, "p80": p80, "gap": p95 - p80, "ratio": (p95 - p80) / se,
            "best": max(means.values()), "worst": min(means.values()),
            "sd_between": between, "model_gap": model,
            "model_ratio": model / se if se > 0 else math.inf,
            "model_interval": tuple(float(x) for x in np.percentile(boot, (2.5, 97.5)))}


BOOTSTRAP = 2000
Z95_MINUS_Z80 = 1.6449 - 0.8416  # standard normal quantiles


def model_gap(sd_between, se):
    """The 95th - 80th percentile gap of the networks' truths if they spread normally: the
    observed means' sd is the truths' and each mean's noise (SE) in quadrature. Floats or
    arrays of them (the bootstrap's draws)."""
    gap = Z95_MINUS_Z80 * np.sqrt(np.maximum(0.0, np.square(sd_between) - np.square(se)))
    return float(gap) if np.ndim(gap) == 0 else gap


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    band_arguments(ap, networks=20, seeds="0,1,2")
    ap.add_argument("--flops", type=float, default=None,
                    help="the band's centre in FLOPs (default: the --at quantile of the space)")
    ap.add_argument("--log", default=None, help="a progress log (one line per training)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    cfg = band_config(a)
    seeds = [int(s) for s in a.seeds.split(",")]
    centre, nets, held = band(cfg, a.flops, a.at, a.band, a.networks, a.draw)
    print(f"{a.config}: {cfg.data.dataset}, input {cfg.space.macro.input_size}, "
          f"{cfg.retrain.epochs} epochs; band {centre / 1e6:.3f} MFLOPs ±{100 * a.band:g}% "
          f"holds {held} networks, {len(nets)} drawn; seeds {seeds}; {a.workers} worker(s)",
          flush=True)
    out = Path(a.out) if a.out else None
    rows = []
    if out is not None and out.is_file():
        rows = [json.loads(ln) for ln in out.read_text().splitlines() if ln.strip()]
    names = {n.name for n, _ in nets}
    others = [r for r in rows if not (r["name"] in names and r["seed"] in seeds)]  # kept
    rows = [r for r in rows if r["name"] in names and r["seed"] in seeds]
    done = {(r["name"], r["seed"]) for r in rows}
    jobs = [] if a.report else [(cfg, n.to_dict(), s) for s in seeds for n, _ in nets
                                if (n.name, s) not in done]
    log = open(a.log, "a") if a.log else None  # noqa: SIM115 (closed below)
    try:
        pool = mp.get_context("fork").Pool(a.workers) if a.workers > 1 else None
        results = pool.imap_unordered(train, jobs) if pool else map(train, jobs)
        for k, r in enumerate(results, 1):
            rows.append(r)
            if out is not None:  # the whole file rewritten atomically: a kill leaves it whole
                write_text_atomic(out, "".join(json.dumps(x) + "\n" for x in others + rows))
            if log is not None:
                log.write(f"{time.strftime('%H:%M:%S')} {k}/{len(jobs)} {r['name']} seed "
                          f"{r['seed']}: test {100 * r['test']:.2f} val {100 * r['val']:.2f} "
                          f"({r['seconds']} s)\n")
                log.flush()
        if pool is not None:
            pool.close()
            pool.join()
    finally:
        if log is not None:
            log.close()
    flops = {n.name: f for n, f in nets}
    complete = {n for n in names if all((n, sd) in {(r["name"], r["seed"]) for r in rows}
                                        for sd in seeds)}
    if len(complete) < 2 or len(seeds) < 2:
        print(f"{len(complete)} network(s) trained under every seed of {seeds}: no figures")
        return 0
    s = summary(rows, seeds)
    print(f"{'network':10s} {'MFLOPs':>7s} {'mean':>6s} {'sd':>5s}  ops")
    ops = {r["name"]: r["ops"] for r in rows}
    for k in sorted(s["means"], key=s["means"].get, reverse=True):
        print(f"{k:10s} {flops[k] / 1e6:7.3f} {s['means'][k]:6.2f} {s['sds'][k]:5.2f}  "
              f"{' '.join(o.replace('ir_', '') for o in ops[k])}")
    print(f"networks {s['networks']}, seeds {len(seeds)}: RMS seed sd {s['rms_sd']:.2f} pt, SE of "
          f"a network's truth {s['se']:.2f} pt; between networks sd {s['sd_between']:.2f} pt, "
          f"range {s['worst']:.2f}-{s['best']:.2f}")
    print(f"p95 {s['p95']:.2f}, p80 {s['p80']:.2f}: gap {s['gap']:.2f} pt = "
          f"{s['ratio']:.2f} SE; best {s['best']:.2f}%")
    lo, hi = s["model_interval"]
    print(f"normal model: truths' sd {s['model_gap'] / Z95_MINUS_Z80:.2f} pt, gap "
          f"{s['model_gap']:.2f} pt = {s['model_ratio']:.2f} SE (95% interval over networks "
          f"{lo:.2f}-{hi:.2f})")
    ok = s["ratio"] >= 3 and s["best"] <= 95
    print(f"criterion (gap >= 3 SE, best about 95% or less): {'met' if ok else 'not met'}; "
          f"wall {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
