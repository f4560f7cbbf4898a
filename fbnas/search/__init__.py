"""What the search trainer is made of: the search modes (`modes`), its per-epoch figures
(`figures`) and the plan of a search at a budget (`budget`). The trainer itself, with its
steps and temperature schedule, is `fbnas.trainer`.

The package imports none of its modules: they sit on different floors (docs/architecture.md).
"""
