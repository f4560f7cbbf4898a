"""What every trainer runs on, whatever it trains: loggers (logs), the epoch loop with signals,
checkpoints and run directory (loop), the resume policy (resume), and the run infrastructure
below them: checkpoint files (checkpoint), seeding and RNG state (rng), mixed precision
(precision), and data-parallel training (distributed). Nothing here knows what is trained: the
search and retrain trainers subclass `loop.EpochRunner`. Each module is imported by name
(`fbnas.training.loop`); this package imports none of them."""
