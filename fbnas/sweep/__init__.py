"""Many searches: the sweep driver, one point's work, the Ray runner, and fidelity (supernet
estimates ranked against retraining)."""
