"""`fbnas bench ACTION`: the ground-truth benchmark of a small space, one module per action.

    fbnas bench build --config configs/bench_digits.yaml --out bench.json.gz   (resumable)
    fbnas bench query ARCH.yaml --bench bench.json.gz   (its entry and its rank)
    fbnas bench show bench.json.gz                      (what it holds, the spread, the front)
    fbnas bench score RUN... --bench bench.json.gz      (search runs judged by the truth)
"""

from __future__ import annotations

from fbnas.cli import add_actions
from fbnas.cli.bench import build, query, score, show

ACTIONS = (build, query, show, score)


def add_parser(sub) -> None:
    add_actions(sub, "bench", "the ground-truth benchmark of a small space: build, query, "
                "show, score", ACTIONS)
