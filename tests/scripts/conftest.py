"""The modules here that have test_* functions are rank-side test modules: see
tests/harness/rank_plugin.py (the others are scripts that tests launch directly)."""
from harness.rank_plugin import pytest_configure, rank, size  # noqa: F401  (hook and fixtures)
