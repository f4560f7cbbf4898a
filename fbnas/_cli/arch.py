"""`fbnas arch ARCH.yaml`: an architecture's hash, parameter and FLOP counts."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("arch", help="show an architecture's ops, hash, params and FLOPs")
    p.add_argument("arch", nargs="+", help="architecture YAML file(s)")
    p.add_argument("--config",
                   help="also check that each architecture belongs to this config's space")
    p.set_defaults(func=run)


def run(args) -> int:
    from fbnas.arch import Architecture, child_stats
    from fbnas.search_space import load_space

    space = load_space(args.config) if args.config else None
    for path in args.arch:
        arch = Architecture.load(path)
        if space is not None:
            arch.check_fits(space, path)
        s = child_stats(arch)
        print(f"{arch.name} [{arch.short_hash}] {path}")
        for i, ops in enumerate(arch.stage_ops()):
            print(f"  stage {i}: {' '.join(ops)}")
        print(f"  params {s['params'] / 1e6:.2f} M   FLOPs {s['flops'] / 1e6:.1f} M "
              f"(multiply-adds {s['macs'] / 1e6:.1f} M)")
    return 0
