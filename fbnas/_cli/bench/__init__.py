"""`fbnas bench ACTION`: the ground-truth benchmark of a small space, one module per action.

    fbnas bench build --config configs/bench_digits.yaml --bench bench.json.gz   (resumable)
    fbnas bench build --config C.yaml --bench F --sample 50 --targets 0.5x,0.8x  (sampled)
    fbnas bench add ARCH.yaml... --bench F --config C.yaml  (a search's picks into a sampled one)
    fbnas bench query ARCH.yaml --bench bench.json.gz   (its entry and its rank)
    fbnas bench show --bench bench.json.gz              (what it holds, the spread, the front)
    fbnas bench score RUN... --bench bench.json.gz      (search runs judged by the truth)
    fbnas bench duel --config C.yaml --out DIR [--bench F]  (the search against random
                                                        search at equal cost; resumable)
"""

from __future__ import annotations

from fbnas._cli import add_actions
from fbnas._cli.bench import add, build, duel, query, score, show

ACTIONS = (build, add, query, show, score, duel)


def add_parser(sub) -> None:
    add_actions(sub, "bench", "the ground-truth benchmark of a small space (or a sample of a "
                "large one): build, add, query, show, score, duel", ACTIONS)
