"""`fbnas latency bundle`: a space's blocks as ExecuTorch programs with a standalone runner, for
a device that cannot run fbnas (`fbnas latency import` reads back what it measured)."""

from __future__ import annotations

from pathlib import Path

from fbnas._cli.latency.common import log
from fbnas.backends import QUANTIZATIONS, TIMERS
from fbnas.errors import FbnasError
from fbnas.settings import CONTEXT_PROBES, TIMING_ROUNDS


def run(args) -> int:
    from fbnas.latency.bundle import write_bundle
    from fbnas.latency.measure import Protocol
    from fbnas.latency.table import LatencyTable
    from fbnas.search_space import load_space

    space = load_space(args.config)
    table = LatencyTable.load(args.table) if args.table else None
    if args.threads < 1:
        raise FbnasError(f"--threads: must be >= 1, got {args.threads}")
    man = write_bundle(space, args.out, args.runtime, threads=args.threads,
                       protocol=Protocol(rounds=args.rounds), probes=args.probes, table=table,
                       log=None if args.quiet else log, quantization=args.quantization)
    n = sum(p["kind"] == "entry" for p in man["programs"])
    q = f" {man['quantization']}" if "quantization" in man else ""
    print(f"{args.out}: {n} entries as{q} .pte for {man['runtime']} {man['runtime_version']} "
          f"({args.threads} thread(s)); on the device: python run_bundle.py, then "
          f"fbnas latency import {Path(args.out) / 'results.json'} --out TABLE.json")
    return 0


def add_parser(actions) -> None:
    bd = actions.add_parser("bundle", help="write a space's blocks as ExecuTorch programs with "
                                           "a standalone runner, for a device that cannot run "
                                           "fbnas")
    bd.add_argument("--config", required=True, help="config file with a 'space:' section")
    bd.add_argument("--out", required=True, help="new folder for the bundle")
    bd.add_argument("--runtime", default="executorch", choices=TIMERS.choices(bundle=True),
                    help="the runtime the bundle's programs are lowered for")
    bd.add_argument("--table", help="leave out the entries this table has")
    bd.add_argument("--threads", type=int, default=1, help="threads on the device (default 1)")
    bd.add_argument("--rounds", type=int, default=TIMING_ROUNDS, help="interleaved rounds")
    bd.add_argument("--probes", type=int, default=CONTEXT_PROBES,
                    help="child networks for the context model (0: none)")
    bd.add_argument("--quantization", choices=QUANTIZATIONS,
                    help="int8: every program quantized as latency.quantization: int8 times "
                         "it (default: --table's, else none)")
    bd.add_argument("--quiet", action="store_true", help="no per-program lines")
    bd.set_defaults(func=run)
