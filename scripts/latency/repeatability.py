"""Benchmark of fbnas latency tables against end-to-end latency, with the reference protocol
run side by side in the same process. Prints every figure of the table's checks; writes JSON
(--out-dir, default runs/bench_latency: bench.json and the two tables).

    python -m scripts.latency.repeatability          # CIFAR space, CPU, batch 1, 50 archs
    python -m scripts.latency.repeatability --quick  # smaller, ~1.5 minutes
    python -m scripts.latency.repeatability --config configs/fbnet_imagenet.yaml --n-archs 50

Steps (all in one run, on the same machine state):
1. build the table (timed)                                        -> build time
2. the reference protocol, as the seed implementation did it: per layer and op, a fresh block
   in train mode, one `timeit` pass of 50 runs (--reference-runs), no warm-up, 2 threads,
   `globals()`
3. validate: >= 50 spanning architectures, each timed end to end twice (drift-compensated)
                                                                  -> repeat r, Spearman/Kendall,
   ratio, MAPE, within 10%, FLOPs proxy, calibration and corrected model held out
4. rebuild the table from scratch                                 -> per-entry change median/p90
"""

from __future__ import annotations

import argparse
import gc  # noqa: F401  (the reference protocol's timeit setup enables gc)
import json
import math
import os
import sys
import time
import timeit
from pathlib import Path

import numpy as np
import torch

from fbnas.blocks import build_block
from fbnas.latency import (
    LatencyTable,
    Protocol,
    arch_signatures,
    build_table,
    make_timer,
    sample_spanning,
)
from fbnas.latency.validate import public_report, rank_metrics, summary_lines, validate
from fbnas.search_space import load_space
from fbnas.settings import CONTEXT_PROBES


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- the reference protocol (the seed implementation's, verbatim in spirit) ------------------
def reference_protocol_table(space, cnt_of_runs: int = 50, threads: int = 2):
    """Per layer: {op: µs}; plus stem and head, timed the same way so a whole network can be
    summed. Train mode (a freshly built module), no warm-up, one timeit pass, `threads`
    threads, input at the space's own resolution."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    g = globals()
    try:
        def time_op(op, shape):
            g["op"], g["input_sample"] = op, torch.randn((1, *shape))
            total = timeit.timeit("output = op(input_sample)", setup="gc.enable()",
                                  globals=g, number=cnt_of_runs)
            return total / cnt_of_runs * 1e6
        rows = []
        for la in space.layers():
            rows.append({op: time_op(build_block(op, la.c_in, la.c_out, la.stride),
                                     (la.c_in, la.h, la.w)) for op in space.candidates(la)})
        m = space.macro
        c_in, _, _, h, w = m.stem_shape()
        stem = time_op(m.build_stem(), (c_in, h, w))
        c, _, hh, ww, _ = m.head_shape()
        head = time_op(m.build_head(), (c, hh, ww))
    finally:
        torch.set_num_threads(saved)
        g.pop("op", None)
        g.pop("input_sample", None)
    return rows, stem + head


def inversions(rows_or_table, space) -> float:
    """Share of ordered pairs (e1 <= e3 <= e6 at equal kernel and groups; k3 <= k5 at equal
    expansion and groups) that the costs invert, over every layer."""
    import re

    pat = re.compile(r"^ir_k(\d)_e(\d)(_g\d)?$")
    bad = total = 0
    for row in rows_or_table:
        parsed = {op: pat.match(op) for op in row}
        ops = [op for op, m in parsed.items() if m]
        for a in ops:
            ka, ea, ga = parsed[a].groups()
            for b in ops:
                kb, eb, gb = parsed[b].groups()
                if ga != gb or a == b:
                    continue
                if (ka == kb and int(ea) < int(eb)) or (ea == eb and int(ka) < int(kb)):
                    total += 1
                    bad += row[a] > row[b]
    return bad / max(total, 1)


def entry_change(a: LatencyTable, b: LatencyTable) -> dict:
    """Per-entry |b/a - 1| of two builds: in µs, and in reference-op units (value / the
    reference's time in its own build: what drift compensation delivers; the µs figure adds
    the change of the machine's own speed between the builds, which the reference op shows)."""
    keys = [k for k in a.entries if k in b.entries]
    sa, sb = a.reference["scale_us"], b.reference["scale_us"]
    norm = np.array([abs(b.entries[k].stats["ratio"] / a.entries[k].stats["ratio"] - 1)
                     for k in keys])
    iso = np.array([abs((b.entries[k].stats["ratio"] * sb) / (a.entries[k].stats["ratio"] * sa)
                        - 1) for k in keys])
    rel = np.array([abs(b.entries[k].value / a.entries[k].value - 1) for k in keys])
    big = np.array([abs(b.entries[k].value / a.entries[k].value - 1) for k in keys
                    if a.entries[k].value >= 10.0])
    return {"entries": len(keys), "median": float(np.median(rel)),
            "norm_median": float(np.median(norm)), "norm_p90": float(np.percentile(norm, 90)),
            "isolated_median": float(np.median(iso)),
            "isolated_p90": float(np.percentile(iso, 90)),
            "reference_scale_b_over_a": sb / sa,
            "p90": float(np.percentile(rel, 90)), "max": float(rel.max()),
            "median_ge_10us": float(np.median(big)) if len(big) else None,
            "p90_ge_10us": float(np.percentile(big, 90)) if len(big) else None,
            "global_scale_b_over_a": float(np.median([b.entries[k].value / a.entries[k].value
                                                      for k in keys]))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/fbnet_cifar10.yaml")
    ap.add_argument("--n-archs", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "xla"))
    ap.add_argument("--rounds", type=int, default=None, help="table rounds (default 30)")
    ap.add_argument("--val-rounds", type=int, default=None,
                    help="end-to-end rounds per pass (default 15)")
    ap.add_argument("--probes", type=int, default=CONTEXT_PROBES,
                    help="context probes in the build")
    ap.add_argument("--no-rebuild", action="store_true", help="skip the rebuild step")
    ap.add_argument("--no-reference-protocol", action="store_true")
    ap.add_argument("--reference-runs", type=int, default=50,
                    help="runs of the reference protocol's timeit pass (the seed's: 50)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer rounds and 30 architectures (a smoke run, not for reporting)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default="runs/bench_latency")
    args = ap.parse_args(argv)

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    space = load_space(args.config)
    n = 30 if args.quick and args.n_archs == 50 else args.n_archs
    proto = Protocol()
    if args.rounds:
        proto.rounds = args.rounds
    elif args.quick:
        proto.rounds = 12
    vproto = Protocol(**{**proto.__dict__,
                         "rounds": args.val_rounds or (8 if args.quick else 15)})
    timer = make_timer(args.device, threads=args.threads, batch=args.batch)
    res: dict = {"config": args.config, "space": space.name, "timer": timer.describe(),
                 "protocol": proto.to_dict(), "validation_protocol": vproto.to_dict(),
                 "n_archs": n, "argv": sys.argv[1:]}
    res["loadavg_start"] = os.getloadavg()
    t_all = time.perf_counter()

    # 1. build
    log(f"[1/4] building the {space.name} table on {args.device} ...")
    t0 = time.perf_counter()
    table = build_table(space, timer, proto, out=out / "table_a.json",
                        context_probes=args.probes, progress=sys.stderr.isatty(), log=log)
    build_s = time.perf_counter() - t0
    res["build"] = {"seconds": build_s, "entries": len(table), "noise": table.noise,
                    "context": table.context}
    rows, fixed = table.costs_for(space, "raw")
    res["build"]["inversion_rate"] = inversions(rows, space)

    # 2. the reference protocol, side by side
    ref_rows = None
    if not args.no_reference_protocol and args.device == "cpu":
        log(f"[2/4] the reference protocol (timeit x{args.reference_runs}, no warm-up, train "
            "mode, 2 threads) ...")
        t0 = time.perf_counter()
        ref_rows, ref_fixed = reference_protocol_table(space, args.reference_runs)
        res["reference_protocol"] = {"seconds": time.perf_counter() - t0,
                                     "runs": args.reference_runs,
                                     "inversion_rate": inversions(ref_rows, space)}

    # 3. validation
    log(f"[3/4] validating on {n} architectures (2 end-to-end passes each) ...")
    t0 = time.perf_counter()
    archs = sample_spanning(space, n, rows, seed=args.seed)
    rep = validate(space, table, timer, protocol=vproto, repeats=2, corrections=True,
                   archs=archs, seed=args.seed, log=log)
    res["validate_seconds"] = time.perf_counter() - t0
    res["validation"] = public_report(rep)
    meas = np.array([a["measured_us"] for a in rep["archs"]])
    if ref_rows is not None:
        ref_pred = np.array([ref_fixed + sum(r[op] for r, op in zip(ref_rows, a.ops,
                                                                   strict=True))
                             for a in archs])
        res["reference_protocol"].update(rank_metrics(ref_pred, meas))
        res["reference_protocol"]["median_ratio"] = float(np.median(ref_pred / meas))
    # a careful isolated table (eval, inference mode, 1 thread, min over rounds,
    # no reference op, no context factor): sums of the entries' raw minima
    iso = np.array([sum(table.entries[s.key()].stats["raw_min_us"] for s in arch_signatures(a))
                    for a in archs])
    res["isolated_min_table"] = {**rank_metrics(iso, meas),
                                 "median_ratio": float(np.median(iso / meas))}

    # 4. rebuild
    if not args.no_rebuild:
        log("[4/4] rebuilding the table from scratch ...")
        t0 = time.perf_counter()
        table_b = build_table(space, timer, Protocol(**{**proto.__dict__, "seed": 1}),
                              out=out / "table_b.json", context_probes=args.probes,
                              progress=sys.stderr.isatty(), log=log)
        res["rebuild"] = {"seconds": time.perf_counter() - t0, **entry_change(table, table_b),
                          "context_a": table.context["scale"] if table.context else None,
                          "context_b": table_b.context["scale"] if table_b.context else None}
    res["total_seconds"] = time.perf_counter() - t_all
    res["loadavg_end"] = os.getloadavg()
    res["descheduled_share"] = getattr(timer, "descheduled_share", lambda: None)()
    (out / "bench.json").write_text(json.dumps(res, indent=1) + "\n")

    # ---- the figures -------------------------------------------------------------------------
    v = rep
    print(f"== fbnas latency benchmark: {space.name}, {args.device}, {args.threads} thread(s), "
          f"batch {args.batch}, {timer.describe()['cpu_model']}, torch {torch.__version__}")
    print(f"build: {build_s:.0f} s for {len(table)} entries (target < 180 s); spread IQR/median "
          f"median {100 * table.noise['median_rel_iqr']:.1f}% p90 "
          f"{100 * table.noise['p90_rel_iqr']:.1f}%; machine drift p90/p10 during build "
          f"{table.noise.get('drift_p90_over_p10')}; context x{table.context['scale']:.3f}")
    if "rebuild" in res:
        rb = res["rebuild"]
        print(f"rebuild: per-entry change median {100 * rb['median']:.1f}% p90 "
              f"{100 * rb['p90']:.1f}% max {100 * rb['max']:.1f}% (targets 5% / 10%); entries "
              f">= 10 us: median {100 * rb['median_ge_10us']:.1f}% p90 "
              f"{100 * rb['p90_ge_10us']:.1f}%; global scale {rb['global_scale_b_over_a']:.3f}")
        print(f"rebuild, isolated entries (ratio x reference us, before the context factor): "
              f"median {100 * rb['isolated_median']:.1f}% p90 {100 * rb['isolated_p90']:.1f}%; "
              f"in reference-op units: median {100 * rb['norm_median']:.1f}% p90 "
              f"{100 * rb['norm_p90']:.1f}%; the reference op itself ran "
              f"x{rb['reference_scale_b_over_a']:.3f} between the builds; context "
              f"{rb['context_a']:.3f} -> {rb['context_b']:.3f}")
    for line in summary_lines(v):
        print(line)
    r = v["repeat"]["spearman"]
    print(f"target: table Spearman >= min(0.9, 0.95*sqrt(r)={0.95 * math.sqrt(max(r, 0)):.3f}); "
          f"got {v['table']['spearman']:.3f}")
    if "reference_protocol" in res:
        rp = res["reference_protocol"]
        print(f"reference protocol (timeit x{rp['runs']}, no warm-up, train, 2 threads): "
              f"Spearman "
              f"{rp['spearman']:.3f} Kendall {rp['kendall']:.3f}, median pred/meas "
              f"{rp['median_ratio']:.2f}; ordered pairs inverted {100 * rp['inversion_rate']:.0f}%"
              f" (ours {100 * res['build']['inversion_rate']:.0f}%)")
    it = res["isolated_min_table"]
    print(f"isolated-min table (no reference op, no context factor): Spearman "
          f"{it['spearman']:.3f}, median pred/meas {it['median_ratio']:.2f}")
    tn = v.get("table_vs_now", {})
    print(f"same measurements at this run's own reference speed: median pred/meas "
          f"{tn.get('median_ratio', float('nan')):.3f}, MAPE {100 * tn.get('mape', 0):.1f}% "
          f"(reference op now {v['reference_now_us']} us vs "
          f"{table.reference['scale_us']:.1f} us in the table)")
    ds = res["descheduled_share"]
    print(f"machine: load average {res['loadavg_start'][0]:.2f} at start, "
          f"{res['loadavg_end'][0]:.2f} at end; timing thread descheduled "
          f"{100 * (ds or 0):.1f}% of its wall time"
          + (" — BUSY MACHINE, figures disturbed" if (ds or 0) > 0.1 else ""))
    print(f"total benchmark time {res['total_seconds']:.0f} s; JSON: {out / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
