"""Latency tables for every shipped space, validated, under each memory allocator.

For each space (quickstart, fbnet_cifar10, fbnet_imagenet), each allocator (`--allocators`,
e.g. system,retain to compare) and each of `--builds` fresh builds: build the table (timed),
then validate it on `-n` spanning networks end to end for each validation seed (2 passes,
fitted per-(layer, op) corrections). Prints one line per (space, allocator, build, seed): build
seconds, table Spearman / Kendall beside the FLOPs proxy's Spearman, the uncalibrated median
predicted/measured, MAPE and share within ±10% (beside the share the same table would reach
with one context factor instead of its context model), the calibrated held-out share within ±10%,
and the largest fitted correction as a share of its entry's value; then the entries with the
largest corrections (worst first). With `--baselines` (ImageNet space), FBNet-A/B/C and
torchvision's MobileNetV2 (built locally, no weights, saved as a .pt2 program) are timed in one
interleaved measurement with their table predictions.

    python -m scripts.latency.tables                                   # every space, retain
    python -m scripts.latency.tables --spaces fbnet_imagenet --allocators system,retain --baselines
    python -m scripts.latency.tables --device cuda                     # on a GPU machine

Never run it beside tests or other benchmarks: the timings share the cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fbnas.arch import Architecture
from fbnas.backends.worker import call_in_worker
from fbnas.errors import FbnasError
from fbnas.latency import LatencyTable, Protocol, block_signature, build_table, make_timer
from fbnas.latency.build import refresh_values, sample_spanning
from fbnas.latency.timed_models import ModelSpec, measure_modules, measure_specs
from fbnas.latency.validate import validate
from fbnas.search_space import load_space
from fbnas.settings import CONTEXT_PROBES
from scripts.common import ROOT, SPACES, Spread, space_config


def corrections(report: dict, space, table) -> list[tuple[float, str]]:
    """(|fitted correction| / the entry's calibrated value, 'layer L op') per (layer, op).
    The value is floored at 1% of the median network (a 1 µs `skip` entry would make any
    correction look huge; one-hot columns also trade a constant with the intercept)."""
    fit = report["corrected_model"]["_fit"]
    rows, _ = table.costs_for(space, "raw")
    floor = 0.01 * float(np.median([a["measured_us"] for a in report["archs"]]))
    out, col = [], 0
    for li, ops in enumerate(space.layer_candidates()):
        for op in ops:
            v = max(fit["a"] * rows[li][op], floor)
            out.append((abs(float(fit["delta"][col])) / v,
                        f"layer {li} {op} ({rows[li][op]:.0f} us)"))
            col += 1
    return sorted(out, reverse=True)


def single_factor(report: dict, space, table, n: int, seed: int) -> float:
    """Share within ±10% of the same validation had the table kept one context factor (the
    median of its probes' network / sum-of-entries ratios, exponent 1): the context model's
    effect, judged on the same measurements."""
    one = LatencyTable.from_dict(table.to_dict())
    one.context = {"scale": float(np.median(table.context["probe_ratios"])), "probes": 0}
    refresh_values(one)
    archs = sample_spanning(space, n, table.costs_for(space, "raw")[0], seed=seed)
    meas = {a["name"]: a["measured_us"] for a in report["archs"]}
    return float(np.mean([abs(one.predict(a, "raw") / meas[a.name] - 1) <= 0.10
                          for a in archs]))


def block_effect(allocators: list[str]) -> None:
    """ir_k5_e6 and ir_k5_e3 (c16-16, s1, 112x112) alone, and e6 per
    block in a chain of 4, under each allocator (thread CPU time, drift-compensated)."""
    e6, e3 = (block_signature(op, 16, 16, 1, 112, 112) for op in ("ir_k5_e6", "ir_k5_e3"))
    torch.manual_seed(0)
    mods = {"e6 alone": (e6.build(), e6.input_shape), "e3 alone": (e3.build(), e3.input_shape),
            "e6 chain of 4": (nn.Sequential(*[e6.build() for _ in range(4)]), e6.input_shape)}
    print("== one block at 112x112, batch 1, 1 thread (ms; chain: per block)")
    for alloc in allocators:
        # each in a fresh worker, `system` too: this process's allocator state is its history
        timer = make_timer("cpu", allocator=alloc)
        m = call_in_worker(alloc, timer.allocator_library, measure_modules,
                           (timer, mods, Protocol(rounds=15)), {})
        ms = {k: m.entries[k].summary(m.ref_scale_s)["median_us"] / 1e3 for k in mods}
        chain = ms["e6 chain of 4"] / 4
        print(f"{alloc:<8} e6 alone {ms['e6 alone']:6.2f}  e6 in chain {chain:6.2f}  e3 alone "
              f"{ms['e3 alone']:6.2f}  (alone / in chain {ms['e6 alone'] / chain:.2f})",
              flush=True)


def baselines(timer, table, out: Path) -> None:
    import torchvision

    torch.manual_seed(0)
    mb = torchvision.models.mobilenet_v2(weights=None).eval()
    pt2 = out / "mobilenet_v2.pt2"
    torch.export.save(torch.export.export(mb, (torch.randn(1, 3, 224, 224),)), str(pt2))
    specs = [ModelSpec(f"{i}:fbnet_{n}", "arch", str(ROOT / f"configs/archs/fbnet_{n}.yaml"))
             for i, n in enumerate("abc")] + [ModelSpec("3:mobilenet_v2", "model", str(pt2))]
    info, m = measure_specs(timer, specs, Protocol(rounds=15))
    scale = table.reference["scale_us"]
    print(f"{'network':<16}{'measured ms':>12}{'IQR':>7}{'table ms':>10}{'pred/meas':>10}")
    for it in info:
        s = m.entries[it["label"]].summary(scale / 1e6)
        try:
            pred = (table.predict(Architecture.from_dict(it["arch"], it["path"]), "raw")
                    if it["arch"] else None)
        except FbnasError:  # its own head or stem: not entries of this space's table
            pred = None
        print(f"{it['label'].split(':')[1]:<16}{s['median_us'] / 1e3:12.2f}"
              f"{100 * s['rel_iqr']:6.1f}%"
              + (f"{pred / 1e3:10.2f}{pred / s['median_us']:10.3f}" if pred else
                 f"{'-':>10}{'-':>10}"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spaces", default=",".join(SPACES),
                    help="comma-separated shipped space names or config files")
    ap.add_argument("--allocators", default="retain")
    ap.add_argument("--builds", type=int, default=2)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--val-rounds", type=int, default=15,
                    help="rounds per validation pass (as `fbnas latency validate`)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--baselines", action="store_true")
    ap.add_argument("--blocks", action="store_true",
                    help="first time one big block alone and in a chain under each allocator")
    ap.add_argument("--worst", type=int, default=5, help="largest corrections to list")
    ap.add_argument("--rounds", type=int, default=Protocol.rounds, help="table build rounds")
    ap.add_argument("--probes", type=int, default=CONTEXT_PROBES,
                    help="context probes in each build (whole networks timed)")
    args = ap.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="fbnas_tables_"))
    print(f"load average {os.getloadavg()[0]:.2f}; device {args.device}; torch {torch.__version__}")
    if args.device == "cpu" and args.blocks:
        block_effect(args.allocators.split(","))
    summary: dict[tuple, list] = {}
    for given in args.spaces.split(","):
        space = load_space(space_config(given))
        name = space.name  # a config file's space is labelled (and its tables named) by its name
        for alloc in args.allocators.split(","):
            kw = {"allocator": alloc} if args.device == "cpu" else {}
            for b in range(args.builds):
                timer = make_timer(args.device, **kw)
                t0 = time.perf_counter()
                table = build_table(space, timer, Protocol(rounds=args.rounds, seed=b),
                                    out=out / f"{name}-{b}.json", context_probes=args.probes)
                built = time.perf_counter() - t0
                for seed in [int(s) for s in args.seeds.split(",")]:
                    rep = validate(space, table, make_timer(args.device, **kw), n=args.n,
                                   seed=seed, repeats=2, corrections=True,
                                   protocol=Protocol(rounds=args.val_rounds))
                    t, f, c = rep["table"], rep["flops_proxy"], rep["calibration"]["held_out"]
                    worst = corrections(rep, space, table)
                    one = (single_factor(rep, space, table, args.n, seed)
                           if (table.context or {}).get("probe_ratios") else float("nan"))
                    line = (f"{name:<15}{alloc:<8} build {b} ({built:4.0f} s) seed {seed}: "
                            f"table S {t['spearman']:.3f} K {t['kendall']:.3f} | FLOPs S "
                            f"{f['spearman']:.3f} | pred/meas {t['median_ratio']:.3f} MAPE "
                            f"{100 * t['mape']:4.1f}% ±10% {100 * t['within_10pct']:3.0f}% "
                            f"(one factor {100 * one:3.0f}%) | "
                            f"calibrated ±10% {100 * c['within_10pct']:3.0f}% | "
                            f"repeat S {rep['repeat']['spearman']:.3f} | max correction "
                            f"{100 * worst[0][0]:.0f}%")
                    print(line, flush=True)
                    print("    largest corrections: " + "; ".join(
                        f"{w}: {100 * r:.0f}%" for r, w in worst[:args.worst]), flush=True)
                    summary.setdefault((name, alloc), []).append(
                        (t["spearman"], f["spearman"], t["median_ratio"], t["within_10pct"],
                         c["within_10pct"], worst[0][0], built, t["mape"], one,
                         (table.context or {}).get("exponent", 1.0)))
                if args.baselines and name == "fbnet_imagenet" and b == 0:
                    baselines(make_timer(args.device, **kw), table, out)
    print("== medians over builds and seeds [min-max]")
    for (name, alloc), rows in summary.items():
        cols = list(zip(*rows, strict=True))

        def fmt(i, pct=False, cols=cols):
            s = Spread.of([(100 if pct else 1) * x for x in cols[i]])
            return f"{s.median:.3g} [{s.lo:.3g}-{s.hi:.3g}]"
        print(f"{name:<15}{alloc:<8} table S {fmt(0)}  FLOPs S {fmt(1)}  pred/meas {fmt(2)}  "
              f"MAPE {fmt(7, True)}%  ±10% {fmt(3, True)}% (one factor {fmt(8, True)}%)  "
              f"calibrated ±10% {fmt(4, True)}%  exponent {fmt(9)}  "
              f"max corr {fmt(5, True)}%  build {fmt(6)} s")
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
