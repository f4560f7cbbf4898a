"""From θ to the returned network: the final fit onto a cost target, where a run's costs come
from, whole networks timed end to end (the measured fit), the near-target bundle picks, and a
finished search opened as one object (`search_run`), which they read.

The package imports none of its modules: they sit on different floors (docs/architecture.md).
"""
