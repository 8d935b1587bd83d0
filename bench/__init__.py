"""hvdlite's benchmark suite: ``python -m hvdlite.bench`` (see bench/run.py; results in bench/results/, summarised in docs/benchmarks.md)."""
