"""Which reference op compensates drift for which entries.

Times FBNet-space blocks from 7x7 to 112x112 beside several candidate reference ops in
shuffled rounds (fbnas.latency.measure without its own reference: each item sampled once per
round, ~8 ms a sample, 1 thread, batch 1), then
normalises every block sample by each reference's sample of the same round and prints the
spread (IQR / median) of the normalised samples, per block and reference. The reference that
leaves the least spread is the one that moves with that block when the machine drifts; `raw`
is no compensation. Each repeat runs in a fresh worker process under `--allocator`.

    python -m scripts.latency.reference [--allocator retain] [--rounds 60] [--repeats 2]

Run it alone on the machine: other jobs are exactly the drift it measures, but they also
change which op suffers most.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from fbnas.backends import Runnable
from fbnas.backends.worker import call_in_worker
from fbnas.latency import REFERENCE, Protocol, Signature, make_timer
from fbnas.latency.measure import measure
from scripts.common import Spread

BLOCKS = [Signature("block", op, c, c, 1, hw, hw) for op, c, hw in [
    ("ir_k3_e1", 16, 112), ("ir_k5_e3", 16, 112), ("ir_k5_e6", 16, 112),
    ("ir_k5_e6", 24, 56), ("ir_k3_e6", 32, 28), ("ir_k5_e6", 64, 14), ("ir_k3_e6", 112, 14),
    ("ir_k5_e6", 184, 7)]]
REFS = {"compute": REFERENCE,  # the table's reference: 32 ch at 16x16, fits in cache
        "res112": Signature("block", "ir_k3_e1", 16, 16, 1, 112, 112),
        "res56": Signature("block", "ir_k3_e3", 24, 24, 1, 56, 56)}


class Stream:
    """A memory-bound op: y = x * 2 over 4 x 8 MiB, into a kept output (no allocation)."""

    def __init__(self):
        self.x = torch.randn(4, 2 ** 21)
        self.y = torch.empty_like(self.x)

    def __call__(self):
        torch.mul(self.x, 2.0, out=self.y)


def run_once(timer, rounds: int, seed: int, blocks: list[Signature]) -> dict[str, list[float]]:
    """Per item, one sample (seconds per call) per round."""
    with timer:
        runs = {b.key(): timer.prepare(b.build(), b.input_shape, b.key()) for b in blocks}
        for name, sig in REFS.items():
            runs[f"ref:{name}"] = timer.prepare(sig.build(), sig.input_shape, name)
        runs["ref:stream"] = Runnable(Stream(), None, label="stream")
        m = measure(timer, runs, Protocol(rounds=rounds, reference=False, extra_rounds=0,
                                          seed=seed))
    return {k: e.times for k, e in m.entries.items()}


def spread(x: np.ndarray) -> float:
    return Spread.of(x, inclusive=True).rel_iqr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allocator", default="retain")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=len(BLOCKS), help="the first N blocks only")
    args = ap.parse_args(argv)
    blocks = BLOCKS[:args.blocks]
    refs = ["raw"] + [f"ref:{n}" for n in [*REFS, "stream"]]
    print(f"rel. IQR of block samples / reference sample of the same round, {args.rounds} "
          f"rounds, allocator {args.allocator}; medians in ms")
    allspread: dict[str, list[float]] = {r: [] for r in refs}
    wins = dict.fromkeys(refs, 0)
    for rep in range(args.repeats):
        timer = make_timer("cpu", allocator=args.allocator)
        times = call_in_worker(args.allocator, timer.allocator_library, run_once,
                               (timer, args.rounds, rep, blocks), {})
        t = {k: np.asarray(v) for k, v in times.items()}
        print(f"== repeat {rep}: reference spreads "
              + ", ".join(f"{r[4:]} {100 * spread(t[r]):.1f}%" for r in refs[1:]))
        print(f"{'block':<26}{'ms':>7}" + "".join(f"{r.replace('ref:', ''):>9}" for r in refs))
        best = dict.fromkeys(refs, 0)
        for b in blocks:
            k = b.key()
            s = [spread(t[k]) if r == "raw" else spread(t[k] / t[r]) for r in refs]
            best[refs[int(np.argmin(s))]] += 1
            wins[refs[int(np.argmin(s))]] += 1
            for r, v in zip(refs, s, strict=True):
                allspread[r].append(v)
            print(f"{k:<26}{1e3 * np.median(t[k]):7.2f}"
                  + "".join(f"{100 * v:8.1f}%" for v in s))
        print("least spread: " + ", ".join(f"{r.replace('ref:', '')} {n}"
                                            for r, n in best.items()))
    print(f"== over {args.repeats} repeats x {len(blocks)} blocks: median spread [min-max], "
          "times least")
    for r in refs:
        v = 100 * np.asarray(allspread[r])
        print(f"{r.replace('ref:', ''):<8} {np.median(v):5.1f}% [{v.min():.1f}-{v.max():.1f}]"
              f"  least {wins[r]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
