"""Benchmarks and experiments of search quality: the supernet's ranking, regret against the
ground truth, the measured fit's aim, the target sweep, the child recipe, the duel task's
pilot, and the bit-identity of a change."""
