"""Engine foundation: collectives, negotiation, handles, errors on real ranks."""
import pytest

from mpi_harness import run_ranks


@pytest.mark.parametrize("ranks,wire", [(2, "shm"), (4, "shm"), (2, "mpi"), (4, "mpi")])
def test_collectives_against_numpy(ranks, wire):
    """Every check once with reductions through shared memory (the default on one
    host) and once through MPI."""
    env = {"HVDLITE_SHM_ALLREDUCE": "0"} if wire == "mpi" else None
    run_ranks("scripts/engine_collectives.py", ranks, env=env, timeout=600)


@pytest.mark.parametrize("ranks", [2, 4])
def test_join(ranks):
    run_ranks("scripts/engine_join.py", ranks, timeout=300)


@pytest.mark.parametrize("ranks", [2, 3])
def test_init_with_process_sets(ranks):
    """init(process_sets=...) with repeated and per-rank communicator sets, on
    an MPI that init() itself starts (mpi4py.rc.initialize = False)."""
    run_ranks("scripts/init_process_sets.py", ranks, timeout=180)
