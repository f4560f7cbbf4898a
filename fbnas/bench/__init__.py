"""The ground-truth benchmark: every network of a small space trained and timed (build),
queried as NAS-Bench-101 is (table), and search runs scored against it."""
