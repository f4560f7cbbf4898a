"""Benchmarks and one-off tools (scripts/README.md); run each as `python -m scripts.NAME`."""
