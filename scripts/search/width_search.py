"""Does searching widths return better networks at the same latency than searching ops alone?

For every --seeds x --targets: the op-only search on the benchmark's space (its run from
`search.regret --keep DIR`, or run here) and the op+width search on --config
(configs/bench_digits_widths.yaml: the same space with its stages' widths searched) under the
op-only run's target in µs (a relative target means another latency in a space whose range
differs; op-only searches run here read the width space's table, which holds their entries,
so that both aim by one measurement). Each returned network is judged by the same recipe:
the op-only one by the benchmark (mean test top-1 over its seeds at the full budget), the
width-searched one retrained here under the benchmark's seeds with `fbnas retrain` (the
recipe the benchmark recorded; `--bench none`: both retrained under --retrain-seeds). Then
every returned network is timed end to end in one measurement, side by side
(the measured fit's protocol, the width space's table and probes; nothing else running).
Printed: per run both networks' measured latency and accuracy; the number of width-searched
networks that dominate (at least as accurate and no slower than 1% above) and the median
accuracy difference.

    python -m scripts.search.width_search --ops-runs runs/regret --jobs 2
    python -m scripts.search.width_search --bench none --ops-config configs/quickstart.yaml \
        --config configs/quickstart_widths.yaml --seeds 0 --jobs 2   # the quickstart's space
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fbnas.arch import Architecture
from fbnas.bench.table import Bench
from fbnas.config import load_config
from fbnas.latency.end_to_end import panel, time_archs
from fbnas.latency.resolve import cached_table_path, resolve_costs
from scripts.common import BENCH_CONFIG, BENCH_FILE, ROOT, retrain_process, search_process

WIDTH_CONFIG = ROOT / "configs" / "bench_digits_widths.yaml"


def retrain(config: str, arch: Path, seed: int, out: Path, sets: list[str]) -> float:
    """Test top-1 of `arch` retrained by `fbnas retrain` under `seed` (one thread)."""
    done, work = out / "results.json", out.parent / f"{out.name}.run"
    if not done.is_file():
        retrain_process(config, arch, seed, [f"run.dir={work}", *sets])
        res = next(work.glob("retrain-*/results.json"))
        out.mkdir(parents=True, exist_ok=True)
        res.replace(done)
        shutil.rmtree(work)
    return float(json.loads(done.read_text())["top1"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=str(BENCH_FILE),
                    help="the op-only space's benchmark ('none': the op-only networks are "
                         "retrained here too, under --retrain-seeds)")
    ap.add_argument("--retrain-seeds", default="0,1", help="without a benchmark")
    ap.add_argument("--ops-config", default=str(BENCH_CONFIG))
    ap.add_argument("--config", default=str(WIDTH_CONFIG))
    ap.add_argument("--ops-runs", help="search.regret --keep DIR of the op-only searches "
                                       "(missing ones are run here)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--targets", default="0.3x,0.5x,0.8x")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", metavar="DIR", help="keep the width runs and retrains in DIR")
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="a config override for every search and retrain")
    a = ap.parse_args(argv)
    bench = None if a.bench == "none" else Bench.load(a.bench)
    seeds = bench.seeds if bench is not None else [int(x) for x in a.retrain_seeds.split(",")]
    grid = [(int(s), t) for s in a.seeds.split(",") for t in a.targets.split(",")]
    wcfg = load_config(a.config, a.sets)
    # measured once here, not by two searches at once
    costs = resolve_costs(wcfg.space, wcfg.latency, progress=wcfg.run.progress)
    # the op-only searches run here read the same table (it holds their widest entries): a
    # table cached hours earlier on this VM can read 15% slow, and the width searches aim at
    # the op-only runs' targets in µs
    same_table = f"latency.table={cached_table_path(wcfg.space, wcfg.latency)}"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.keep or tmp)
        ops_root = Path(a.ops_runs or root / "ops")
        ops = {g: ops_root / f"reinforce-shared-{g[0]}-{g[1]}" for g in grid}
        wide = {g: root / f"widths-{g[0]}-{g[1]}" for g in grid}
        with ThreadPoolExecutor(max(1, a.jobs)) as pool:
            list(pool.map(lambda g: search_process(a.ops_config, ops[g], [
                "search.mode=reinforce", "search.weights=shared", f"search.seed={g[0]}",
                f"loss.target={g[1]}", same_table, *a.sets]), grid))
            targets = {g: Architecture.load(ops[g] / "arch_hard.yaml").meta["target"]
                       for g in grid}
            list(pool.map(lambda g: search_process(a.config, wide[g], [
                f"search.seed={g[0]}", f"loss.target={targets[g]}", *a.sets]), grid))
            archs = {g: Architecture.load(wide[g] / "arch_hard.yaml") for g in grid}
            runs = {"widths": (a.config, wide)}
            if bench is None:
                runs["ops"] = (a.ops_config, ops)
            jobs = [(k, g, s) for k in runs for g in grid for s in seeds]
            accs = dict(zip(jobs, pool.map(lambda j: retrain(
                runs[j[0]][0], runs[j[0]][1][j[1]] / "arch_hard.yaml", int(j[2]),
                root / f"retrain-{j[0]}" / f"{j[1][0]}-{j[1][1]}-{j[2]}", a.sets), jobs),
                strict=True))
        mine = {("ops", g): Architecture.load(ops[g] / "arch_hard.yaml") for g in grid}
        mine.update({("widths", g): archs[g] for g in grid})
        labels = {f"{k[0]} {k[1][0]} {k[1][1]}": v for k, v in mine.items()}
        timer = wcfg.latency.for_timing(costs.table.meta).make_timer()
        timed = time_archs(timer, labels, costs.table, panel(wcfg.space, costs.table))
    print(f"op-only searches ({a.ops_config}) against op+width searches ({a.config}) at the "
          f"op-only run's target; accuracy: mean test top-1 over seeds {seeds} "
          f"(op-only: {'the benchmark' if bench else 'retrained here'}; widths: retrained "
          "here); latency: timed side by side (µs)")
    print(f"{'seed':>4s} {'target':>6s} {'ops µs':>7s} {'ops acc':>7s} {'widths µs':>9s} "
          f"{'w acc':>6s} {'Δacc pt':>7s}  widths network")
    dom, diffs = 0, []
    for g in grid:
        acc_o = (bench.mean(bench.key(mine[("ops", g)]), "test_acc") if bench is not None
                 else statistics.fmean(accs[("ops", g, s)] for s in seeds))
        acc_w = statistics.fmean(accs[("widths", g, s)] for s in seeds)
        lat_o = timed[f"ops {g[0]} {g[1]}"]["median_us"]
        lat_w = timed[f"widths {g[0]} {g[1]}"]["median_us"]
        diffs.append(100 * (acc_w - acc_o))
        dom += acc_w >= acc_o and lat_w <= 1.01 * lat_o
        print(f"{g[0]:4d} {g[1]:>6s} {lat_o:7.1f} {acc_o:7.4f} {lat_w:9.1f} {acc_w:6.4f} "
              f"{diffs[-1]:+7.2f}  {archs[g].choices_text(wcfg.space)}")
    print(f"width-searched networks that dominate the op-only one (accuracy >=, latency <= "
          f"+1%): {dom}/{len(grid)}; median accuracy difference {statistics.median(diffs):+.2f} "
          f"pt (mean {statistics.fmean(diffs):+.2f})")


if __name__ == "__main__":
    main()
