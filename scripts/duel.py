"""For the compute a search costs, is its network better than random search's at that cost?

The duel (`fbnas bench duel`, fbnas.bench.duel, docs/bench.md "The duel"):
per target × seed, interleaved, the shipped search as a user runs it (`fbnas train`, its own
process, --threads threads; cost C = its wall time) against random search that trains networks
of the target's band for C seconds on the same threads (drawn uniformly, kept where the table
puts them within search.fit_tolerance, timed end to end as the measured fit times them,
trained with the child recipe, the best by validation accuracy returned). Both picks retrained
under --retrain-seeds (none of the pairs' seeds). Prints per pair and per target: the paired
mean difference in test accuracy (search − random, points) with its 95% bootstrap interval,
wins, the median cost ratio R = C / one child training, the R = 1 comparison (the search's
pick against the median of the random side's trained networks), each pick's latency offset
and, with --bench, its percentile among the file's reference networks within ±3% of its
latency.

    python -m scripts.duel --config configs/cluttered_digits.yaml --targets 0.5x,0.8x \\
        --seeds 0,1,2,3,4,5 --threads 1 --out runs/duel [--bench FILE] [--own-table]

Resumable: --out DIR/pairs.json holds each pair's stages as they finish; a re-run skips them.
The figures go to DIR/duel.json. The same as `fbnas bench duel ARGS`.
"""

from __future__ import annotations

import sys

from fbnas.cli import main as fbnas_main


def main(argv: list[str] | None = None) -> int:
    return fbnas_main(["bench", "duel", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
