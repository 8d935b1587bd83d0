"""init(process_sets=...) as Horovod scripts use it, on a process whose MPI
is started by hvdlite itself (mpi4py.rc.initialize = False).

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_engine.py runs
it at 2 and 3 ranks. Its cases are steps of one scenario, each set up by the
fixtures of the steps before: MPI started with MPI_THREAD_MULTIPLE by init();
a list with a repeated set raises ValueError after registering the others,
and a second init() with the corrected list binds to them; sets given by
communicators that name different ranks on different ranks (the two halves
of a split) are registered as their union, communicator sets first;
collectives over every set match NumPy; add_process_set refuses a set already
registered and the global set; at exit hvdlite finalises the MPI it started
(the job's exit status, the case job_exit of tests/test_engine.py).
"""
import atexit
import os
from types import SimpleNamespace

import mpi4py

mpi4py.rc.initialize = False  # before mpi4py.MPI is imported anywhere

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hvdlite as hvd  # noqa: E402
from harness.checks import expect  # noqa: E402
from hvdlite.process_sets import get_process_set_ids_and_ranks  # noqa: E402


def check_allreduce(ps, r, what):
    got = hvd.allreduce(np.full(3, r + 1, np.int64), op=hvd.Sum, process_set=ps)
    want = np.full(3, sum(k + 1 for k in ps.ranks), np.int64)
    assert np.array_equal(got, want), f"{what}: {got} != {want}"


def finalized_at_exit():
    # Registered before init(), so it runs after hvdlite's exit hook, which
    # must have finalised the MPI that init() started.
    if not MPI.Is_finalized():
        os.write(2, b"MPI was not finalised at exit\n")
        os._exit(1)


@pytest.fixture(scope="module")
def first():
    """init() with a repeated entry (the global set, and [0] twice), MPI not started yet."""
    # MPI is not started yet: the launcher's variables give rank and size.
    env = os.environ
    r = int(env.get("PMI_RANK", env.get("OMPI_COMM_WORLD_RANK", -1)))
    n = int(env.get("PMI_SIZE", env.get("OMPI_COMM_WORLD_SIZE", -1)))
    assert n >= 2 and r >= 0, "run with 2 or more ranks under mpiexec"
    mpi_started_before = MPI.Is_initialized()
    atexit.register(finalized_at_exit)
    rest = list(range(1, n))
    sets = [hvd.ProcessSet([0]), hvd.ProcessSet(rest if r == 0 else reversed(rest)),
            hvd.ProcessSet(range(n - 1, -1, -1)), hvd.ProcessSet([0])]
    error = expect(ValueError, lambda: hvd.init(process_sets=sets), "entry number 2", "global")
    return SimpleNamespace(r=r, n=n, rest=rest, sets=sets, error=error,
                           mpi_started_before=mpi_started_before,
                           want={0: list(range(n)), 1: [0], 2: rest})


@pytest.fixture(scope="module")
def again(first):
    """Retrying with the corrected list."""
    sets = [hvd.ProcessSet([0]), hvd.ProcessSet(first.rest)]
    hvd.init(process_sets=sets)
    return sets


@pytest.fixture(scope="module")
def split(first, again):
    """Each rank names the half of a split it is in, plus listed sets and, on
    the last rank only, the global set (a ValueError there)."""
    r, n = first.r, first.n
    half = MPI.COMM_WORLD.Split(color=r % 2, key=r)
    mine = hvd.ProcessSet(half)
    listed = [hvd.ProcessSet([0, 1])] if n > 2 else []  # [0, 1] is the global set at 2 ranks
    extra = [hvd.ProcessSet(range(n))] if r == n - 1 else []  # the global set, on one rank only
    error = None
    try:
        hvd.init(process_sets=[mine] + listed + extra)
    except ValueError as err:
        error = err
    yield SimpleNamespace(half=half, mine=mine, listed=listed, error=error)
    half.Free()


def test_repeated_set_raises_after_registering_the_rest(first):
    """ValueError, and the engine is up with the other sets registered, in the order listed."""
    assert not first.mpi_started_before, "mpi4py started MPI although rc.initialize is False"
    assert isinstance(first.error, hvd.InvalidArgumentError)
    assert MPI.Is_initialized() and MPI.Query_thread() == MPI.THREAD_MULTIPLE, MPI.Query_thread()
    assert hvd.is_initialized() and hvd.size() == first.n and hvd.rank() == first.r
    assert hvd.global_process_set.mpi_comm is None  # init() was given no communicator
    sets = first.sets
    assert str(sets[0]) == "ProcessSet(process_set_id=1, ranks=[0], mpi_comm=None)", str(sets[0])
    assert get_process_set_ids_and_ranks() == first.want, get_process_set_ids_and_ranks()
    assert sets[0].process_set_id == 1 and sets[1].process_set_id == 2
    assert sets[2].process_set_id is None and sets[3].process_set_id is None


def test_retry_binds_the_registered_sets(first, again):
    assert [ps.process_set_id for ps in again] == [1, 2]
    assert get_process_set_ids_and_ranks() == first.want
    for ps in again:
        if ps.included():
            check_allreduce(ps, first.r, f"set {ps.ranks}")
    hvd.barrier()


def test_communicator_sets_register_their_union(first, again, split):
    """The union (evens, odds) is registered before the list sets."""
    r, n = first.r, first.n
    evens, odds = list(range(0, n, 2)), list(range(1, n, 2))
    mine, listed = split.mine, split.listed
    assert mine.ranks == (evens if r % 2 == 0 else odds), mine.ranks
    assert (split.error is not None) == (r == n - 1), f"rank {r}: {split.error}"
    table = get_process_set_ids_and_ranks()
    new = [ranks for pid, ranks in sorted(table.items()) if pid > 2]
    expected = []
    for ranks in [evens, odds] + [ps.ranks for ps in listed]:
        if ranks not in [[0], first.rest] + expected:  # registered ones are reused
            expected.append(ranks)
    assert new == expected, table
    assert table[mine.process_set_id] == mine.ranks
    for ps in listed:
        assert table[ps.process_set_id] == [0, 1]
    assert mine.mpi_comm is split.half
    check_allreduce(mine, r, "communicator set")
    got = hvd.allgather(np.full((1, 2), r, np.int32), process_set=mine)
    assert np.array_equal(got, np.repeat(np.asarray(mine.ranks, np.int32)[:, None], 2, axis=1)), got
    hvd.barrier()


def test_add_process_set_refuses_registered_sets(first, again, split):
    """Horovod's duplicate rule; a removed set's id is reused by the next set."""
    expect(ValueError, lambda: hvd.add_process_set([0]), "already registered", "id 1")
    expect(ValueError, lambda: hvd.add_process_set(list(range(first.n))), "global process set")
    hvd.remove_process_set(again[0])
    assert again[0].process_set_id is None
    reused = hvd.add_process_set([0])
    assert reused.process_set_id == 1, reused
    hvd.remove_process_set(reused)
    hvd.barrier()

