"""What the `fbnas latency` actions share: the timing flags, the measurement protocol from
them, and the one way a timer is built from a table, a config and the flags
(`LatencyConfig.for_timing`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from fbnas.backends import DTYPES, QUANTIZATIONS, TIMERS, clock_choices, offered
from fbnas.backends.allocator import ALLOCATORS
from fbnas.errors import FbnasError
from fbnas.latency.kinds import COST_KINDS
from fbnas.settings import TIMING_ROUNDS

if TYPE_CHECKING:  # pragma: no cover
    from fbnas.backends.base import Timer
    from fbnas.latency.measure import Protocol
    from fbnas.latency.table import LatencyTable


def timer_args(p) -> None:
    """The flags of the actions that time (build, measure, validate)."""
    g = p.add_argument_group("timing")
    g.add_argument("--device", default=None, choices=TIMERS.choices(),
                   metavar="{" + ",".join(offered(TIMERS)) + "}",
                   help="backend to time on (default: the table's, else cpu; executorch, ort: "
                        "the exported runtimes)")
    g.add_argument("--threads", type=int, default=None,
                   help="CPU threads while timing (default 1; recorded in the table)")
    g.add_argument("--batch", type=int, default=None, help="batch size (default 1)")
    g.add_argument("--dtype", default=None, choices=DTYPES,
                   help="dtype (default float32)")
    g.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    g.add_argument("--quantization", default=None, choices=QUANTIZATIONS,
                   help="time the programs quantized as the runtime deploys them (int8: "
                        "executorch, ort; default none, or the table's)")
    g.add_argument("--allocator", default=None, metavar="NAME|PATH",
                   help=f"cpu: memory allocator to time under ({', '.join(ALLOCATORS)}, or "
                        "a jemalloc/tcmalloc library path; default retain, or the table's; "
                        "see docs/latency.md)")
    g.add_argument("--clock", choices=clock_choices(), default=None,
                   help="cpu: thread CPU time (default with 1 thread; leaves out time other "
                        "processes took) or wall time (default with several threads)")
    g.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds per entry (default: the table's protocol, else "
                        f"{TIMING_ROUNDS})")
    g.add_argument("--sample-ms", type=float, default=None,
                   help="target duration of one sample in ms (default 8)")
    g.add_argument("--no-reference", action="store_true",
                   help="do not normalise by the reference op (drift compensation off)")


def protocol(args, base: dict | None = None) -> Protocol:
    """The measurement protocol: `base` (a table's), then --rounds, --sample-ms,
    --no-reference."""
    from fbnas.latency.measure import Protocol

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


def timer(args, table: LatencyTable | None = None, config: str | None = None) -> Timer:
    """A timer from the flags; unset flags take the table's setting (a measured table's), then
    the config's `latency:` section, then the defaults (1 thread, batch 1, float32,
    contiguous)."""
    from fbnas.latency.config import LatencyConfig

    measured = table is not None and not counted(table)
    lat = LatencyConfig.from_file(config).for_timing(
        table.meta if measured else None, device=args.device, threads=args.threads,
        batch=args.batch, dtype=args.dtype, channels_last=args.channels_last,
        allocator=args.allocator, quantization=args.quantization)
    clock = {"clock": args.clock} if TIMERS.get(lat.device).clocks and args.clock else {}
    return lat.make_timer(**clock)


def log(msg: str) -> None:
    print(msg, file=sys.stderr)


def counted(table: LatencyTable) -> bool:
    """Whether the table holds a counted kind (FLOPs, params: per sample) or a measured one."""
    return COST_KINDS.get(table.cost).counted


def fmt(v: float, table: LatencyTable) -> str:
    """One of the table's values for a column: measured ones (µs) as they are, counted ones
    in millions."""
    if counted(table):
        return f"{v / 1e6:8.2f}M"
    return f"{v:9.1f}"
