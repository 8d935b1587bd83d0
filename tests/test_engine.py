"""Engine foundation: collectives, negotiation, handles, errors on real ranks."""
import pytest

from mpi_harness import run_ranks


@pytest.mark.parametrize("ranks", [2, 4])
def test_collectives_against_numpy(ranks):
    run_ranks("scripts/engine_collectives.py", ranks, timeout=600)


@pytest.mark.parametrize("ranks", [2, 4])
def test_join(ranks):
    run_ranks("scripts/engine_join.py", ranks, timeout=300)
