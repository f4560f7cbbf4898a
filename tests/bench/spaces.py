"""Search spaces the benchmark tests share."""

# 3 searchable layers x 4 ops: 64 networks, enough for bands of several networks each
SPACE64 = {
    "name": "bench_s64", "input_size": 8, "in_channels": 1, "num_classes": 10,
    "stem": {"channels": 8, "stride": 1},
    "candidates": ["ir_k3_e1", "ir_k3_e3", "ir_k5_e1", "skip"],
    "stages": [{"channels": 8, "repeats": 2, "stride": 1},
               {"channels": 16, "repeats": 1, "stride": 2}],
    "head": {"channels": 16},
}
