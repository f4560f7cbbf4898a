"""Many searches: the sweep driver, one point's work, the Ray runner, and fidelity (supernet
estimates ranked against retraining)."""

WEIGHTS = ("alpha", "beta", "lambda")  # cost weights: 0 means a cost-blind search
PARAMS = WEIGHTS + ("target",)  # what `fbnas sweep --alpha/--beta/--lambda/--targets` sweeps

