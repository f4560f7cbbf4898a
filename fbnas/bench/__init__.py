"""The ground-truth benchmark: every network of a small space trained and timed (build),
or a reference sample of a large one drawn per target band (sample), queried as NAS-Bench-101
is (table), and search runs scored against it."""
