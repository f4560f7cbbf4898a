"""What the search trainer is made of: the search modes, its weight / path / θ steps, the
temperature schedule and its per-epoch figures. The trainer itself is `fbnas.trainer`.

The package imports none of its modules: they sit on different floors (docs/architecture.md).
"""
