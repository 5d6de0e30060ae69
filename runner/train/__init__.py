"""Training draft heads for a target: self-distilled data, the unrolled training loop, and its records."""
