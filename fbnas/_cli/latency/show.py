"""`fbnas latency show`: a table per layer (op x cost, fastest and slowest marked) and what it
records of how it was measured."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fbnas._cli.latency.common import counted, fmt

if TYPE_CHECKING:  # pragma: no cover
    from fbnas.latency.table import LatencyTable


def _header(path: str, table: LatencyTable) -> None:
    from fbnas.latency.build import context_text

    m = table.meta
    print(f"{path}: {table.cost} ({table.unit}), {len(table)} entries, schema 1, "
          f"fingerprint {table.fingerprint()[:12]}")
    if counted(table):
        return
    print(f"  device {m.get('backend')} / {m.get('device_name')}; {m.get('threads')} "
          f"thread(s), batch {m.get('batch')}, {m.get('dtype')}, {m.get('memory_format')}; "
          f"torch {m.get('torch_version')}; created {m.get('created')}")
    if table.noise:
        n = table.noise
        print(f"  spread IQR/median: median {100 * (n.get('median_rel_iqr') or 0):.1f}%, "
              f"p90 {100 * (n.get('p90_rel_iqr') or 0):.1f}%; machine drift p90/p10 "
              f"{n.get('drift_p90_over_p10')}")
    if table.context:
        print(f"  {context_text(table)}: an entry's in-network value from its isolated ratio "
              "to the reference op (in the values)")
    if table.calibration:
        c = table.calibration
        print(f"  calibration: measured = {c['a']:.3f} x predicted + {c['b']:.1f}")


def _groups(table: LatencyTable, config: str | None) -> tuple[list[tuple[str, dict]], list]:
    """(row name, {op: signature}) per row, and the fixed (stem, head) signatures: by the
    config's layers, else by the shapes the table holds."""
    from fbnas.latency.signature import head_signature, layer_signatures, stem_signature
    from fbnas.search_space import load_space

    if config:
        space = load_space(config)
        groups = [(f"layer {i:2d}", row) for i, row in enumerate(layer_signatures(space))]
        return groups, [stem_signature(space.macro), head_signature(space.macro)]
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
    return groups, fixed


def run(args) -> int:
    from fbnas.latency.table import LatencyTable

    table = LatencyTable.load(args.table)
    _header(args.table, table)
    unit = table.unit
    groups, fixed = _groups(table, args.config)
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
                cells.append(f"{fmt(vals[op], table):>{width - 1}}{mark}")
        print(f"{name:>22}" + "".join(cells))
    for s in fixed:
        v = f"{fmt(table.entries[s.key()].value, table).strip()}" if s in table else "missing"
        print(f"  {s.kind}: {s.key()}  {v} {unit}")
    per = " per sample" if counted(table) else ""
    print(f"  (* fastest, ! slowest of the layer; values in {unit}{per})")
    return 0


def add_parser(actions) -> None:
    s = actions.add_parser("show", help="print a table per layer: op x cost, fastest/slowest "
                                        "marked")
    s.add_argument("table", help="table file")
    s.add_argument("--config", help="lay the table out by this search space's layers")
    s.set_defaults(func=run)
