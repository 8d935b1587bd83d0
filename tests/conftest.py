import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mpi_harness import _rank_runs, rank_launch  # noqa: E402,F401  (fixtures)
