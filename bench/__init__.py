"""Benchmarks: `python bench/run.py` (see the README)."""
