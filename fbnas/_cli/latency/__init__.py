"""`fbnas latency ACTION`: latency (and FLOPs / params) tables per device, one module per
action; what they share (the timing flags, the protocol, the timer from table, config and
flags) is in `common`.

    fbnas latency build --config configs/fbnet_cifar10.yaml --device cpu --out lat_cpu.json
    fbnas latency build --config configs/fbnet_cifar10.yaml --cost flops --out flops.json
    fbnas latency show lat_cpu.json [--config configs/fbnet_cifar10.yaml]
    fbnas latency predict --arch configs/archs/fbnet_a.yaml --table lat_cpu.json
    fbnas latency measure --arch configs/archs/fbnet_a.yaml --device cpu [--table lat_cpu.json]
    fbnas latency validate --config configs/fbnet_cifar10.yaml --table lat_cpu.json -n 50
    fbnas latency bundle --config configs/fbnet_cifar10.yaml --out bundle/   (then, on the
    device: python run_bundle.py; here: fbnas latency import bundle/results.json --out T.json)

An action is a module with `add_parser(actions)` (its parser, `func` set to its `run(args)`),
listed in ACTIONS.
"""

from __future__ import annotations

from fbnas._cli import add_actions
from fbnas._cli.latency import (
    build,
    bundle,
    import_results,
    measure,
    predict,
    show,
    validate,
)

# in the order `fbnas latency --help` lists them
ACTIONS = (build, bundle, import_results, show, predict, measure, validate)


def add_parser(sub) -> None:
    add_actions(sub, "latency", "latency lookup tables: build, show, predict, measure, "
                "validate, bundle, import", ACTIONS)
