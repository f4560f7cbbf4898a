"""Benchmarks of latency tables and deployed programs: repeatability, prediction of whole
networks per space, allocator and runtime, the reference op, exported programs against eager,
int8."""
