"""Does the supernet learn which operations are better? (issue 25)

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

    python -m scripts.bench_search_quality weights --steps 600
    python -m scripts.bench_search_quality search --seeds 0,1,2 --modes reinforce,full \
        --retrain 20
    python -m scripts.bench_search_quality search --config configs/quickstart.yaml --smoke

Accuracy figures, not timings: run it on an idle machine only for the seconds column.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from fbnas.arch import Architecture
from fbnas.config import apply_overrides, config_from_dict, load_config
from fbnas.data import build_search_data
from fbnas.data.loaders import take_images
from fbnas.evaluate import path_sums
from fbnas.retrain import ChildTrainer
from fbnas.run import close_logger
from fbnas.supernet import Supernet
from fbnas.trainer import SearchTrainer


def weights_part(config: str, steps: int, seed: int) -> None:
    cfg = load_config(config)
    print(f"single paths trained uniformly (SPOS), {steps} steps, {config}")
    print(f"{'weights':10s} {'CE last 50':>10s}  val acc of 5 random paths (BN re-estimated)")
    for weights in ("separate", "shared"):
        torch.manual_seed(seed)
        rng = random.Random(seed)
        net = Supernet(cfg.space, weights=weights)
        data = build_search_data(cfg.data, cfg.space.macro.input_size,
                                 cfg.space.macro.in_channels, cfg.space.macro.num_classes,
                                 seed=seed)
        s = cfg.search
        opt = torch.optim.SGD(net.weight_parameters(), lr=s.w_lr, momentum=s.w_momentum,
                              weight_decay=s.w_weight_decay)
        sizes = [len(t) for t in net.theta]
        ces: list[float] = []
        while len(ces) < steps:
            for x, y in data.w_loader:
                m, active = net.path([rng.randrange(k) for k in sizes])
                ce = F.cross_entropy(net(x, m=m, active=active)[0], y)
                opt.zero_grad()
                ce.backward()
                torch.nn.utils.clip_grad_norm_(net.weight_parameters(), s.grad_clip or 1e9)
                opt.step()
                ces.append(ce.item())
                if len(ces) >= steps:
                    break
        accs = []
        for _ in range(5):
            m, active = net.path([rng.randrange(k) for k in sizes])
            net.recalibrate_bn(take_images(data.calib_loader, 512, torch.device("cpu")),
                               m, active)
            r = path_sums(net, data.val_loader, torch.device("cpu"), m, active)
            net.train()
            accs.append(r["correct"] / r["n"])
        print(f"{weights:10s} {statistics.mean(ces[-50:]):10.3f}  "
              + " ".join(f"{a:.2f}" for a in accs))


def search_once(base: dict, sets: list[str], run: Path, retrain: int | None) -> dict:
    cfg = config_from_dict(apply_overrides(base, [f"run.dir={run}", "run.progress=false",
                                                  "run.tensorboard=false", *sets]), "bench")
    t0 = time.perf_counter()
    t = SearchTrainer(cfg, run)
    try:
        res = t.fit()
    finally:
        close_logger(t.log)
    seconds = time.perf_counter() - t0
    hist = res["history"]
    steps_per_epoch = len(t.data.w_loader)
    at600 = hist[min(len(hist), math.ceil(600 / steps_per_epoch)) - 1]
    cands = cfg.space.layer_candidates()
    argmax = [c[i] for c, i in zip(cands, t.model.argmax_indices(), strict=True)]
    arch = yaml.safe_load((run / "arch_hard.yaml").read_text())
    row = {"argmax_path_acc": hist[-1].get("argmax_path_acc", float("nan")),
           "final_path_acc": res.get("final_path_acc", float("nan")),
           "fitted": arch.get("meta", {}).get("fitted_layers", 0),
           "all_skip": all(o == "skip" for o in argmax),
           "w_ce_600": at600["w_ce"], "seconds": seconds, "ops": res["arch"]}
    if retrain:
        a = Architecture.load(run / "arch_hard.yaml")
        rcfg = config_from_dict(apply_overrides(base, [
            f"run.dir={run}/retrain", "run.progress=false", "run.tensorboard=false",
            "retrain.measure_latency=false", f"retrain.epochs={retrain}",
            f"retrain.warmup_epochs={min(1, retrain - 1)}", *sets]), "bench")
        c = ChildTrainer(rcfg, a, run / "retrain")
        try:
            row["retrained"] = float(c.fit()["val_top1"])
        finally:
            close_logger(c.log)
    return row


def search_part(config: str, modes: list[str], seeds: list[int], sets: list[str],
                retrain: int | None) -> None:
    base = yaml.safe_load(Path(config).read_text())
    print(f"searches of {config} {' '.join(sets)}")
    print(f"{'mode':10s} {'seed':>4s} {'argmax':>7s} {'final':>6s} {'fit':>4s} {'skip':>5s} "
          f"{'wCE600':>7s} {'retr':>6s} {'gap':>6s} {'sec':>6s}  architecture")
    for mode in modes:
        for seed in seeds:
            with tempfile.TemporaryDirectory() as tmp:
                r = search_once(base, [f"search.mode={mode}", f"search.seed={seed}", *sets],
                                Path(tmp) / "run", retrain)
            retr = r.get("retrained", float("nan"))
            print(f"{mode:10s} {seed:4d} {r['argmax_path_acc']:7.3f} {r['final_path_acc']:6.3f} "
                  f"{r['fitted']:4d} {str(r['all_skip']):>5s} {r['w_ce_600']:7.3f} "
                  f"{retr:6.3f} {r['final_path_acc'] - retr:6.3f} {r['seconds']:6.1f}  "
                  + " ".join(o.replace("ir_", "") for o in r["ops"]), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("weights", "search"))
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--modes", default="reinforce")
    ap.add_argument("--retrain", type=int, default=None, help="retrain epochs (default: none)")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--smoke", action="store_true", help="smallest settings (a test)")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    if a.part == "weights":
        weights_part(a.config, 20 if a.smoke else a.steps, seeds[0])
        return
    sets = list(a.sets)
    if a.smoke:
        sets += ["search.epochs=2", "search.warmup_epochs=1", "data.limit=300",
                 "latency.cost=flops"]
    search_part(a.config, a.modes.split(","), seeds, sets, 1 if a.smoke else a.retrain)


if __name__ == "__main__":
    main()
