"""`fbnas space CONFIG`: the search space's searchable layers, as shape inference sees them."""

from __future__ import annotations

import math


def add_parser(sub) -> None:
    p = sub.add_parser("space", help="show a search space's layers and candidates")
    p.add_argument("config", help="config file with a 'space:' section")
    p.set_defaults(func=run)


def run(args) -> int:
    from fbnas.search_space import load_space

    space = load_space(args.config)
    m = space.macro
    _, c, s, h, w = m.stem_shape()
    print(f"search space '{space.name}': input {h}x{w}x{m.in_channels}, {m.num_classes} classes, "
          f"width x{m.width_mult}")
    print(f"stem: conv{m.stem.kernel}x{m.stem.kernel} -> {c} ch, stride {s}")
    print(f"{'layer':>5} {'stage':>5} {'c_in':>5} {'c_out':>5} {'s':>2} {'input':>9}  candidates")
    for la in space.layers():
        cands = " ".join(space.candidates(la))
        print(f"{la.index:5d} {la.stage:5d} {la.c_in:5d} {la.c_out:5d} {la.stride:2d} "
              f"{la.h:>4d}x{la.w:<4d}  {cands}")
    c_in, c_head, h, w, k = m.head_shape()
    print(f"head: {c_in} -> conv1x1 {c_head} at {h}x{w} -> {m.head.pool}pool -> fc {k}")
    for st in space.width_stages():  # docs/widths.md
        print(f"stage {st} width: one of {', '.join(map(str, space.width_choices(st)))} channels "
              "(searched; the table shows the widest)")
    print(f"{space.num_layers} searchable layers, 10^{math.log10(space.size()):.1f} architectures")
    return 0
