"""From θ to the returned network: the final fit onto a cost target, whole networks timed end
to end (the measured fit), the near-target bundle picks, and a finished search opened as one
object (`search_run`), which they read. (Where a run's costs come from: `fbnas.latency.resolve`.)

The package imports none of its modules: they sit on different floors (docs/architecture.md).
"""
