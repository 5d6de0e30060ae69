"""Benchmarks: `make bench` (bench.py), the 10M-round scale check (scale.py), the browser load (load.py)."""
