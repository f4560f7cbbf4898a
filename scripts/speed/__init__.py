"""Benchmarks of speed and memory: search steps per mode, precision and layout, data loading,
DDP, torch.compile, whole search epochs, width search's cost per step."""
