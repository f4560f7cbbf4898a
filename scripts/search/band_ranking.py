"""How well does a finished search's supernet rank the networks of its target's band?

For each RUN: the networks its cost table predicts within ±--band of the run's target (all of
them, or --sample N drawn with seed 0 plus every network the truth holds and the final pick's
candidates), each scored as a path on the supernet (validation split, BatchNorm re-estimated:
as the final pick scores them). Against the test accuracy of the networks a duel's random side
trained (--pairs: a duel's pairs file, `fbnas bench duel`; those of the run's target, the mean
where a network was trained more than once): Kendall τ and Spearman ρ of the path accuracy,
of the path CE (negated) and of θ's log-probability; the percentile, among those trained
networks, of the one the supernet ranks first and the mean of its first three; the path
accuracy of the band's best, 90th percentile and median, and of the final pick's candidates.

    python -m scripts.search.band_ranking runs/duel/runs/0.5x-seed0 runs/duel/runs/0.8x-seed0 \\
        --pairs results/duel/cluttered_digits-2026-11-27.json [--sample 100]

Counted on the validation split with one thread; nothing is timed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
from pathlib import Path
from types import SimpleNamespace

import torch
from scipy.stats import kendalltau, spearmanr

from fbnas.arch import log_prob
from fbnas.fit.search_run import SearchRun
from fbnas.training.evaluate import validate_weights


def trained_truth(pairs: dict, target: str) -> dict[tuple[int, ...], float]:
    """Test accuracy of every network the pairs' random sides trained at `target` (mean over
    the pairs that trained it)."""
    seen: dict[tuple[int, ...], list[float]] = {}
    for p in pairs.values():
        if p.get("target") == target:
            for n in p.get("random", {}).get("trained", []):
                seen.setdefault(tuple(n["indices"]), []).append(float(n["test_acc"]))
    return {k: statistics.fmean(v) for k, v in seen.items()}


def band(run: SearchRun, width: float) -> list[tuple[int, ...]]:
    cfg = run.config
    model = run.costs.model(cfg.space)
    cands = cfg.space.decision_candidates()
    return [i for i in itertools.product(*(range(len(c)) for c in cands))
            if abs(model.of(list(i)) / run.target - 1) <= width]


def score(run: SearchRun, nets: list[tuple[int, ...]]) -> dict[tuple[int, ...], dict]:
    cfg, net, data = run.config, run.supernet().eval(), run.search_data()
    solo = SimpleNamespace(distributed=False)
    out = {}
    for i in nets:
        r = validate_weights(net, data, torch.device("cpu"), *net.path(list(i)),
                             cfg.search.bn_calib_samples, solo)
        out[i] = {"acc": r["acc"], "ce": r["ce"], "logp": log_prob(run.theta, i)}
    return out


def pct(value: float, among: list[float]) -> float:
    return sum(x < value for x in among) / len(among)


def report(path: str, pairs: dict, width: float, sample: int | None) -> None:
    run = SearchRun.open(path)
    target = str(run.config.loss.target)
    truth = trained_truth(pairs, target)
    nets = band(run, width)
    pick = (run.arch.meta.get("final_pick") or {}) if run.arch is not None else {}
    pick_cands = [tuple(c) for c in pick.get("candidates_indices", [])]
    if sample is not None:
        keep = set(truth) | set(pick_cands)
        rest = [i for i in nets if i not in keep]
        random.Random(0).shuffle(rest)
        nets = [i for i in nets if i in keep] + rest[:sample]
    s = score(run, nets)
    common = [k for k in truth if k in s]
    y = [truth[k] for k in common]
    print(f"{path}: target {target} ({run.target:.1f} {run.costs.unit}), {len(band(run, width))} "
          f"networks within ±{width:.0%}, {len(s)} scored, {len(common)} with trained truth")
    if len(common) >= 3:
        for name, key, sign in (("path acc", "acc", 1), ("path CE", "ce", -1),
                                ("θ log-prob", "logp", 1)):
            x = [sign * s[k][key] for k in common]
            print(f"  {name:10s} Kendall τ {kendalltau(x, y)[0]:+.3f}  "
                  f"Spearman ρ {spearmanr(x, y)[0]:+.3f}")
        order = sorted(common, key=lambda k: (-s[k]["acc"], s[k]["ce"]))
        print(f"  the supernet's first among them: percentile {pct(truth[order[0]], y):.2f}; "
              f"its first three: mean {statistics.fmean(pct(truth[k], y) for k in order[:3]):.2f}")
    accs = sorted((v["acc"] for v in s.values()), reverse=True)
    print(f"  path acc over the scored band: best {accs[0]:.3f}, 90th percentile "
          f"{accs[len(accs) // 10]:.3f}, median {accs[len(accs) // 2]:.3f}")
    if pick.get("path_acc"):
        print("  the final pick's candidates read " + ", ".join(
            f"{a:.3f}" for a in pick["path_acc"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="finished search run directories")
    ap.add_argument("--pairs", required=True, help="a duel's pairs file (the trained truth)")
    ap.add_argument("--band", type=float, default=0.03, help="± around the target (0.03)")
    ap.add_argument("--sample", type=int, help="score N drawn networks (plus the truth's)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    pairs = json.loads(Path(a.pairs).read_text())["pairs"]
    for r in a.runs:
        report(r, pairs, a.band, a.sample)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
