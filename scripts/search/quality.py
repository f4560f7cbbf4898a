"""Does the supernet learn which operations are better?

Two parts, each printing a table:

  weights  how fast single paths train with separate vs shared weights: uniform single paths
           (SPOS) for --steps steps, the last 50 steps' mean CE, and the validation accuracy
           of 5 random single paths after BN re-estimation.
  search   whole searches (the config, --set overrides) for every --modes x --seeds: the last
           epoch's argmax_path_acc, the returned (fitted) architecture's accuracy as a path of
           the supernet, how many layers the final fit changed, whether the unfitted argmax
           is all `skip`, the weight-step CE of the epoch holding step 600, wall seconds; with
           --retrain E also that architecture retrained from scratch for E epochs (val top-1)
           and the gap.

    python -m scripts.search.quality weights --steps 600
    python -m scripts.search.quality search --seeds 0,1,2 --modes reinforce,full \\
        --retrain 20
    python -m scripts.search.quality search --config configs/digits_deep.yaml \\
        --seeds 0,1,2                      # the second small space (8 layers x 6 other ops)
    python -m scripts.search.quality search --config configs/quickstart.yaml --smoke

Accuracy figures, not timings: run it on an idle machine only for the seconds column.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml

from fbnas.arch import Architecture
from fbnas.data.loaders import take_images
from fbnas.retrain import ChildTrainer
from fbnas.training.evaluate import path_sums
from scripts.common import QUIET, SPACES, closing, run_config, search_trainer


def weights_part(config: str, steps: int, seed: int, sets: list[str]) -> None:
    print(f"single paths trained uniformly (SPOS), {steps} steps, {config}")
    print(f"{'weights':10s} {'CE last 50':>10s}  val acc of 5 random paths (BN re-estimated)")
    for weights in ("separate", "shared"):
        with tempfile.TemporaryDirectory() as tmp:
            # warm-up weight steps on uniform single paths: SearchTrainer's own step
            cfg = run_config(config, [f"search.weights={weights}", f"search.seed={seed}",
                                      "search.warmup_sampling=uniform", f"run.dir={tmp}", *QUIET,
                                      *sets])
            with closing([search_trainer(cfg, theta_active=False)]) as (t,):
                if t.theta_active():
                    raise SystemExit(f"{config}: search.warmup_epochs must be at least 1")
                ces = train_paths(t, steps)
                accs = [random_path_acc(t) for _ in range(5)]
        print(f"{weights:10s} {statistics.mean(ces[-50:]):10.3f}  "
              + " ".join(f"{a:.2f}" for a in accs))


def train_paths(t, steps: int) -> list[float]:
    """The CE of `steps` warm-up weight steps (one uniform single path each)."""
    ces: list[float] = []
    while len(ces) < steps:
        for x, y in t.data.w_loader:
            out = t.weight_step(x.to(t.device), y.to(t.device))
            ces.append(float(out["ce"]) if "ce" in out else float("nan"))
            if len(ces) >= steps:
                break
    return ces


def random_path_acc(t) -> float:
    """Validation accuracy of one uniformly drawn single path, its BN statistics re-estimated."""
    net, data = t.net, t.data
    m, active = net.path([int(torch.randint(len(th), (1,))) for th in net.theta])
    net.recalibrate_bn(take_images(data.calib_loader, 512, t.device), m, active)
    r = path_sums(net, data.val_loader, t.device, m, active)
    net.train()
    return r["correct"] / r["n"]


def search_once(config: str, sets: list[str], run: Path, retrain: int | None) -> dict:
    cfg = run_config(config, [f"run.dir={run}", *QUIET, *sets])
    t0 = time.perf_counter()
    with closing([search_trainer(cfg, theta_active=False)]) as (t,):
        res = t.train()
    seconds = time.perf_counter() - t0
    hist = res["history"]
    steps_per_epoch = len(t.data.w_loader)
    at600 = hist[min(len(hist), math.ceil(600 / steps_per_epoch)) - 1]
    cands = cfg.space.layer_candidates()
    argmax = [c[i] for c, i in zip(cands, t.net.argmax_indices(), strict=True)]
    arch = yaml.safe_load((run / "arch_hard.yaml").read_text())
    row = {"argmax_path_acc": hist[-1].get("argmax_path_acc", float("nan")),
           "final_path_acc": res.get("final_path_acc", float("nan")),
           "fitted": arch.get("meta", {}).get("fitted_layers", 0),
           "all_skip": all(o == "skip" for o in argmax),
           "w_ce_600": at600["w_ce"], "seconds": seconds, "ops": res["arch"]}
    if retrain:
        a = Architecture.load(run / "arch_hard.yaml")
        rcfg = run_config(config, [
            f"run.dir={run}/retrain", *QUIET, "retrain.measure_latency=false",
            f"retrain.epochs={retrain}", f"retrain.warmup_epochs={min(1, retrain - 1)}", *sets])
        with closing([ChildTrainer(rcfg, a, run / "retrain")]) as (c,):
            row["retrained"] = float(c.train()["val_top1"])
    return row


def search_part(config: str, modes: list[str], seeds: list[int], sets: list[str],
                retrain: int | None, keep: str | None = None) -> None:
    print(f"searches of {config} {' '.join(sets)}")
    print(f"{'mode':10s} {'seed':>4s} {'argmax':>7s} {'final':>6s} {'fit':>4s} {'skip':>5s} "
          f"{'wCE600':>7s} {'retr':>6s} {'gap':>6s} {'sec':>6s}  architecture")
    for mode in modes:
        for seed in seeds:
            with tempfile.TemporaryDirectory() as tmp:
                run = Path(keep) / f"{mode}-{seed}" if keep else Path(tmp) / "run"
                r = search_once(config, [f"search.mode={mode}", f"search.seed={seed}", *sets],
                                run, retrain)
            retr = r.get("retrained", float("nan"))
            print(f"{mode:10s} {seed:4d} {r['argmax_path_acc']:7.3f} {r['final_path_acc']:6.3f} "
                  f"{r['fitted']:4d} {str(r['all_skip']):>5s} {r['w_ce_600']:7.3f} "
                  f"{retr:6.3f} {r['final_path_acc'] - retr:6.3f} {r['seconds']:6.1f}  "
                  + " ".join(o.replace("ir_", "") for o in r["ops"]), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("weights", "search"))
    ap.add_argument("--config", default=str(SPACES["quickstart"]))
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--modes", default="reinforce")
    ap.add_argument("--retrain", type=int, default=None, help="retrain epochs (default: none)")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--smoke", action="store_true", help="smallest settings (a test)")
    ap.add_argument("--keep", metavar="DIR",
                    help="keep each search's run as DIR/MODE-SEED (for `fbnas fidelity`)")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    sets = list(a.sets)
    if a.smoke:
        sets += ["search.epochs=2", "search.warmup_epochs=1", "data.limit=300",
                 "latency.cost=flops"]
    if a.part == "weights":
        weights_part(a.config, 5 if a.smoke else a.steps, seeds[0], sets)
        return
    search_part(a.config, a.modes.split(","), seeds, sets, 1 if a.smoke else a.retrain,
                a.keep)


if __name__ == "__main__":
    main()
