"""notifkit benchmarks: `python -m benchmarks` (see benchmarks/__main__.py)."""
