"""What computes: models, drafters, the speculative round, the sampling maths, and the pair of a target and
its drafts that a sweep or `generate` runs."""
