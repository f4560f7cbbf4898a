"""Is the child recipe trained to convergence? The same networks at half, once and twice its epochs.

Takes --networks networks of one cost band (as `scripts.search.pilot_task` draws them: FLOPs within
±--band of the --at quantile of the space), trains each under each of --seeds with the
config's retrain recipe at E/2, E and 2E epochs (E = retrain.epochs, or --epochs; the warm-up
kept where it fits), and prints per recipe the mean test top-1 over every (network, seed),
the RMS seed-to-seed deviation, and the paired differences (2E − E and E − E/2: the same
network and seed under both recipes) with their standard errors. A recipe is converged when
doubling it moves the mean by less than --within points while halving it moves it by more
(a longer recipe only raises what a search costs in trainings, a shorter one loses accuracy).

    python -m scripts.search.recipe_convergence --config configs/cluttered_digits.yaml \\
        --networks 8 --seeds 0,1 --workers 2 --out /tmp/convergence.jsonl

Each finished training is appended to --out (JSON lines, one record per network, seed and
epochs): a re-run with the same --out skips what it holds, so a killed run resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import statistics
import time
from dataclasses import replace
from pathlib import Path

from fbnas.config import Config
from fbnas.io import write_text_atomic
from scripts.common import band, band_arguments, band_config, train


def with_epochs(cfg: Config, epochs: int) -> Config:
    """`cfg` with its retrain recipe at `epochs` epochs (its warm-up kept where it fits)."""
    r = cfg.retrain
    return replace(cfg, retrain=replace(r, epochs=epochs,
                                        warmup_epochs=min(r.warmup_epochs, epochs - 1)))


def _job(job: tuple[Config, dict, int, int]) -> dict:
    cfg, arch_d, seed, epochs = job
    return {**train((with_epochs(cfg, epochs), arch_d, seed)), "epochs": epochs}


def figures(rows: list[dict], recipes: list[int], seeds: list[int], within: float) -> dict:
    """Per recipe the mean test accuracy (points) and RMS seed sd over the (network, seed)
    pairs trained under every recipe; the paired differences between adjacent recipes with
    their standard errors; whether the middle recipe is converged."""
    acc = {(r["name"], r["seed"], r["epochs"]): 100 * r["test"] for r in rows}
    keys = sorted({(n, s) for n, s, _ in acc if s in seeds
                   and all((n, s, e) in acc for e in recipes)})
    out: dict = {"pairs": len(keys), "networks": len({n for n, _ in keys}), "recipes": {}}
    for e in recipes:
        xs = [acc[(n, s, e)] for n, s in keys]
        by: dict[str, list[float]] = {}
        for n, s in keys:
            by.setdefault(n, []).append(acc[(n, s, e)])
        sds = [statistics.stdev(v) for v in by.values() if len(v) > 1]
        out["recipes"][e] = {"mean": statistics.fmean(xs) if xs else math.nan,
                             "rms_seed_sd": math.sqrt(statistics.fmean(s * s for s in sds))
                             if sds else math.nan}
    diffs = {}
    for lo, hi in zip(recipes, recipes[1:], strict=False):
        d = [acc[(n, s, hi)] - acc[(n, s, lo)] for n, s in keys]
        se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else math.nan
        diffs[f"{hi}-{lo}"] = {"mean": statistics.fmean(d) if d else math.nan, "se": se}
    out["diffs"] = diffs
    if len(recipes) == 3 and keys:
        half, mid, double = recipes
        up = diffs[f"{double}-{mid}"]["mean"]
        down = diffs[f"{mid}-{half}"]["mean"]
        out["converged"] = abs(up) < within and abs(down) > within
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    band_arguments(ap, networks=8, seeds="0,1")
    ap.add_argument("--epochs", type=int, default=None,
                    help="the recipe's epochs E to check (default: the config's retrain.epochs)")
    ap.add_argument("--within", type=float, default=0.5,
                    help="points: doubling must move the mean by less, halving by more")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    cfg = band_config(a)
    e = a.epochs or cfg.retrain.epochs
    recipes = sorted({max(1, e // 2), e, 2 * e})
    seeds = [int(s) for s in a.seeds.split(",")]
    centre, nets, held = band(cfg, None, a.at, a.band, a.networks, a.draw)
    print(f"{a.config}: {cfg.data.dataset}, input {cfg.space.macro.input_size}; recipes "
          f"{'/'.join(map(str, recipes))} epochs; band {centre / 1e6:.3f} MFLOPs "
          f"±{100 * a.band:g}% holds {held} networks, {len(nets)} drawn; seeds {seeds}; "
          f"{a.workers} worker(s)", flush=True)
    out = Path(a.out) if a.out else None
    rows = []
    if out is not None and out.is_file():
        rows = [json.loads(ln) for ln in out.read_text().splitlines() if ln.strip()]
    done = {(r["name"], r["seed"], r["epochs"]) for r in rows}
    jobs = [] if a.report else [(cfg, n.to_dict(), s, ep) for ep in recipes for s in seeds
                                for n, _ in nets if (n.name, s, ep) not in done]
    pool = mp.get_context("fork").Pool(a.workers) if a.workers > 1 and jobs else None
    try:
        results = pool.imap_unordered(_job, jobs) if pool else map(_job, jobs)
        for k, r in enumerate(results, 1):
            rows.append(r)
            if out is not None:  # rewritten whole, atomically: a kill leaves it whole
                write_text_atomic(out, "".join(json.dumps(x) + "\n" for x in rows))
            print(f"{time.strftime('%H:%M:%S')} {k}/{len(jobs)} {r['name']} seed {r['seed']} "
                  f"{r['epochs']} epochs: test {100 * r['test']:.2f} ({r['seconds']} s)",
                  flush=True)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    names = {n.name for n, _ in nets}
    f = figures([r for r in rows if r["name"] in names], recipes, seeds, a.within)
    if f["pairs"] < 2:
        print(f"{f['pairs']} (network, seed) pair(s) trained under every recipe: no figures")
        return 0
    print(f"{f['networks']} networks x {len(seeds)} seeds = {f['pairs']} pairs")
    print(f"{'epochs':>6s} {'mean test':>9s} {'seed sd':>8s}")
    for ep, v in f["recipes"].items():
        print(f"{ep:6d} {v['mean']:9.2f} {v['rms_seed_sd']:8.2f}")
    for k, v in f["diffs"].items():
        print(f"paired {k} epochs: {v['mean']:+.2f} pt (SE {v['se']:.2f})")
    if "converged" in f:
        print(f"{e} epochs converged (doubling moves < {a.within} pt, halving moves more): "
              f"{'yes' if f['converged'] else 'no'}; wall {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
