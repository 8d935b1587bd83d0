"""init(process_sets=...) as Horovod scripts use it, on a process whose MPI
is started by hvdlite itself (mpi4py.rc.initialize = False).

Checks, on every rank: MPI started with MPI_THREAD_MULTIPLE by init(); a list
with a repeated set raises ValueError after registering the others, and a
second init() with the corrected list binds to them; sets given by
communicators that name different ranks on different ranks (the two halves
of a split) are registered as their union, communicator sets first; collectives
over every set match NumPy; add_process_set refuses a set already registered
and the global set; at exit hvdlite finalises the MPI it started.
"""
import atexit
import os

import mpi4py

mpi4py.rc.initialize = False  # before mpi4py.MPI is imported anywhere

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hvdlite as hvd  # noqa: E402
from hvdlite.process_sets import get_process_set_ids_and_ranks  # noqa: E402


def expect(exc_type, fn, *words):
    try:
        fn()
    except exc_type as e:
        for w in words:
            assert w in str(e), f"message {str(e)!r} lacks {w!r}"
        return e
    raise AssertionError(f"{fn} did not raise {exc_type.__name__}")


def check_allreduce(ps, r, what):
    got = hvd.allreduce(np.full(3, r + 1, np.int64), op=hvd.Sum, process_set=ps)
    want = np.full(3, sum(k + 1 for k in ps.ranks), np.int64)
    assert np.array_equal(got, want), f"{what}: {got} != {want}"


def main():
    assert not MPI.Is_initialized(), "mpi4py started MPI although rc.initialize is False"
    # MPI is not started yet: the launcher's variables give rank and size.
    env = os.environ
    r = int(env.get("PMI_RANK", env.get("OMPI_COMM_WORLD_RANK", -1)))
    n = int(env.get("PMI_SIZE", env.get("OMPI_COMM_WORLD_SIZE", -1)))
    assert n >= 2 and r >= 0, "run with 2 or more ranks under mpiexec"

    # A repeated entry (the global set, and [0] twice): ValueError, and the
    # engine is up with the other sets registered, in the order listed.
    rest = list(range(1, n))
    first = [hvd.ProcessSet([0]), hvd.ProcessSet(rest if r == 0 else reversed(rest)),
             hvd.ProcessSet(range(n - 1, -1, -1)), hvd.ProcessSet([0])]
    e = expect(ValueError, lambda: hvd.init(process_sets=first), "entry number 2", "global")
    assert isinstance(e, hvd.InvalidArgumentError)
    assert MPI.Is_initialized() and MPI.Query_thread() == MPI.THREAD_MULTIPLE, MPI.Query_thread()
    assert hvd.is_initialized() and hvd.size() == n and hvd.rank() == r
    world = MPI.COMM_WORLD
    assert hvd.global_process_set.mpi_comm is None  # init() was given no communicator
    assert str(first[0]) == "ProcessSet(process_set_id=1, ranks=[0], mpi_comm=None)", str(first[0])
    want = {0: list(range(n)), 1: [0], 2: rest}
    assert get_process_set_ids_and_ranks() == want, get_process_set_ids_and_ranks()
    assert first[0].process_set_id == 1 and first[1].process_set_id == 2
    assert first[2].process_set_id is None and first[3].process_set_id is None

    # Retrying with the corrected list binds to the registered sets.
    again = [hvd.ProcessSet([0]), hvd.ProcessSet(rest)]
    hvd.init(process_sets=again)
    assert [ps.process_set_id for ps in again] == [1, 2]
    assert get_process_set_ids_and_ranks() == want
    for ps in again:
        if ps.included():
            check_allreduce(ps, r, f"set {ps.ranks}")
    hvd.barrier()

    # Communicator sets: each rank names the half of a split it is in; the
    # union (evens, odds) is registered before the list sets.
    half = world.Split(color=r % 2, key=r)
    evens, odds = list(range(0, n, 2)), list(range(1, n, 2))
    mine = hvd.ProcessSet(half)
    assert mine.ranks == (evens if r % 2 == 0 else odds), mine.ranks
    listed = [hvd.ProcessSet([0, 1])] if n > 2 else []  # [0, 1] is the global set at 2 ranks
    extra = [hvd.ProcessSet(range(n))] if r == n - 1 else []  # the global set, on one rank only
    e = None
    try:
        hvd.init(process_sets=[mine] + listed + extra)
    except ValueError as err:
        e = err
    assert (e is not None) == (r == n - 1), f"rank {r}: {e}"
    table = get_process_set_ids_and_ranks()
    new = [ranks for pid, ranks in sorted(table.items()) if pid > 2]
    expected = []
    for ranks in [evens, odds] + [ps.ranks for ps in listed]:
        if ranks not in [[0], rest] + expected:  # registered ones are reused
            expected.append(ranks)
    assert new == expected, table
    assert table[mine.process_set_id] == mine.ranks
    for ps in listed:
        assert table[ps.process_set_id] == [0, 1]
    assert mine.mpi_comm is half
    check_allreduce(mine, r, "communicator set")
    got = hvd.allgather(np.full((1, 2), r, np.int32), process_set=mine)
    assert np.array_equal(got, np.repeat(np.asarray(mine.ranks, np.int32)[:, None], 2, axis=1)), got
    hvd.barrier()

    # add_process_set: Horovod's duplicate rule.
    expect(ValueError, lambda: hvd.add_process_set([0]), "already registered", "id 1")
    expect(ValueError, lambda: hvd.add_process_set(list(range(n))), "global process set")
    # A removed set's id is reused by the next set, as in Horovod.
    hvd.remove_process_set(again[0])
    assert again[0].process_set_id is None
    reused = hvd.add_process_set([0])
    assert reused.process_set_id == 1, reused
    hvd.remove_process_set(reused)
    hvd.barrier()
    half.Free()
    print(f"RANK {r} OK", flush=True)


def finalized_at_exit():
    # Registered before init(), so it runs after hvdlite's exit hook, which
    # must have finalised the MPI that init() started.
    if not MPI.Is_finalized():
        os.write(2, b"MPI was not finalised at exit\n")
        os._exit(1)


if __name__ == "__main__":
    atexit.register(finalized_at_exit)
    main()
