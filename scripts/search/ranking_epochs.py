"""How well does the supernet rank a band after E epochs? Kendall τ and top-10% recall per budget.

For each target × seed × supernet epochs (× each --set-variant): a search as `fbnas train` runs
it (search.epochs = E, a quarter of them weights only, the table's fit and the final pick off:
only the supernet is wanted) in a scratch folder, then every reference network of the target's
band in a benchmark (a sampled benchmark's band, `fbnas bench build --sample`; an exhaustive
one's networks measured within ±--near of the target) scored as a path on the supernet
(validation split, BatchNorm re-estimated: as the final pick scores them) and compared with the
benchmark's truth (mean test top-1 over its seeds): Kendall τ, and the recall of the band's top
10% (the share of the true top 10% that the supernet also puts in its top 10%). Prints one row
per run, then the mean per (variant, epochs) over targets and seeds.

    python -m scripts.search.ranking_epochs --config configs/cluttered_digits.yaml \\
        --bench configs/cluttered_digits.json.gz --targets 0.5x,0.8x --epochs 2,4,8,16 \\
        --seeds 0,1 --variant one-path:search.uniform_paths=0 --out /tmp/ranking.jsonl

Each finished run is appended to --out (JSON lines): a re-run with the same --out skips what it
holds. Nothing is timed; the searches' seconds are printed for scale only.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

from scipy.stats import kendalltau

from fbnas.bench.score import matched, supernet_ranking, truth
from fbnas.bench.table import Bench
from fbnas.fit.search_run import SearchRun
from fbnas.io import write_text_atomic
from scripts.common import search_process


def band_keys(bench: Bench, target: str, run: SearchRun, near: float) -> list[str]:
    """The benchmark's reference networks of `target`'s band (a sampled benchmark's drawn
    band, else those measured within ±`near` of the run's resolved target)."""
    keys = bench.band_keys().get(target)
    t = truth(bench)
    if keys is not None:
        return [k for k in keys if k in t]
    return matched(t, run.target, near)


def figures(scores: dict[str, tuple], t: dict[str, dict[str, float]]) -> dict[str, float]:
    """Kendall τ of the path accuracy against the truth, and the recall of the top 10%."""
    keys = list(scores)
    acc = [scores[k][0] for k in keys]
    true = [t[k]["acc"] for k in keys]
    tau = kendalltau(acc, true).statistic if len(keys) > 2 else math.nan
    top = max(1, round(0.1 * len(keys)))
    by_truth = set(sorted(keys, key=lambda k: -t[k]["acc"])[:top])
    by_net = set(sorted(keys, key=lambda k: (-scores[k][0], scores[k][1]))[:top])
    return {"tau": float(tau), "recall10": len(by_truth & by_net) / top, "networks": len(keys)}


def one(config: str, bench: Bench, target: str, seed: int, epochs: int, sets: list[str],
        near: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="fbnas-ranking-") as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.perf_counter()
        search_process(config, run_dir, [
            *sets, f"loss.target={target}", f"search.seed={seed}", f"search.epochs={epochs}",
            f"search.warmup_epochs={max(1, epochs // 4)}", "search.fit_target=false",
            "search.final_band_draws=0", "search.final_train=0", "run.progress=false",
            "run.tensorboard=false"])
        seconds = time.perf_counter() - t0
        run = SearchRun.open(run_dir)
        keys = band_keys(bench, target, run, near)
        scores = supernet_ranking(run, bench, keys)
    return {**figures(scores, truth(bench)), "search_s": round(seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/cluttered_digits.yaml")
    ap.add_argument("--bench", default="configs/cluttered_digits.json.gz")
    ap.add_argument("--targets", default="0.5x,0.8x")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--epochs", default="2,4,8,16", help="supernet epochs, comma-separated")
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="a config override for every run, as fbnas's --set (repeatable)")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:KEY=VALUE[,KEY=VALUE]: runs with these overrides as well "
                         "(repeatable; the runs without are the variant 'as-is')")
    ap.add_argument("--near", type=float, default=0.03,
                    help="an exhaustive benchmark's band: measured within ±this of the target")
    ap.add_argument("--out", default=None, help="JSON lines of the finished runs (resumes)")
    a = ap.parse_args(argv)
    bench = Bench.load(a.bench)
    variants = {"as-is": []}
    for v in a.variant:
        name, _, sets = v.partition(":")
        variants[name] = [s for s in sets.split(",") if s]
    out = Path(a.out) if a.out else None
    rows = ([json.loads(ln) for ln in out.read_text().splitlines() if ln.strip()]
            if out is not None and out.is_file() else [])
    done = {(r["variant"], r["target"], r["seed"], r["epochs"]) for r in rows}
    print(f"{'variant':>10s} {'target':>6s} {'seed':>4s} {'epochs':>6s} {'nets':>4s} "
          f"{'tau':>6s} {'top10%':>6s} {'search s':>8s}", flush=True)
    for name, sets in variants.items():
        for target in a.targets.split(","):
            for seed in (int(s) for s in a.seeds.split(",")):
                for e in (int(x) for x in a.epochs.split(",")):
                    if (name, target, seed, e) not in done:
                        r = one(a.config, bench, target, seed, e, [*a.sets, *sets], a.near)
                        rows.append({"variant": name, "target": target, "seed": seed,
                                     "epochs": e, **r})
                        if out is not None:
                            write_text_atomic(out, "".join(json.dumps(x) + "\n" for x in rows))
                    r = next(x for x in rows if (x["variant"], x["target"], x["seed"],
                                                 x["epochs"]) == (name, target, seed, e))
                    print(f"{name:>10s} {target:>6s} {seed:4d} {e:6d} {r['networks']:4d} "
                          f"{r['tau']:+6.3f} {r['recall10']:6.2f} {r['search_s']:8.1f}",
                          flush=True)
    print("\nmean over targets and seeds")
    for name in variants:
        for e in (int(x) for x in a.epochs.split(",")):
            xs = [r for r in rows if r["variant"] == name and r["epochs"] == e]
            if xs:
                tau = statistics.fmean(r["tau"] for r in xs)
                recall = statistics.fmean(r["recall10"] for r in xs)
                print(f"{name:>10s} {e:6d} epochs: tau {tau:+.3f}, top-10% recall "
                      f"{recall:.2f} ({len(xs)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
