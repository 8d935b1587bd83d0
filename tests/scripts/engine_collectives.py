"""Every collective x dtype x op against a NumPy reference, on every rank.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_engine.py runs
it at 2 and 4 ranks, reductions through shared memory and through MPI. Each rank can rebuild every other rank's input from (seed,
rank), so the reference is computed locally and compared exactly: values are
small integers times 1/4, so float sums are exact in any order.
"""
import itertools
import os

import numpy as np

import hvdlite as hvd
from harness.checks import check_equal, expect
from harness.collective_reference import reduce_ref

INT_TYPES = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64]
FLOAT_TYPES = [np.float16, np.float32, np.float64]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def data(rank, dtype, shape, salt):
    rng = np.random.default_rng(1000 * rank + salt)
    if np.dtype(dtype).kind == "u":
        return np.asarray(rng.integers(0, 4, size=shape)).astype(dtype)
    if np.dtype(dtype).kind == "i":
        return np.asarray(rng.integers(-3, 4, size=shape)).astype(dtype)
    return np.asarray(rng.integers(-8, 9, size=shape) / 4.0).astype(dtype)


def engine_threads():
    return [t for t in os.listdir("/proc/self/task")
            if open(f"/proc/self/task/{t}/comm").read().strip() == "hvdlite-engine"]


def test_not_initialised_before_init():
    """The first case: nothing has initialised hvdlite yet."""
    assert not engine_threads(), "an engine thread exists before init()"
    expect(hvd.NotInitializedError, hvd.rank, "init")
    expect(hvd.NotInitializedError, lambda: hvd.allreduce(np.ones(2)), "init")
    expect(hvd.NotInitializedError, hvd.is_homogeneous, "init")


def test_init_starts_one_engine_thread(rank, size):
    tasks = engine_threads()
    assert len(tasks) == 1, f"expected one native engine thread, found {tasks}"
    assert hvd.mpi_threads_supported()
    # The layout, from MPI's processor names (one per host), hosts in order of first rank.
    from mpi4py import MPI
    names = MPI.COMM_WORLD.allgather(MPI.Get_processor_name())
    hosts = list(dict.fromkeys(names))
    mine = [r for r in range(size) if names[r] == names[rank]]
    per_host = {h: names.count(h) for h in hosts}
    assert hvd.is_homogeneous() == (len(set(per_host.values())) == 1)
    assert (hvd.local_size(), hvd.local_rank()) == (len(mine), mine.index(rank))
    if hvd.is_homogeneous():
        assert (hvd.cross_size(), hvd.cross_rank()) == (len(hosts), hosts.index(names[rank]))
    hvd.init()  # a second init with the same communicator is a no-op
    assert engine_threads() == tasks


def test_allreduce(rank, size):
    salt = 0
    for dtype, op in itertools.product(INT_TYPES + FLOAT_TYPES, OPS):
        salt += 1
        for shape in [(17,), (3, 4, 5), ()]:
            mine = data(rank, dtype, shape, salt)
            got = hvd.allreduce(mine, op=op)
            want = reduce_ref([data(k, dtype, shape, salt) for k in range(size)], op, dtype, size)
            check_equal(got, want, f"allreduce {np.dtype(dtype).name} op={op} shape={shape}")
            assert np.array_equal(mine, data(rank, dtype, shape, salt)), "allreduce modified its input"
    # Scaling factors (exact powers of two).
    for dtype in [np.int32, np.float16, np.float32, np.float64]:
        salt += 1
        mine = data(rank, dtype, (9,), salt)
        got = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
        want = reduce_ref([data(k, dtype, (9,), salt) for k in range(size)], hvd.Sum, dtype, size, 2.0, 0.5)
        check_equal(got, want, f"allreduce scaled {np.dtype(dtype).name}")
    # float16: no overflow where float32 accumulation would not overflow.
    big = np.full(5, 40000, dtype=np.float16)
    check_equal(hvd.allreduce(big, op=hvd.Average), big, "float16 average of 40000")
    # float16: one rounding at the end, as summing in float32 and casting.
    fine = np.array([2048.0 if rank == 0 else 1.0], dtype=np.float16)
    want = np.array([2048.0 + (size - 1)], dtype=np.float32).astype(np.float16)
    check_equal(hvd.allreduce(fine, op=hvd.Sum), want, "float16 sum rounding")
    # Zero-size tensors.
    for shape in [(0,), (0, 3)]:
        check_equal(hvd.allreduce(np.zeros(shape, np.float32)), np.zeros(shape, np.float32), "empty")
    # Grouped.
    xs = [data(rank, np.float32, (i + 1, 2), 500 + i) for i in range(5)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grouped")
    for i, got in enumerate(outs):
        want = reduce_ref([data(k, np.float32, (i + 1, 2), 500 + i) for k in range(size)], hvd.Sum, np.float32, size)
        check_equal(got, want, f"grouped_allreduce[{i}]")


def test_allgather(rank, size):
    for i, dtype in enumerate(INT_TYPES + FLOAT_TYPES + [np.bool_]):
        for trailing in [(), (3, 2)]:
            shape_of = lambda k: (k + 1,) + trailing
            mine = data(rank, dtype, shape_of(rank), 50 + i) if dtype is not np.bool_ else (np.arange(rank + 1) % 2 == 0).reshape((rank + 1,) + (1,) * len(trailing)) * np.ones(shape_of(rank), bool)
            got = hvd.allgather(mine)
            parts = []
            for k in range(size):
                parts.append(data(k, dtype, shape_of(k), 50 + i) if dtype is not np.bool_
                             else (np.arange(k + 1) % 2 == 0).reshape((k + 1,) + (1,) * len(trailing)) * np.ones(shape_of(k), bool))
            check_equal(got, np.concatenate(parts), f"allgather {np.dtype(dtype).name} {trailing}")
    # A rank with zero rows.
    rows = 0 if rank == 0 else 2
    got = hvd.allgather(np.full((rows, 2), rank, np.int64))
    want = np.concatenate([np.full((0 if k == 0 else 2, 2), k, np.int64) for k in range(size)])
    check_equal(got, want, "allgather with an empty rank")
    # Large and uneven (the hierarchical allgather between hosts, which puts
    # blocks back in rank order), one rank empty.
    rows_of = lambda k: 0 if k == 1 else 300 * (k + 1)  # noqa: E731
    got = hvd.allgather(data(rank, np.float32, (rows_of(rank), 5), 77), name="allgather.large")
    want = np.concatenate([data(k, np.float32, (rows_of(k), 5), 77) for k in range(size)])
    check_equal(got, want, "large uneven allgather")


def test_broadcast(rank, size):
    for i, dtype in enumerate(INT_TYPES + FLOAT_TYPES + [np.bool_]):
        for root in range(size):
            mine = data(rank, dtype, (4, 3), 70 + i) if dtype is not np.bool_ else np.full((4, 3), rank % 2 == 0)
            got = hvd.broadcast(mine, root_rank=root)
            want = data(root, dtype, (4, 3), 70 + i) if dtype is not np.bool_ else np.full((4, 3), root % 2 == 0)
            check_equal(got, want, f"broadcast {np.dtype(dtype).name} root={root}")


def splits_of(sender, n):
    rng = np.random.default_rng(900 + sender)
    return rng.integers(0, 4, size=n)


def test_alltoall(rank, size):
    for i, dtype in enumerate(INT_TYPES + FLOAT_TYPES):
        # Explicit, uneven splits (some zero).
        def tensor_of(k):
            return data(k, dtype, (int(splits_of(k, size).sum()), 2), 80 + i)
        got, recv = hvd.alltoall(tensor_of(rank), splits=splits_of(rank, size))
        pieces, want_recv = [], []
        for k in range(size):
            s = splits_of(k, size)
            start = int(s[:rank].sum())
            pieces.append(tensor_of(k)[start:start + s[rank]])
            want_recv.append(s[rank])
        check_equal(got, np.concatenate(pieces), f"alltoall {np.dtype(dtype).name}")
        check_equal(recv, np.asarray(want_recv, np.int64), "alltoall received splits")
    # Default: equal split.
    mine = np.arange(2 * size, dtype=np.float32) + 100 * rank
    got, recv = hvd.alltoall(mine)
    want = np.concatenate([np.arange(2 * size, dtype=np.float32)[2 * rank:2 * rank + 2] + 100 * k for k in range(size)])
    check_equal(got, want, "alltoall default splits")
    check_equal(recv, np.full(size, 2, np.int64), "alltoall default received splits")


def test_reducescatter(rank, size):
    rows = 2 * size + 1  # uneven: the first rank gets one row more
    for i, (dtype, op) in enumerate(itertools.product(INT_TYPES + FLOAT_TYPES, OPS)):
        mine = data(rank, dtype, (rows, 3), 300 + i)
        got = hvd.reducescatter(mine, op=op)
        full = reduce_ref([data(k, dtype, (rows, 3), 300 + i) for k in range(size)], op, dtype, size)
        counts = [rows // size + (k < rows % size) for k in range(size)]
        start = sum(counts[:rank])
        check_equal(got, full[start:start + counts[rank]], f"reducescatter {np.dtype(dtype).name} op={op}")
    # Large (two levels between hosts, blocks regrouped by local rank).
    rows = 300 * size + 1
    for i, (dtype, op) in enumerate(itertools.product([np.float32, np.int32], OPS)):
        mine = data(rank, dtype, (rows, 4), 600 + i)
        got = hvd.reducescatter(mine, op=op, name=f"reducescatter.large.{i}")
        full = reduce_ref([data(k, dtype, (rows, 4), 600 + i) for k in range(size)], op, dtype, size)
        counts = [rows // size + (k < rows % size) for k in range(size)]
        start = sum(counts[:rank])
        check_equal(got, full[start:start + counts[rank]], f"large reducescatter {np.dtype(dtype).name} op={op}")


def test_many_async_random_order(rank, size):
    count = 200
    rng_common = np.random.default_rng(7)
    shapes = [tuple(rng_common.integers(1, 6, size=rng_common.integers(1, 3))) for _ in range(count)]
    order = np.random.default_rng(100 + rank).permutation(count)
    inputs = {i: data(rank, np.float32, shapes[i], 2000 + i) for i in range(count)}
    handles = {i: hvd.allreduce_async(inputs[i], op=hvd.Sum, name=f"async.{i}") for i in order}
    for i in np.random.default_rng(200 + rank).permutation(count):
        got = hvd.synchronize(handles[i])
        want = reduce_ref([data(k, np.float32, shapes[i], 2000 + i) for k in range(size)], hvd.Sum, np.float32, size)
        check_equal(got, want, f"async tensor {i}")


def test_lagging_ranks(rank, size):
    """Ranks submit the same tensors at different times (rank k waits 30k ms):
    through shared memory the early ranks copy ahead into their rings and
    sleep until the late ones publish. Sizes span one chunk, the ring
    (16 x 128 KB) and several rings, in place and not, Sum and Average."""
    import time
    sizes = [5, 40000, 1 << 19, 3 << 20]  # float32: 20 B .. 12 MB
    for step in range(3):
        time.sleep(0.03 * ((rank + step) % size))
        handles = []
        for i, count in enumerate(sizes):
            x = data(rank, np.float32, (count,), 3000 + 10 * step + i)
            op = hvd.Sum if i % 2 == 0 else hvd.Average
            out = x if step == 1 else None  # in place on one step
            handles.append((hvd.allreduce_async(x, op=op, name=f"lag.{i}", out=out), count, op, i))
        for h, count, op, i in handles:
            want = reduce_ref([data(k, np.float32, (count,), 3000 + 10 * step + i) for k in range(size)],
                              op, np.float32, size)
            check_equal(hvd.synchronize(h), want, f"lagging ranks, step {step}, {count} floats")


def engine_cpu_seconds():
    """CPU time (user + system) of this process's engine thread so far."""
    (task,) = engine_threads()
    fields = open(f"/proc/self/task/{task}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_waiting_for_a_late_peer(rank, size):
    """The last rank submits 1.5 s after the others (0.2 s on one host), whose engines wait in
    negotiation rounds meanwhile. Between hosts of one rank each those waits
    yield for at most 1 ms, then nap, and nap from the spin's end while the
    peers stay behind (WaitPolicy::ForNegotiation, MpiTransport::WaitNegotiation):
    the early engines take a small part of a core, where yielding between
    tests would take all of an idle core.
    On one host (shared memory or MPI), between hosts of several ranks (whose
    waits yield, as the collectives' do), and in sanitized builds (whose
    instrumented rounds cost several times the CPU), the result is checked."""
    import time
    spans_hosts = not hvd.is_homogeneous() or hvd.cross_size() > 1
    host_each = spans_hosts and hvd.local_size() == 1
    late = 1.5 if spans_hosts else 0.2
    check_equal(hvd.allreduce(np.ones(3, np.float32), op=hvd.Sum, name="late.before"),
                np.full(3, size, np.float32), "allreduce before the wait")
    cpu, start = engine_cpu_seconds(), time.monotonic()
    if rank == size - 1:
        time.sleep(late)
    got = hvd.allreduce(np.full(5, rank + 1, np.float32), op=hvd.Sum, name="late.peer")
    cpu, waited = engine_cpu_seconds() - cpu, time.monotonic() - start
    check_equal(got, np.full(5, size * (size + 1) / 2, np.float32), "allreduce after a late peer")
    if spans_hosts and rank != size - 1:
        assert waited >= late * 0.9, f"the allreduce completed after {waited:.2f} s, before the late rank"
        assert not host_each or os.environ.get("HVDLITE_TEST_SANITIZED") == "1" or cpu < 0.3 * waited, (
            f"the engine took {cpu:.2f} s of CPU in {waited:.2f} s waiting for a late peer between "
            "hosts: negotiation's waits should nap there (HVDLITE_WAIT_NEGOTIATION_YIELD_US)")


def test_mismatches(rank, size):
    f32 = np.ones(4, np.float32)
    cases = [
        ("mm.shape", lambda: hvd.allreduce(np.ones(4 + (rank == 1), np.float32), name="mm.shape"), "shape"),
        ("mm.dtype", lambda: hvd.allreduce(np.ones(4, np.float32 if rank != 1 else np.float64), name="mm.dtype"), "dtype"),
        ("mm.op", lambda: hvd.allreduce(f32, op=hvd.Sum if rank != 1 else hvd.Max, name="mm.op"), "reduce op"),
        ("mm.root", lambda: hvd.broadcast(f32, root_rank=0 if rank != 1 else 1, name="mm.root"), "root rank"),
        ("mm.trailing", lambda: hvd.allgather(np.ones((2, 3 + (rank == 1)), np.float32), name="mm.trailing"), "trailing"),
        ("mm.kind", lambda: (hvd.allreduce(f32, name="mm.kind") if rank != 1 else hvd.allgather(f32, name="mm.kind")), "operation"),
    ]
    for name, fn, field in cases:
        expect(hvd.TensorMismatchError, fn, name, field, "rank 1")
        # The next collective still works.
        check_equal(hvd.allreduce(np.full(3, rank, np.int32), op=hvd.Sum), np.full(3, size * (size - 1) // 2, np.int32), f"after {name}")


def test_handles(rank, size):
    import threading
    import time
    # poll is False while rank 1 has not submitted yet, then True.
    if rank == 1:
        time.sleep(0.5)
    h = hvd.allreduce_async(np.ones(3, np.float32), op=hvd.Sum, name="poll.me")
    if rank == 0:
        assert hvd.poll(h) is False, "poll should be False before every rank submitted"
    check_equal(hvd.synchronize(h), np.full(3, size, np.float32), "polled result")
    assert hvd.poll(h) is True
    # Synchronize of a failed handle raises.
    bad = hvd.allreduce_async(np.ones(2 + (rank == 1), np.float32), name="fails.async")
    expect(hvd.TensorMismatchError, lambda: hvd.synchronize(bad), "fails.async")
    # Waiting from another thread while this thread submits more work.
    if rank == 1:
        time.sleep(0.3)
    slow = hvd.allreduce_async(np.full(2, rank, np.float64), op=hvd.Sum, name="waited.elsewhere")
    result = {}
    t = threading.Thread(target=lambda: result.update(v=hvd.synchronize(slow)))
    t.start()
    for i in range(20):
        check_equal(hvd.allreduce(np.full(2, i, np.int64), op=hvd.Sum, name=f"meanwhile.{i}"),
                    np.full(2, i * size, np.int64), "meanwhile")
    t.join(30)
    assert not t.is_alive()
    check_equal(result["v"], np.full(2, size * (size - 1) / 2, np.float64), "waited in a thread")


def test_completion_callback(rank, size):
    """hvd_on_completion (the C API's notification for non-blocking front ends):
    exactly one call per handle, from the engine thread for pending work, at
    once for completed work, for failures too; -1 for unknown handles."""
    import threading
    import time
    from hvdlite._binding import ffi, lib
    calls, lock, done = [], threading.Lock(), threading.Event()

    @ffi.callback("void(int64_t, void *)")
    def notify(handle, arg):
        with lock:
            calls.append((handle, int(ffi.cast("intptr_t", arg)), threading.current_thread().name))
            if len(calls) == 3:
                done.set()

    if rank == 1:
        time.sleep(0.3)  # rank 0 registers while its handle is still pending
    pending = hvd.allreduce_async(np.ones(3, np.float32), op=hvd.Sum, name="notify.pending")
    assert lib.hvd_on_completion(pending._id, notify, ffi.cast("void *", 11)) == 0
    failing = hvd.allreduce_async(np.ones(2 + (rank == 1), np.float32), name="notify.failing")
    assert lib.hvd_on_completion(failing._id, notify, ffi.cast("void *", 12)) == 0
    check_equal(hvd.synchronize(pending), np.full(3, size, np.float32), "notified allreduce")
    expect(hvd.TensorMismatchError, lambda: hvd.synchronize(failing), "notify.failing")
    finished = hvd.allreduce_async(np.ones(1, np.float32), name="notify.finished")
    while not hvd.poll(finished):
        time.sleep(0.01)
    main_thread = threading.current_thread().name
    assert lib.hvd_on_completion(finished._id, notify, ffi.cast("void *", 13)) == 0
    with lock:  # already completed: called at once, on this thread
        assert calls[-1] == (finished._id, 13, main_thread), calls
    hvd.synchronize(finished)
    assert done.wait(30), calls
    time.sleep(0.1)  # a second call for any handle would show up here
    assert sorted(c[1] for c in calls) == [11, 12, 13], calls
    assert len({c[0] for c in calls}) == 3, calls
    assert lib.hvd_on_completion(10 ** 9, notify, ffi.NULL) == -1
    assert "unknown" in ffi.string(lib.hvd_last_error()).decode()


def test_bad_input(rank, size):
    import time
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones((4, 4), np.float32)[:, ::2]), "contiguous")
    expect(hvd.UnsupportedDTypeError, lambda: hvd.allreduce(np.ones(3, np.complex64)), "complex64")
    expect(hvd.UnsupportedDTypeError, lambda: hvd.allgather(np.array([object()] * 2)), "object")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(3, bool)), "bool")
    expect(hvd.InvalidArgumentError, lambda: hvd.broadcast(np.ones(3), root_rank=size), "root_rank", str(size))
    expect(hvd.InvalidArgumentError, lambda: hvd.broadcast(np.ones(3), root_rank=-1), "root_rank")
    expect(hvd.InvalidArgumentError, lambda: hvd.alltoall(np.ones((5, 2)), splits=[1] * size), "sum")
    expect(hvd.InvalidArgumentError, lambda: hvd.alltoall(np.ones((5, 2)), splits=[5] + [0] * size), "entries")
    expect(hvd.InvalidArgumentError, lambda: hvd.alltoall(np.ones((2 * size + 1, 2))), "divisible")
    expect(hvd.InvalidArgumentError, lambda: hvd.reducescatter(np.ones((size - 1, 2))), "smaller")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), op=42), "op")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce([1.0, 2.0]), "numpy.ndarray")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), prescale_factor=float("nan")), "finite")
    # A name reused while in flight.
    if rank == 1:
        time.sleep(0.3)
    first = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="inflight")
    if rank == 0:
        expect(hvd.InvalidArgumentError, lambda: hvd.allreduce_async(np.ones(2), name="inflight"), "inflight", "in flight")
    check_equal(hvd.synchronize(first), np.full(2, float(size)), "in-flight original")


def test_process_sets(rank, size):
    evens = hvd.add_process_set([k for k in range(size) if k % 2 == 0])
    odds = hvd.add_process_set(hvd.ProcessSet([k for k in range(size) if k % 2 == 1]))
    mine, other = (evens, odds) if rank % 2 == 0 else (odds, evens)
    got = hvd.allreduce(np.full(3, rank, np.int64), op=hvd.Sum, process_set=mine)
    check_equal(got, np.full(3, sum(mine.ranks), np.int64), "process set allreduce")
    assert mine.rank() == mine.ranks.index(rank) and mine.size() == len(mine.ranks) and mine.included()
    got = hvd.allgather(np.full((1,), rank, np.int32), process_set=mine)
    check_equal(got, np.asarray(mine.ranks, np.int32), "process set allgather")
    root = mine.ranks[-1]  # a rank of the job, as in Horovod
    got = hvd.broadcast(np.full(2, rank, np.int32), root_rank=root, process_set=mine)
    check_equal(got, np.full(2, root, np.int32), "process set broadcast from a global root")
    expect(hvd.InvalidArgumentError, lambda: hvd.broadcast(np.ones(2), root_rank=other.ranks[0], process_set=mine),
           "not a member")
    out = np.empty(3, np.int64)
    res = hvd.allreduce(np.full(3, rank, np.int64), op=hvd.Sum, out=out)
    assert res is out and np.array_equal(out, np.full(3, size * (size - 1) // 2, np.int64)), "out="
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(3), out=np.empty(4)), "out=")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), process_set=other), "not a member")
    hvd.remove_process_set(odds)
    hvd.remove_process_set(evens)
    # Horovod's ProcessSet(mpi4py communicator): the members are the
    # communicator's COMM_WORLD ranks, and the set keeps the communicator.
    # Members pass the communicator, the others the same ranks as a list.
    from mpi4py import MPI
    even_ranks = [k for k in range(size) if k % 2 == 0]
    world = MPI.COMM_WORLD.Get_group()
    evens_group = world.Incl(even_ranks)
    evens_comm = MPI.COMM_WORLD.Create_group(evens_group)
    if rank % 2 == 0:
        ps = hvd.add_process_set(hvd.ProcessSet(evens_comm))
        assert ps.mpi_comm is evens_comm
    else:
        ps = hvd.add_process_set(hvd.ProcessSet(even_ranks))
    assert ps.ranks == even_ranks, ps.ranks
    if rank % 2 == 0:
        got = hvd.allreduce(np.full(2, rank, np.int64), op=hvd.Sum, process_set=ps)
        assert np.array_equal(got, np.full(2, sum(even_ranks))), got
    hvd.remove_process_set(ps)
    if evens_comm != MPI.COMM_NULL:
        evens_comm.Free()
    evens_group.Free()
    world.Free()
    expect(hvd.InvalidArgumentError, lambda: hvd.ProcessSet("0,1"), "ranks")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), process_set=evens), "not registered")


def test_wire_is_the_one_asked_for(rank, size):
    """Shared memory on one host unless HVDLITE_SHM_ALLREDUCE=0, MPI then.
    The ring when asked for, and between hosts with one rank on each or
    hierarchically (the default with the same number of ranks on each host);
    never by default on one host."""
    for count in (5, 40000):
        got = hvd.allreduce(np.full(count, rank + 1, np.float32), op=hvd.Sum, name=f"wire.{count}")
        check_equal(got, np.full(count, size * (size + 1) / 2, np.float32), f"allreduce of {count}")
    stats = hvd.engine_stats()
    shm, ring = stats["shm_collectives"], stats["ring_collectives"]
    hosts = hvd.cross_size() if hvd.is_homogeneous() else 2
    if os.environ.get("HVDLITE_SHM_ALLREDUCE") == "0" or hosts > 1:
        assert shm == 0, f"{shm} reductions went through shared memory (turned off, or several hosts)"
    else:
        assert shm > 0, "no reduction went through shared memory on one host"
    before = stats["hierarchical_allgathers"], stats["hierarchical_reducescatters"]
    hvd.allgather(np.full((20000, 1), rank, np.float32), name="wire.allgather")
    hvd.reducescatter(np.full((20000, 1), rank, np.float32), name="wire.reducescatter")
    after = hvd.engine_stats()
    gathered = after["hierarchical_allgathers"] - before[0]
    scattered = after["hierarchical_reducescatters"] - before[1]
    ring_setting = os.environ.get("HVDLITE_RING_ALLREDUCE", "auto")
    hierarchical = os.environ.get("HVDLITE_HIERARCHICAL_ALLREDUCE", "auto") != "0" and hvd.is_homogeneous()
    ring_expected = ring_setting == "1" or (
        ring_setting != "0" and hosts > 1 and (hvd.local_size() == 1 or hierarchical))
    if ring_expected:
        assert ring > 0, "no reduction went around the ring"
    else:
        assert ring == 0, f"{ring} reductions went around the ring"
    # The ring's own sockets when asked for, on the flat ring (the
    # hierarchical ring's middle phase stays on MPI).
    flat = ring_expected and not (hosts > 1 and hvd.local_size() > 1 and hierarchical)
    sockets = stats["socket_ring_collectives"]
    if flat and os.environ.get("HVDLITE_RING_WIRE", "socket") == "socket":
        assert sockets == ring, f"{sockets} of {ring} ring reductions went over the ring's sockets"
    else:
        assert sockets == 0, f"{sockets} reductions went over the ring's sockets"
    # Reducescatters in the host, then across; allgathers across hosts by
    # local rank, then in the host: wherever the allreduce is hierarchical
    # (allgathers unless HVDLITE_HIERARCHICAL_ALLGATHER=0).
    two_level = hosts > 1 and hvd.local_size() > 1 and hierarchical and ring_setting != "0"
    assert (scattered == 1) == two_level, (scattered, two_level)
    two_level = two_level and os.environ.get("HVDLITE_HIERARCHICAL_ALLGATHER", "auto") != "0"
    assert (gathered == 1) == two_level, (gathered, two_level)


def normal(rank, salt, count):
    return np.random.default_rng(7000 + 1000 * rank + salt).standard_normal(count).astype(np.float32)


def topk_dense(x, ratio):
    """Top-k of one segment as the engine selects it (segments under 1024
    elements go whole: csrc/compressors/topk.h)."""
    k = x.size if x.size < 1024 else max(1, int(np.ceil(ratio * x.size)))
    out = np.zeros_like(x)
    keep = np.argsort(-np.abs(x), kind="stable")[:k]
    out[keep] = x[keep]
    return out


def compression_layout(size):
    """Which ranks share a host, in host order, and whether compression runs
    between hosts only (hierarchical: several hosts, the same number of ranks
    on each, more than one)."""
    hosts = hvd.allgather(np.array([hvd.cross_rank() if hvd.is_homogeneous() else -1]), name="layout.hosts")
    groups = [[r for r in range(size) if hosts[r] == h] for h in sorted(set(hosts.tolist()))]
    two_level = (hvd.is_homogeneous() and hvd.cross_size() > 1 and hvd.local_size() > 1
                 and os.environ.get("HVDLITE_HIERARCHICAL_ALLREDUCE", "auto") != "0")
    return groups, two_level


def test_compression_between_hosts(rank, size):
    """fp16 and top-k: with several ranks per host the sum inside a host is
    exact and only the host's sum is compressed, block by block (each local
    rank one block); otherwise every rank compresses its own tensor."""
    groups, two_level = compression_layout(size)
    count, ratio = 20000, 0.01
    xs = [normal(k, 1, count) for k in range(size)]
    local = len(groups[0])
    blocks = [count // local + (b < count % local) for b in range(local)]
    edges = np.cumsum([0] + blocks)
    mine = groups[[rank in g for g in groups].index(True)].index(rank)

    before = hvd.engine_stats()
    got16 = hvd.allreduce(xs[rank], op=hvd.Sum, compression=hvd.Compression.fp16, name="between.fp16")
    mid = hvd.engine_stats()
    gotk = hvd.allreduce(xs[rank], op=hvd.Sum, name="between.topk",
                         compression=hvd.Compression.topk(ratio, error_feedback=False))
    after = hvd.engine_stats()
    fp16_bytes = mid["wire_bytes_fp16"] - before["wire_bytes_fp16"]
    topk_bytes = after["wire_bytes_topk"] - mid["wire_bytes_topk"]
    if two_level:
        host_sums = [sum(xs[k] for k in g) for g in groups]  # float32, two ranks: one rounding
        halves = [h.astype(np.float16).astype(np.float32) for h in host_sums]
        want16 = sum(halves).astype(np.float16).astype(np.float32) if len(halves) == 2 else None
        wantk = np.zeros(count, np.float32)
        for lo, hi in zip(edges[:-1], edges[1:]):
            for h in host_sums:
                wantk[lo:hi] += topk_dense(h[lo:hi], ratio)
        my_block = blocks[mine]
        assert fp16_bytes == 2 * my_block, (fp16_bytes, my_block)
        assert topk_bytes == 8 * max(1, int(np.ceil(ratio * my_block))), topk_bytes
    else:
        want16 = None
        wantk = sum(topk_dense(x, ratio).astype(np.float64) for x in xs)
        assert fp16_bytes == 2 * count and topk_bytes == 8 * int(np.ceil(ratio * count))
    exact = sum(x.astype(np.float64) for x in xs)
    bound = (size + 1) * 2.0 ** -11 * sum(np.abs(x.astype(np.float64)) for x in xs) + 1e-6
    assert np.all(np.abs(got16 - exact) <= bound), "fp16 error beyond rounding"
    if want16 is not None:
        check_equal(got16, want16, "fp16 between hosts: exact host sums, one fp16 sum across")
    np.testing.assert_allclose(gotk, wantk, rtol=1e-5, atol=1e-5)


def test_shutdown_then_init_again(rank, size):
    """After shutdown the user's own MPI still works, and init() works again."""
    hvd.shutdown()
    expect(hvd.NotInitializedError, lambda: hvd.allreduce(np.ones(2)), "shut down")
    from mpi4py import MPI
    assert MPI.COMM_WORLD.allreduce(rank) == size * (size - 1) // 2
    hvd.init()
    check_equal(hvd.allreduce(np.ones(2, np.float32), op=hvd.Sum), np.full(2, size, np.float32), "after re-init")

