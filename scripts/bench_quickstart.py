"""The quickstart, measured: wall time, and what the cost term does to the found architecture.

Runs `fbnas train --config configs/quickstart.yaml` as a user would (a fresh latency-table
cache, so the table build is included in the first run's wall time), then the same search with
the cost term off (`loss.kind=ce`, the "α = 0" search: FBNet's α only scales the loss, so the
trade-off is switched off by dropping the term) and with a strong cost term (β large). For each
found architecture and for the all-`ir_k5_e6` and all-`ir_k3_e1` references of the space it
reports the table's predicted latency, the end-to-end latency measured side by side
(`fbnas latency measure`, drift-compensated), params, FLOPs, and the test accuracy on digits
after retraining from scratch (the test split is used for nothing else).

    python scripts/bench_quickstart.py                       # ~ 10 minutes on 2 cores
    python scripts/bench_quickstart.py --retrain-epochs 10 --strong-beta 6
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--retrain-epochs", type=int, default=20)
    ap.add_argument("--strong-beta", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="fbnas_qs_"))
    cache = out / "table_cache"
    py = [sys.executable, "-m", "fbnas"]
    cfg = str(ROOT / "configs/quickstart.yaml")
    variants = {
        "default": [],
        "no_cost": ["--set", "loss={kind: ce}"],
        "strong_cost": ["--set", f"loss.beta={args.strong_beta}"],
    }
    walls_file = out / "walls.json"
    walls = json.loads(walls_file.read_text()) if walls_file.is_file() else {}
    for name, extra in variants.items():
        if name in walls and (out / name / "arch_hard.yaml").is_file():
            print(f"search {name}: reusing the finished run ({walls[name]:.0f} s wall)")
            continue
        walls[name] = run(py + ["train", "--config", cfg, "--set", f"run.dir={out / name}",
                                "--set", f"latency.cache_dir={cache}", "--set",
                                f"search.seed={args.seed}", "--set", "run.progress=false",
                                *extra])
        print(f"search {name}: {walls[name]:.0f} s wall"
              + (" (fresh clone state: latency table built in this run)"
                 if name == "default" else " (table reused from cache)"), flush=True)
        walls_file.write_text(json.dumps(walls))

    from fbnas.arch import Architecture, arch_from_indices, child_stats
    from fbnas.config import load_config
    from fbnas.retrain import ChildRecipe, train_child

    config = load_config(cfg)
    space = config.space
    refs = {}
    for op in ("ir_k5_e6", "ir_k3_e1"):
        a = arch_from_indices(space, [c.index(op) for c in space.layer_candidates()],
                              name=f"all_{op}")
        refs[f"all_{op}"] = out / f"all_{op}.yaml"
        a.save(refs[f"all_{op}"])
    archs = {name: out / name / "arch_hard.yaml" for name in variants} | refs
    table = out / "default" / "cost_table.json"
    meas_json = out / "measured.json"
    from fbnas.cli import main as fbnas_main

    assert fbnas_main(["latency", "measure", "--table", str(table), "--json", str(meas_json),
                       "--arch", *map(str, archs.values())]) == 0
    measured = {Path(r["arch"]).resolve(): r for r in json.loads(meas_json.read_text())["results"]}
    rows = []
    for name, path in archs.items():
        arch = Architecture.load(path)
        st = child_stats(arch)
        r = measured[path.resolve()]
        res = train_child(arch, config.data, ChildRecipe(epochs=args.retrain_epochs,
                                                         seed=args.seed))
        rows.append((name, arch, r.get("predicted_us", float("nan")), r["median_us"], st,
                     res["test"]["top1"], res["val"]["top1"] if "val" in res else float("nan")))
        print(f"retrained {name}: test top-1 {res['test']['top1']:.4f}", flush=True)
    print(f"\n== quickstart ({space.name}, digits, seed {args.seed}); retrained from scratch "
          f"{args.retrain_epochs} epochs; latency batch 1, 1 thread")
    print(f"{'arch':<14} {'pred us':>8} {'meas us':>8} {'params':>8} {'MFLOPs':>7} "
          f"{'val':>6} {'test':>6}  ops")
    for name, arch, pred, meas, st, test, val in rows:
        print(f"{name:<14} {pred:8.0f} {meas:8.0f} {st['params'] / 1e3:7.1f}K "
              f"{st['flops'] / 1e6:7.2f} {val:6.3f} {test:6.3f}  {' '.join(arch.ops)}")
    k5 = next(r for r in rows if r[0] == "all_ir_k5_e6")
    d = next(r for r in rows if r[0] == "default")
    print(f"default search vs all-ir_k5_e6: measured latency x{d[3] / k5[3]:.2f}, "
          f"test accuracy {d[5]:.3f} vs {k5[5]:.3f}")
    print("walls: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()))


if __name__ == "__main__":
    main()
