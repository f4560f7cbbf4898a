"""The ground-truth benchmark: every network of a small space trained and timed (build),
or a reference sample of a large one drawn per target band (sample), queried as NAS-Bench-101
is (table), and search runs scored against it."""

# what a benchmark records per network, seed and budget
METRICS = ("train_acc", "train_loss", "val_acc", "val_ce", "test_acc", "test_ce", "seconds")
# the bands a sampled benchmark draws from when none are given (`--targets`)
DEFAULT_BANDS = ("0.5x", "0.8x")

