"""`fbnas latency build|show|predict|measure|validate`: latency tables per device.

    fbnas latency build --config configs/fbnet_cifar10.yaml --device cpu --out lat_cpu.json
    fbnas latency build --config configs/fbnet_cifar10.yaml --cost flops --out flops.json
    fbnas latency show lat_cpu.json [--config configs/fbnet_cifar10.yaml]
    fbnas latency predict --arch configs/archs/fbnet_a.yaml --table lat_cpu.json
    fbnas latency measure --arch configs/archs/fbnet_a.yaml --device cpu [--table lat_cpu.json]
    fbnas latency validate --config configs/fbnet_cifar10.yaml --table lat_cpu.json -n 50
"""

from __future__ import annotations

import sys
from pathlib import Path

from fbnas.arch import Architecture
from fbnas.backends import DTYPES, TIMERS, make_timer
from fbnas.backends.allocator import ALLOCATORS
from fbnas.cost_kinds import COST_KINDS
from fbnas.errors import FbnasError
from fbnas.io import Fields, load_yaml, write_json_atomic
from fbnas.latency import (
    LatencyTable,
    apply_report,
    arch_signatures,
    build_cost_table,
    build_table,
    head_signature,
    layer_signatures,
    stem_signature,
    validate,
)
from fbnas.latency.build import check_extend
from fbnas.latency.bundle import RUNTIMES as BUNDLE_RUNTIMES
from fbnas.latency.bundle import import_results, write_bundle
from fbnas.latency.measure import Protocol
from fbnas.latency.validate import plot_report, public_report, summary_lines
from fbnas.search_space import load_space
from fbnas.timed_models import ModelSpec, measure_specs, parse_input_shape


def _timer_args(p, with_threads: bool = True) -> None:
    g = p.add_argument_group("timing")
    g.add_argument("--device", default=None, choices=TIMERS.choices(),
                   help="backend to time on (default: the table's, else cpu; executorch, ort: "
                        "the exported runtimes; fake: deterministic, for tests)")
    if with_threads:
        g.add_argument("--threads", type=int, default=None,
                       help="CPU threads while timing (default 1; recorded in the table)")
    g.add_argument("--batch", type=int, default=None, help="batch size (default 1)")
    g.add_argument("--dtype", default=None, choices=tuple(DTYPES),
                   help="dtype (default float32)")
    g.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    g.add_argument("--allocator", default=None, metavar="NAME|PATH",
                   help=f"cpu: memory allocator to time under ({', '.join(ALLOCATORS)}, or "
                        "a jemalloc/tcmalloc library path; default retain, or the table's; "
                        "see docs/latency.md)")
    g.add_argument("--clock", choices=("thread", "wall"), default=None,
                   help="cpu: thread CPU time (default with 1 thread; leaves out time other "
                        "processes took) or wall time (default with several threads)")
    g.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds per entry (default from the protocol: 30)")
    g.add_argument("--sample-ms", type=float, default=None,
                   help="target duration of one sample in ms (default 8)")
    g.add_argument("--no-reference", action="store_true",
                   help="do not normalise by the reference op (drift compensation off)")


def _protocol(args, base=None):

    p = Protocol(**(base or {}))
    if args.rounds is not None:
        if args.rounds < 1:
            raise FbnasError(f"--rounds: must be >= 1, got {args.rounds}")
        p.rounds = args.rounds
    if args.sample_ms is not None:
        if not args.sample_ms > 0:
            raise FbnasError(f"--sample-ms: must be > 0, got {args.sample_ms}")
        p.sample_s = args.sample_ms / 1e3
        p.ref_sample_s = p.sample_s / 2
    if args.no_reference:
        p.reference = False
    return p


def config_settings(path: str | None) -> dict:
    """threads, batch, dtype, channels_last, allocator, device from the config's optional
    `latency:` section (its other keys belong to the trainer's config reader)."""
    if not path:
        return {}

    data = load_yaml(path)
    if data.get("latency") is None:
        return {}
    f = Fields(data["latency"], f"{path}: latency")
    out = {"threads": f.int("threads", None, min=1), "batch": f.int("batch", None, min=1),
           "dtype": f.str("dtype", None, choices=tuple(DTYPES)),
           "channels_last": f.bool("channels_last", None),
           "allocator": f.str("allocator", None),
           "device": f.str("device", None, choices=TIMERS)}
    return {k: v for k, v in out.items() if v is not None}


def _timer(args, table=None, config: str | None = None):
    """A timer from the flags; unset flags take the table's setting, then the config's
    `latency:` section, then the defaults (1 thread, batch 1, float32, contiguous)."""

    meta = table.meta if table is not None and table.cost == "latency" else {}
    base = config_settings(config)
    if args.device is None:  # the table's backend, else the config's latency.device, else cpu
        args.device = (meta.get("backend") if meta.get("backend") in TIMERS
                       else base.get("device", "cpu"))
    if meta:
        base.update(threads=meta.get("threads"), batch=meta.get("batch"),
                    dtype=meta.get("dtype"),
                    channels_last=meta.get("memory_format") == "channels_last")
        if meta.get("backend") == args.device:
            base["allocator"] = meta.get("allocator", "system")
    threads = getattr(args, "threads", None)
    extra = {"clock": args.clock} if TIMERS.get(args.device).clocks and args.clock else {}
    return make_timer(args.device, **extra,
                      threads=threads if threads is not None else base.get("threads"),
                      batch=args.batch if args.batch is not None else base.get("batch", 1),
                      dtype=args.dtype or base.get("dtype", "float32"),
                      channels_last=args.channels_last or bool(base.get("channels_last")),
                      allocator=args.allocator or base.get("allocator"))


def _log(msg: str) -> None:
    print(msg, file=sys.stderr)


# ---- build -----------------------------------------------------------------------------------
def run_build(args) -> int:

    space = load_space(args.config)
    out = Path(args.out)
    table = None
    if out.exists() and not args.fresh:
        table = LatencyTable.load(out)
        if table.cost != args.cost:
            raise FbnasError(f"{out}: holds a {table.cost} table, but --cost is {args.cost} "
                             "(pick another --out, or --fresh to overwrite)")
    if args.cost != "latency":
        n0 = len(table) if table is not None else 0
        table = build_cost_table(space, args.cost, table)
        table.save(out)
        print(f"{out}: {args.cost} table, {len(table) - n0} new entries, {len(table)} in all")
        return 0
    timer = _timer(args, table, args.config)
    proto = _protocol(args, None)
    missing = len(table.missing(space)) if table is not None else None
    if table is not None:

        check_extend(table, timer, str(out))  # before saying anything about extending it
        _log(f"{out}: extending/resuming a table with {len(table)} entries; "
             f"{missing} missing for '{space.name}'")
    try:
        table = build_table(space, timer, proto, table=table, out=out,
                            context_probes=args.probes, progress=not args.quiet, log=_log)
    except KeyboardInterrupt:
        print(f"fbnas latency build: interrupted; finished chunks are in {out} — run the same "
              "command again to resume", file=sys.stderr)
        return 130
    n = table.noise or {}
    print(f"{out}: {len(table)} entries on {table.meta.get('device_name')} "
          f"({table.meta.get('threads')} thread(s), batch {table.meta.get('batch')}, "
          f"{table.meta.get('dtype')}); spread IQR/median: median "
          f"{100 * (n.get('median_rel_iqr') or 0):.1f}%, "
          f"p90 {100 * (n.get('p90_rel_iqr') or 0):.1f}%; "
          f"context x{(table.context or {}).get('scale', 1.0):.3f}")
    return 0


# ---- bundle / import ---------------------------------------------------------------------------
def run_bundle(args) -> int:
    space = load_space(args.config)
    table = LatencyTable.load(args.table) if args.table else None
    if args.threads < 1:
        raise FbnasError(f"--threads: must be >= 1, got {args.threads}")
    man = write_bundle(space, args.out, args.runtime, threads=args.threads,
                       protocol=Protocol(rounds=args.rounds), probes=args.probes, table=table,
                       log=None if args.quiet else _log)
    n = sum(p["kind"] == "entry" for p in man["programs"])
    print(f"{args.out}: {n} entries as .pte for {man['runtime']} {man['runtime_version']} "
          f"({args.threads} thread(s)); on the device: python run_bundle.py, then "
          f"fbnas latency import {Path(args.out) / 'results.json'} --out TABLE.json")
    return 0


def run_import(args) -> int:
    space = load_space(args.config) if args.config else None
    table = import_results(args.results, space)
    table.save(args.out)
    print(f"{args.out}: {len(table)} entries from {args.results} on "
          f"{table.meta.get('device_name')} ({table.meta.get('threads')} thread(s)); "
          f"context x{(table.context or {}).get('scale', 1.0):.3f}")
    return 0


# ---- show ------------------------------------------------------------------------------------
def _fmt(v: float, unit: str) -> str:
    if unit == "us":
        return f"{v:9.1f}"
    return f"{v / 1e6:8.2f}M"


def run_show(args) -> int:

    table = LatencyTable.load(args.table)
    m = table.meta
    print(f"{args.table}: {table.cost} ({table.unit}), {len(table)} entries, schema 1, "
          f"fingerprint {table.fingerprint()[:12]}")
    if table.cost == "latency":
        print(f"  device {m.get('backend')} / {m.get('device_name')}; {m.get('threads')} "
              f"thread(s), batch {m.get('batch')}, {m.get('dtype')}, {m.get('memory_format')}; "
              f"torch {m.get('torch_version')}; created {m.get('created')}")
        if table.noise:
            n = table.noise
            print(f"  spread IQR/median: median {100 * (n.get('median_rel_iqr') or 0):.1f}%, "
                  f"p90 {100 * (n.get('p90_rel_iqr') or 0):.1f}%; machine drift p90/p10 "
                  f"{n.get('drift_p90_over_p10')}")
        if table.context:
            print(f"  context: in-network = x{table.context.get('scale', 1.0):.3f} the isolated "
                  f"entries (from {table.context.get('probes')} probe networks; in the values)")
        if table.calibration:
            c = table.calibration
            print(f"  calibration: measured = {c['a']:.3f} x predicted + {c['b']:.1f}")
    unit = table.unit
    if args.config:
        space = load_space(args.config)
        groups = [(f"layer {i:2d}", row) for i, row in enumerate(layer_signatures(space))]
        fixed = [stem_signature(space.macro), head_signature(space.macro)]
    else:
        by_shape: dict[tuple, dict] = {}
        fixed = []
        for e in table.entries.values():
            s = e.sig
            if s.kind != "block":
                fixed.append(s)
                continue
            by_shape.setdefault((s.c_in, s.c_out, s.stride, s.h, s.w), {})[s.op] = s
        groups = [(f"c{k[0]}-{k[1]} s{k[2]} {k[3]}x{k[4]}", row)
                  for k, row in sorted(by_shape.items(), key=lambda kv: (-kv[0][3], kv[0]))]
    ops = list(dict.fromkeys(op for _, row in groups for op in row))
    width = max([len(o) for o in ops] + [9]) + 1
    print(f"{'':>22}" + "".join(f"{o:>{width}}" for o in ops))
    for name, row in groups:
        vals = {op: table.entries[s.key()].value for op, s in row.items() if s in table}
        lo = min(vals, key=vals.get) if vals else None
        hi = max(vals, key=vals.get) if vals else None
        cells = []
        for op in ops:
            if op not in row:
                cells.append(f"{'':>{width}}")
            elif op not in vals:
                cells.append(f"{'missing':>{width}}")
            else:
                mark = "*" if op == lo else "!" if op == hi else " "
                cells.append(f"{_fmt(vals[op], unit):>{width - 1}}{mark}")
        print(f"{name:>22}" + "".join(cells))
    for s in fixed:
        v = f"{_fmt(table.entries[s.key()].value, unit).strip()}" if s in table else "missing"
        print(f"  {s.kind}: {s.key()}  {v} {unit}")
    per = " per sample" if unit != "us" else ""
    print(f"  (* fastest, ! slowest of the layer; values in {unit}{per})")
    return 0


# ---- predict ---------------------------------------------------------------------------------
def run_predict(args) -> int:

    table = LatencyTable.load(args.table)
    space = load_space(args.config) if args.config else None
    for path in args.arch:
        arch = Architecture.load(path)
        if space is not None:
            arch.check_fits(space, path)
        total = table.predict(arch, "raw")
        print(f"{arch.name} [{arch.short_hash}] {path}: {_fmt(total, table.unit).strip()} "
              f"{table.unit} (table)")
        if args.model != "raw":
            adj = table.predict(arch, args.model, space)
            if adj != total:
                print(f"  {args.model}: {_fmt(adj, table.unit).strip()} {table.unit}")
        if args.verbose:
            sigs = arch_signatures(arch)
            for s in sigs:
                print(f"    {s.key():40s} {_fmt(table.value(s), table.unit)}")
    return 0


# ---- measure ---------------------------------------------------------------------------------
def _specs(args) -> list[ModelSpec]:
    """One spec per --arch file (a fresh child) and --model file (a retrain checkpoint or run
    directory, an fbnas export, any TorchScript file or .pt2 program)."""
    shape = parse_input_shape(args.input_shape)
    specs = [ModelSpec(f"{i}:{Path(path).stem}", "arch", path)
             for i, path in enumerate(args.arch or [])]
    specs += [ModelSpec(f"{j}:{Path(path).stem}", "model", path, shape)
              for j, path in enumerate(args.model or [], start=len(specs))]
    if not specs:
        raise FbnasError("latency measure: give --arch ARCH.yaml and/or --model FILE")
    return specs


def run_measure(args) -> int:

    table = LatencyTable.load(args.table) if args.table else None
    timer = _timer(args, table)
    if table is not None:
        table.check_run(batch=timer.batch, dtype=timer.dtype, backend=timer.backend,
                        allocator=timer.allocator)
    specs = _specs(args)
    proto = _protocol(args, None)
    items, m = measure_specs(timer, specs, proto)
    ref_us = (table.reference or {}).get("scale_us") if table is not None else None
    scale = (ref_us or m.ref_scale_s * 1e6) if proto.reference else 1e6
    results = []
    for it in items:
        st = m.entries[it["label"]]
        s = st.summary(scale / 1e6)
        line = (f"{it['label'].split(':', 1)[1]} {it['path']}: median "
                f"{s['median_us'] / 1e3:.3f} ms, min {s['min_us'] / 1e3:.3f} ms, IQR "
                f"{100 * s['rel_iqr']:.1f}% ({s['n']} samples x {st.number} calls; "
                f"{timer.backend}, {timer.threads} thread(s), batch {timer.batch}, "
                f"{timer.allocator} allocator)")
        res = {it["kind"]: it["path"], "hash": it["hash"], "input_shape": it["input_shape"],
               **s}
        if table is not None and it["arch"] is not None:
            a = Architecture.from_dict(it["arch"], it["path"])
            try:
                pred = table.predict(a, "raw")
            except FbnasError:
                pred = None  # not this table's space
            if pred is not None:
                line += f"; table {pred / 1e3:.3f} ms (x{pred / s['median_us']:.2f})"
                res["predicted_us"] = pred
        print(line)
        results.append(res)
    if args.json:
        write_json_atomic(args.json, {"timer": timer.describe(), "results": results,
                                      "reference_scale_us": scale if proto.reference else None})
    return 0


# ---- validate --------------------------------------------------------------------------------
def run_validate(args) -> int:

    space = load_space(args.config)
    table = LatencyTable.load(args.table)
    table.require(space, args.config)
    timer = _timer(args, table, args.config)
    base = {k: v for k, v in (table.protocol or {}).items()
            if k in ("rounds", "sample_s", "ref_sample_s", "ref_every", "warmup_s",
                     "max_rel_iqr", "extra_rounds", "reference")}
    proto = _protocol(args, base)
    if args.rounds is None:
        proto.rounds = max(10, proto.rounds // 2)
    rep = validate(space, table, timer, n=args.n, seed=args.seed, protocol=proto,
                   repeats=args.repeats, fit_model=args.fit_model, log=_log)
    for line in summary_lines(rep):
        print(line)
    out = args.report or str(Path(args.table).with_suffix("")) + ".validate.json"
    write_json_atomic(out, public_report(rep))
    print(f"report: {out}")
    if args.plot:
        plot_report(rep, args.plot)
        print(f"plot: {args.plot}")
    if args.save:
        apply_report(table, space, rep)
        table.save(args.table)
        print(f"{args.table}: calibration{' and fitted corrections' if args.fit_model else ''} "
              "stored")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("latency", help="latency lookup tables: build, show, predict, measure, "
                                       "validate, bundle, import")
    ls = p.add_subparsers(dest="latency_command", metavar="ACTION", required=True)

    b = ls.add_parser("build", help="measure a table's missing entries for a search space")
    b.add_argument("--config", required=True, help="config file with a 'space:' section")
    b.add_argument("--out", required=True, help="table file (extended/resumed if it exists)")
    b.add_argument("--cost", default="latency", choices=COST_KINDS.choices(),
                   help="what to tabulate (flops and params need no device)")
    b.add_argument("--probes", type=int, default=12,
                   help="child networks timed to fit the in-network context factor (0: none)")
    b.add_argument("--fresh", action="store_true", help="ignore an existing --out file")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    _timer_args(b)
    b.set_defaults(func=run_build)

    bd = ls.add_parser("bundle", help="write a space's blocks as ExecuTorch programs with a "
                                      "standalone runner, for a device that cannot run fbnas")
    bd.add_argument("--config", required=True, help="config file with a 'space:' section")
    bd.add_argument("--out", required=True, help="new folder for the bundle")
    bd.add_argument("--runtime", default="executorch", choices=BUNDLE_RUNTIMES)
    bd.add_argument("--table", help="leave out the entries this table has")
    bd.add_argument("--threads", type=int, default=1, help="threads on the device (default 1)")
    bd.add_argument("--rounds", type=int, default=30, help="interleaved rounds (default 30)")
    bd.add_argument("--probes", type=int, default=12,
                    help="child networks for the context factor (0: none)")
    bd.add_argument("--quiet", action="store_true", help="no per-program lines")
    bd.set_defaults(func=run_bundle)

    im = ls.add_parser("import", help="turn a bundle's results.json into a latency table")
    im.add_argument("results", help="results.json written by the bundle's run_bundle.py")
    im.add_argument("--out", required=True, help="table file to write")
    im.add_argument("--config", help="check the table covers this config's space")
    im.set_defaults(func=run_import)

    s = ls.add_parser("show", help="print a table per layer: op x cost, fastest/slowest marked")
    s.add_argument("table", help="table file")
    s.add_argument("--config", help="lay the table out by this search space's layers")
    s.set_defaults(func=run_show)

    r = ls.add_parser("predict", help="predict an architecture's cost from a table")
    r.add_argument("--arch", required=True, nargs="+", help="architecture YAML file(s)")
    r.add_argument("--table", required=True, help="table file")
    r.add_argument("--config", help="the search space (needed for fitted corrections)")
    r.add_argument("--model", default="auto", choices=("auto", "raw", "calibrated", "fitted"),
                   help="also print the calibrated or fitted estimate (default: best stored)")
    r.add_argument("-v", "--verbose", action="store_true", help="per-entry breakdown")
    r.set_defaults(func=run_predict)

    m = ls.add_parser("measure", help="time child networks end to end with the table's timer")
    m.add_argument("--arch", nargs="+", help="architecture YAML file(s) (a fresh child each)")
    m.add_argument("--model", nargs="+", metavar="FILE",
                   help="model(s): a retrain checkpoint or run directory, an `fbnas export` "
                        "file, or any TorchScript file, torch.export program (.pt2) or "
                        "ExecuTorch program (.pte)")
    m.add_argument("--input-shape", metavar="C,H,W",
                   help="input shape of --model files that do not carry one (a plain "
                        "TorchScript file; a .pt2 with a dynamic shape)")
    m.add_argument("--table", help="also print this table's prediction (and take its setting)")
    m.add_argument("--json", help="write the results as JSON here")
    _timer_args(m)
    m.set_defaults(func=run_measure)

    v = ls.add_parser("validate", help="compare a table with end-to-end measurements")
    v.add_argument("--config", required=True, help="config file with a 'space:' section")
    v.add_argument("--table", required=True, help="latency table file")
    v.add_argument("-n", type=int, default=50, help="architectures to sample (default 50)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--repeats", type=int, default=2,
                   help="independent end-to-end passes (>= 2 reports repeat agreement)")
    v.add_argument("--fit-model", action="store_true",
                   help="also fit per-(layer, op) corrections (TuNAS-style cost model)")
    v.add_argument("--save", action="store_true",
                   help="store the calibration (and corrections) in the table file")
    v.add_argument("--report", help="report JSON (default: TABLE.validate.json)")
    v.add_argument("--plot", help="write a predicted-vs-measured scatter PNG here")
    _timer_args(v)
    v.set_defaults(func=run_validate)
