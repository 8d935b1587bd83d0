import os
import sys

# tests/ on sys.path: the harness package (tests/harness/) and rank-side helpers.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness.ranks import _rank_runs, rank_launch  # noqa: E402,F401  (fixtures)
