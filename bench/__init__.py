"""hvdlite's benchmark suite: ``python -m hvdlite.bench`` (see bench/run.py and docs/benchmarks.md)."""
