"""The ``engine`` fixture of the engine_* feature modules (tests/scripts/
engine_fusion_cache.py, engine_compression.py, engine_timeline.py,
engine_stall.py, engine_thread.py), which tests/test_engine_features.py runs
on real ranks.

Engine settings are read at init(), so each case starts its own engine with
its HVDLITE_* settings. The wire is the launch's choice: HVDLITE_SHM_ALLREDUCE
stays as the launch set it for every engine.
"""
import os
import shutil
import tempfile

import pytest

import hvdlite as hvd

# Launched with HVDLITE_SHM_ALLREDUCE=0: every reduction must go through MPI.
SHM_OFF = os.environ.get("HVDLITE_SHM_ALLREDUCE") == "0"
# The launch's settings that every engine of the module keeps (the wire) and
# the harness's own variables; other HVDLITE_*/HOROVOD_* settings from the
# environment are removed so each case runs with defaults plus its own.
KEEP = ("HVDLITE_SHM_ALLREDUCE", "HVDLITE_RANK_REPORT", "HVDLITE_TEST_")
# The wire phase of a sum in the timeline.
WIRE = "MPI_ALLREDUCE" if SHM_OFF else "SHM_ALLREDUCE"


@pytest.fixture
def engine(monkeypatch):
    """``engine(**settings)`` shuts down any running engine, starts one with
    these settings and returns (rank, size). After the case: with
    HVDLITE_SHM_ALLREDUCE=0, no engine the case started reduced anything
    through shared memory; the engine is shut down, so the next case starts
    with its own settings."""
    shm_used = []

    def start(**settings):
        if hvd.is_initialized():
            shm_used.append(hvd.engine_stats()["shm_collectives"])
            hvd.shutdown()
        for key in [k for k in os.environ if k.startswith(("HVDLITE_", "HOROVOD_")) and not k.startswith(KEEP)]:
            monkeypatch.delenv(key)
        for key, value in settings.items():
            monkeypatch.setenv(key, str(value))
        hvd.init()
        return hvd.rank(), hvd.size()

    yield start
    if hvd.is_initialized():
        shm_used.append(hvd.engine_stats()["shm_collectives"])
        hvd.shutdown()
    if SHM_OFF:
        assert not any(shm_used), f"HVDLITE_SHM_ALLREDUCE=0, yet shared-memory collectives ran: {shm_used}"


@pytest.fixture
def shared_dir(rank):
    """A directory every rank of this host sees (rank 0's, broadcast), removed after the case."""
    from mpi4py import MPI
    path = MPI.COMM_WORLD.bcast(tempfile.mkdtemp(prefix="hvdlite-features-") if rank == 0 else None, root=0)
    yield path
    MPI.COMM_WORLD.barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def delta(before, after, key):
    """How much the engine counter ``key`` grew from ``before`` to ``after``."""
    return after[key] - before[key]
