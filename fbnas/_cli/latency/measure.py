"""`fbnas latency measure`: child networks (--arch) or model files (--model) timed end to end,
beside a table's prediction (--table, whose setting the timer then takes); with --config,
among the table's probe networks and anchored to them, as the measured fit times."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fbnas._cli.latency.common import log, protocol, timer, timer_args
from fbnas.errors import FbnasError
from fbnas.io import write_json_atomic
from fbnas.runs.results import record_program_anywhere

if TYPE_CHECKING:  # pragma: no cover
    from fbnas.latency.end_to_end import Panel
    from fbnas.latency.table import LatencyTable
    from fbnas.latency.timed_models import ModelSpec


def _specs(args) -> list[ModelSpec]:
    """One spec per --arch file (a fresh child) and --model file (a retrain checkpoint or run
    directory, an fbnas export, any TorchScript file or .pt2 program)."""
    from fbnas.latency.timed_models import ModelSpec, parse_input_shape

    shape = parse_input_shape(args.input_shape)
    specs = [ModelSpec(f"{i}:{Path(path).stem}", "arch", path)
             for i, path in enumerate(args.arch or [])]
    specs += [ModelSpec(f"{j}:{Path(path).stem}", "model", path, shape)
              for j, path in enumerate(args.model or [], start=len(specs))]
    if not specs:
        raise FbnasError("latency measure: give --arch ARCH.yaml and/or --model FILE")
    return specs


def _panel(args, table: LatencyTable | None) -> Panel:
    """With --config, the table's probe networks of the config's space (the figures are then
    anchored to them, as the measured fit's are); else none (through the reference op)."""
    from fbnas.latency.end_to_end import Panel, panel
    from fbnas.search_space import load_space

    if not args.config:
        return Panel([])
    if table is None:
        raise FbnasError("latency measure: --config needs --table (the table whose probe "
                         "networks the figures are anchored to)")
    pan = panel(load_space(args.config), table)
    if not pan.anchors:
        log(f"latency measure: {args.table} has no probe networks of {args.config}'s space "
            "(a table built before 2026-11-25, or for another space): figures through the "
            "reference op")
        return Panel([])
    return pan


def run(args) -> int:
    from fbnas.arch import Architecture
    from fbnas.latency.end_to_end import panel_modules, unit_scales
    from fbnas.latency.table import LatencyTable
    from fbnas.latency.timed_models import measure_specs

    table = LatencyTable.load(args.table) if args.table else None
    t = timer(args, table)
    if table is not None:
        table.check_run(batch=t.batch, dtype=t.dtype, backend=t.backend, allocator=t.allocator,
                        quantization=t.quantization)
    specs = _specs(args)
    proto = protocol(args)
    pan = _panel(args, table)
    items, m = measure_specs(t, specs, proto, panel_modules(pan))
    scale_of, ref_scale_us = unit_scales(m, table, pan, proto.reference)
    results = []
    for it in items:
        st = m.entries[it["label"]]
        s = st.summary(scale_of(it["label"]) / 1e6)
        line = (f"{it['label'].split(':', 1)[1]} {it['path']}: median "
                f"{s['median_us']:.1f} us, min {s['min_us']:.1f} us, IQR "
                f"{100 * s['rel_iqr']:.1f}% ({s['n']} samples x {st.number} calls; "
                f"{t.backend}, {t.threads} thread(s), batch {t.batch}, "
                f"{t.allocator} allocator{'; ' + pan.label if pan.anchors else ''})")
        res = {it["kind"]: it["path"], "hash": it["hash"], "input_shape": it["input_shape"],
               **s, "units": pan.label}
        if pan.anchors:
            res["ref_median_us"] = m.ratio(it["label"]) * ref_scale_us
        if table is not None and it["arch"] is not None:
            a = Architecture.from_dict(it["arch"], it["path"])
            try:
                pred = table.predict(a, "raw")
            except FbnasError:
                pred = None  # not this table's space
            if pred is not None:
                line += f"; table {pred:.1f} us (x{pred / s['median_us']:.2f})"
                res["predicted_us"] = pred
        print(line)
        if it["kind"] == "model":
            where = record_program_anywhere(
                it["path"], measured_us=s["median_us"], measured_iqr=s["rel_iqr"],
                timer=f"{t.backend}, {t.threads} thread(s), batch {t.batch}"
                      f"{'; ' + pan.label if pan.anchors else ''}")
            if where is not None:
                print(f"  recorded in {where}")
        results.append(res)
    if args.json:
        write_json_atomic(args.json, {"timer": t.describe(), "results": results,
                                      "reference_scale_us": ref_scale_us if proto.reference
                                      else None})
    return 0


def add_parser(actions) -> None:
    m = actions.add_parser("measure", help="time child networks end to end with the table's "
                                           "timer")
    m.add_argument("--arch", nargs="+", help="architecture YAML file(s) (a fresh child each)")
    m.add_argument("--model", nargs="+", metavar="FILE",
                   help="model(s): a retrain checkpoint or run directory, an `fbnas export` "
                        "file, or any TorchScript file, torch.export program (.pt2) or "
                        "ExecuTorch program (.pte)")
    m.add_argument("--input-shape", metavar="C,H,W",
                   help="input shape of --model files that do not carry one (a plain "
                        "TorchScript file; a .pt2 with a dynamic shape)")
    m.add_argument("--table", help="also print this table's prediction (and take its setting)")
    m.add_argument("--config", help="a config of the table's space (a run's config.yaml): the "
                                    "networks are timed among the table's probe networks and "
                                    "their figures anchored to them, as the measured fit's "
                                    "(default: through the reference op)")
    m.add_argument("--json", help="write the results as JSON here")
    timer_args(m)
    m.set_defaults(func=run)
