"""The bad-input catalogue (docs/reliability.md), on real ranks.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_reliability.py
runs it at 2 and 4 ranks. Each case is one catalogue entry: it must raise a
clear hvdlite error (whose message says what to do) or give the right result,
and the interpreter must survive. The two large cases (about 5 GB per rank)
run only with HVDLITE_TEST_LARGE=1: tests/test_reliability.py's
test_large_counts runs them at 2 ranks where 12 GB are free (and fails under
HVDLITE_TEST_REQUIRE_ALL=1 where they are not).

Cases already covered by tests/scripts/engine_collectives.py (test_bad_input,
test_mismatches) are not repeated here: complex64/object/bool allreduce,
broadcast root n and -1, alltoall splits not summing / wrong length / not
divisible, reducescatter with fewer rows than ranks, prescale NaN, a name
reused in flight, shape/dtype/op/root/trailing-dimension/kind mismatches.
"""
import os
import tempfile
import time

import numpy as np
import pytest

import hvdlite as hvd
from harness.checks import expect


def still_works(rank, size, what):
    got = hvd.allreduce(np.full(3, rank, np.int32), op=hvd.Sum, name=f"after.{what}")
    assert np.array_equal(got, np.full(3, size * (size - 1) // 2, np.int32)), f"after {what}: {got}"


# ---------------------------------------------------------------- calls

def test_not_initialised():
    """The first case: every call before init() says to call init() first."""
    for fn in [hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_rank,
               hvd.cross_size, hvd.engine_stats, hvd.barrier,
               lambda: hvd.allreduce(np.ones(2)), lambda: hvd.allreduce_async(np.ones(2)),
               lambda: hvd.grouped_allreduce([np.ones(2)]), lambda: hvd.allgather(np.ones(2)),
               lambda: hvd.broadcast(np.ones(2), 0), lambda: hvd.alltoall(np.ones(2)),
               lambda: hvd.reducescatter(np.ones(2)), lambda: hvd.start_timeline("/tmp/x.json"),
               hvd.reset_compression_state, lambda: hvd.add_process_set([0])]:
        expect(hvd.NotInitializedError, fn, "hvdlite.init() first")
    assert not hvd.is_initialized()


def test_non_contiguous(rank, size):
    """Non-contiguous arrays (Fortran order, negative and zero strides, out=)."""
    for a in [np.asfortranarray(np.ones((3, 2))), np.ones(4)[::-1],
              np.broadcast_to(np.ones(1), (4,)), np.ones((4, 4))[1:3, 1:3]]:
        for fn in [hvd.allreduce, hvd.allgather, lambda x: hvd.broadcast(x, 0)]:
            expect(hvd.InvalidArgumentError, lambda: fn(a), "not C-contiguous", "ascontiguousarray")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(4), out=np.ones(8)[::2]),
           "ascontiguousarray")


def test_zero_size(rank, size):
    """Zero-size tensors work and keep their shape."""
    for shape in [(0,), (3, 0), (0, 5)]:
        for op in [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]:
            got = hvd.allreduce(np.ones(shape, np.float32), op=op)
            assert got.shape == shape and got.dtype == np.float32
    for comp in [hvd.Compression.fp16, hvd.Compression.topk(0.5)]:
        assert hvd.allreduce(np.ones(0, np.float32), compression=comp).shape == (0,)
    got = hvd.allgather(np.full((rank % 2, 2), rank, np.int64))  # rank 0 sends no rows
    want = np.concatenate([np.full((k % 2, 2), k, np.int64) for k in range(size)])
    assert np.array_equal(got, want), got
    assert hvd.allgather(np.ones((0, 3))).shape == (0, 3)
    assert hvd.broadcast(np.ones((2, 0)), 0).shape == (2, 0)
    data, splits = hvd.alltoall(np.ones((0, 2), np.float32), splits=[0] * size)
    assert data.shape == (0, 2) and list(splits) == [0] * size
    assert hvd.reducescatter(np.ones((size, 0), np.float32)).shape == (1, 0)
    outs = hvd.grouped_allreduce([np.ones(0), np.ones(2)], op=hvd.Sum)
    assert outs[0].shape == (0,) and np.array_equal(outs[1], np.full(2, float(size)))


def test_unsupported_dtypes(rank, size):
    """Unsupported dtypes: complex, str, datetime, float128, object."""
    for a in [np.ones(2, np.complex128), np.array(["a", "b"]), np.ones(2, np.longdouble),
              np.array(["2020-01-01"], dtype="datetime64[D]"), np.array([None, 1], dtype=object)]:
        for fn in [hvd.allreduce, hvd.allgather, lambda x: hvd.broadcast(x, 0), hvd.alltoall]:
            expect(hvd.UnsupportedDTypeError, lambda: fn(a), "not supported", "use one of")


def test_bool_tensors(rank, size):
    """Bool: refused where it is reduced, moved as is elsewhere."""
    b = np.array([True, False] * size)
    expect(hvd.InvalidArgumentError, lambda: hvd.reducescatter(b), "bool", "cast to uint8")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(b, op=hvd.Max), "bool")
    assert np.array_equal(hvd.broadcast(b, 0), b)
    assert np.array_equal(hvd.allgather(b), np.tile(b, size))
    data, _ = hvd.alltoall(b)
    assert data.dtype == bool and data.shape == b.shape


def test_bad_roots(rank, size):
    """Root_rank not an integer, or outside the process set."""
    expect(hvd.InvalidArgumentError, lambda: hvd.broadcast(np.ones(2), root_rank=0.5), "must be an int")
    expect(hvd.InvalidArgumentError, lambda: hvd.broadcast(np.ones(2), root_rank="zero"), "must be an int")
    expect(hvd.InvalidArgumentError, lambda: hvd.broadcast(np.ones(2), root_rank=size + 5),
           "out of range", f"[0, {size})")
    assert np.array_equal(hvd.broadcast(np.full(2, rank), root_rank=np.int64(size - 1)), np.full(2, size - 1))


def test_bad_splits(rank, size):
    """Alltoall splits negative or fractional."""
    expect(hvd.InvalidArgumentError,
           lambda: hvd.alltoall(np.ones((2, 1)), splits=[-1, 3] + [0] * (size - 2)), "negative")
    expect(hvd.InvalidArgumentError,
           lambda: hvd.alltoall(np.ones((2 * size, 1)), splits=[1.5] * size), "whole row counts")


def test_allgather_ndim(rank, size):
    """Allgather with a different number of dimensions per rank."""
    shape = (2, 2) if rank == 0 else (2, 2, 1)
    expect(hvd.TensorMismatchError, lambda: hvd.allgather(np.ones(shape), name="bad.ndim"),
           "bad.ndim", "number of dimensions", "on rank 0; 3 on rank")
    still_works(rank, size, "ndim")


def test_reducescatter_scalar(rank, size):
    """Reducescatter of a scalar."""
    expect(hvd.InvalidArgumentError, lambda: hvd.reducescatter(np.array(1.0)), "at least one dimension")


def test_bad_scales(rank, size):
    """Prescale/postscale NaN, inf, or not a number."""
    for kw in [dict(postscale_factor=float("nan")), dict(postscale_factor=float("inf")),
               dict(prescale_factor=-float("inf"))]:
        expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), **kw), "finite")
        expect(hvd.InvalidArgumentError, lambda: hvd.reducescatter(np.ones((size, 2)), **kw), "finite")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), prescale_factor="x"),
           "prescale_factor must be a finite number")


def test_topk_ratio(rank, size):
    """Top-k ratio outside (0, 1], in Python and in the engine."""
    for bad in [0.0, -0.5, 1.0001, float("nan"), float("inf"), "a lot"]:
        expect(hvd.InvalidArgumentError, lambda: hvd.Compression.topk(bad), "ratio")
    for bad in [0.0, 2.0]:
        c = hvd.Compression.topk(0.5)
        c.ratio = bad  # bypasses the constructor: the engine still refuses it
        expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(4, np.float32), compression=c),
               "top-k ratio must be in (0, 1]")


def test_topk_dtypes(rank, size):
    """Top-k on integer (and non-float32) tensors; compression with Min/Max."""
    for dtype in [np.int32, np.int64, np.uint8, np.float64, np.float16]:
        expect(hvd.InvalidArgumentError,
               lambda: hvd.allreduce(np.ones(4, dtype), compression=hvd.Compression.topk(0.5)),
               "needs float32", "cast to float32")
    expect(hvd.InvalidArgumentError,
           lambda: hvd.allreduce(np.ones(4, np.float32), op=hvd.Max, compression=hvd.Compression.fp16),
           "Sum and Average")


def test_duplicate_names(rank, size):
    """A name in flight reused by another kind of collective; reuse after completion."""
    if rank == 1:
        time.sleep(0.2)  # rank 0's first submission waits for rank 1
    h = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="dup")
    if rank == 0:
        expect(hvd.InvalidArgumentError, lambda: hvd.allgather(np.ones(2), name="dup"), "in flight")
        expect(hvd.InvalidArgumentError, lambda: hvd.broadcast(np.ones(2), 0, name="dup"), "in flight")
    assert np.array_equal(hvd.synchronize(h), np.full(2, float(size)))
    assert np.array_equal(hvd.allgather(np.ones(1), name="dup"), np.ones(size))  # free again


def test_more_mismatches(rank, size):
    """Same name with different compression/prescale/postscale/kind across ranks."""
    f = np.ones(4, np.float32)
    for name, fn, field in [
        ("mm.comp", lambda: hvd.allreduce(f, name="mm.comp", compression=hvd.Compression.fp16 if rank == 0
                                          else hvd.Compression.none), "compression"),
        ("mm.pre", lambda: hvd.allreduce(f, name="mm.pre", prescale_factor=1.0 + rank), "prescale_factor"),
        ("mm.post", lambda: hvd.allreduce(f, name="mm.post", postscale_factor=1.0 + rank), "postscale_factor"),
        ("mm.bk", lambda: (hvd.broadcast(f, 0, name="mm.bk") if rank == 0
                           else hvd.allgather(f, name="mm.bk")), "operation"),
        ("mm.rs", lambda: hvd.reducescatter(np.ones((size, 2 + rank)), name="mm.rs"), "shape"),
    ]:
        expect(hvd.TensorMismatchError, fn, name, field, "on rank 0;", "Every rank must")
        still_works(rank, size, name)


def test_process_sets(rank, size):
    """Process sets: not registered, removed, unknown id, bad ranks."""
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), process_set=hvd.ProcessSet([0])),
           "not registered", "add_process_set")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), process_set=77),
           "no process set with id 77")
    expect(hvd.InvalidArgumentError, lambda: hvd.add_process_set([0, size]), f"[0, {size})")
    expect(hvd.InvalidArgumentError, lambda: hvd.add_process_set([]), "non-empty")
    expect(hvd.InvalidArgumentError, lambda: hvd.add_process_set([0, 0]), "distinct")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), process_set="evens"),
           "ProcessSet or an int")
    only0 = hvd.add_process_set([0])
    if rank != 0:
        expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), process_set=only0),
               "not a member", "only members")
        expect(hvd.InvalidArgumentError, lambda: hvd.barrier(process_set=only0), "not a member")
    else:
        assert np.array_equal(hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=only0), np.ones(2))
    pid = only0.process_set_id
    hvd.remove_process_set(only0)
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), process_set=pid), "never added, or removed")
    # Horovod's answer: False, nothing removed (the global set, a removed set).
    assert hvd.remove_process_set(0) is False and hvd.remove_process_set(hvd.global_process_set) is False
    assert hvd.remove_process_set(pid) is False and hvd.remove_process_set(only0) is False
    assert np.array_equal(hvd.allreduce(np.ones(2), op=hvd.Sum), np.full(2, size))


def test_wrong_types(rank, size):
    """Wrong argument types: name, compression, handle, out=."""
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), name=5), "name must be a str")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2, np.float32), compression="fp16"),
           "Compression.fp16")
    expect(hvd.InvalidArgumentError, lambda: hvd.synchronize(5), "takes a handle")
    expect(hvd.InvalidArgumentError, lambda: hvd.poll("h"), "takes a handle")
    ro = np.ones(4)
    ro.flags.writeable = False
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(4), out=ro), "read-only")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(4), out=np.ones(4, np.float32)),
           "out= must have the input's shape")
    assert np.array_equal(hvd.allreduce(ro, op=hvd.Sum), np.full(4, float(size)))  # read-only input is fine


def test_after_shutdown(rank, size):
    """A handle pending when this rank shuts down; every call after shutdown."""
    if rank != 0:
        # Rank 0 never submits it, so it is still pending when rank 0 shuts down.
        h = hvd.allreduce_async(np.ones(2), name="never.completes")
    hvd.barrier()
    if rank == 0:
        hvd.shutdown()
    else:
        expect(hvd.HvdliteShutdownError, lambda: hvd.synchronize(h), "rank 0 called hvdlite.shutdown()")
        hvd.shutdown()
    hvd.shutdown()  # twice is fine
    for fn in [lambda: hvd.allreduce(np.ones(2)), lambda: hvd.allgather(np.ones(2)),
               lambda: hvd.broadcast(np.ones(2), 0), hvd.barrier, hvd.rank,
               lambda: hvd.start_timeline("/tmp/x.json"), hvd.engine_stats]:
        expect(hvd.NotInitializedError, fn, "shut down", "hvdlite.init() again")
    hvd.init()
    still_works(rank, size, "re-init")


# ---------------------------------------------------------------- init twice

def test_init_twice(rank, size):
    """init() again: with the same communicator nothing happens, another one is refused."""
    from mpi4py import MPI
    hvd.init()  # COMM_WORLD, again: nothing happens
    hvd.init(MPI.COMM_WORLD.Dup())  # congruent: nothing happens either
    hvd.init(list(range(size)))
    sub = MPI.COMM_WORLD.Split(rank % 2, rank)
    expect(hvd.InvalidArgumentError, lambda: hvd.init(sub), "different communicator", "shutdown()")
    expect(hvd.InvalidArgumentError, lambda: hvd.init([0]), "different communicator")
    expect(hvd.InvalidArgumentError, lambda: hvd.init(list(reversed(range(size)))), "different communicator")
    expect(hvd.InvalidArgumentError, lambda: hvd.init("world"), "different communicator")
    still_works(rank, size, "init twice")
    # After shutdown, another communicator is fine.
    hvd.shutdown()
    hvd.init(sub)
    assert hvd.size() == len(range(rank % 2, size, 2)), hvd.size()
    hvd.shutdown()
    sub.Free()
    hvd.init()


# ---------------------------------------------------------------- fork

def test_fork(rank, size):
    """hvdlite in a child forked after init(): clear errors, never a hang."""
    h = hvd.allreduce_async(np.ones(3), op=hvd.Sum, name="before.fork")
    hvd.synchronize(h)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for fn in [lambda: hvd.allreduce(np.ones(2)), hvd.rank, hvd.barrier,
                       lambda: hvd.synchronize(hvd.allreduce_async(np.ones(2)))]:
                expect(hvd.InvalidArgumentError, fn, "forked after hvdlite.init()", "spawn")
            assert not hvd.is_initialized()
            hvd.shutdown()  # a no-op in the child, never a hang
        except BaseException as e:  # noqa: BLE001 - report anything to the parent
            print(f"fork child of rank {rank}: {type(e).__name__}: {e}", flush=True)
            code = 1
        os._exit(code)  # never run the parent's atexit hooks (MPI) in the child
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child's checks failed"
    still_works(rank, size, "fork")  # the parent's engine is unaffected


# ---------------------------------------------------------------- settings

BAD_SETTINGS = [
    ("HVDLITE_FUSION_THRESHOLD", "abc", "an integer"),
    ("HVDLITE_FUSION_THRESHOLD", "-1", "an integer >= 0"),
    ("HVDLITE_CYCLE_TIME", "-1", "a number"),
    ("HVDLITE_CYCLE_TIME", "5ms", "a number"),
    ("HVDLITE_CACHE_CAPACITY", "1.5", "an integer"),
    ("HVDLITE_TIMEOUT_SECONDS", "nan", "a number"),
    ("HVDLITE_STALL_CHECK_TIME_SECONDS", "soon", "a number"),
    ("HVDLITE_STALL_SHUTDOWN_TIME_SECONDS", "-5", "a number"),
    ("HVDLITE_STALL_CHECK_DISABLE", "maybe", "0 or 1"),
    ("HVDLITE_WAIT_SLEEP_US", "0", "an integer >= 1"),
    ("HVDLITE_WAIT_NEGOTIATION_YIELD_US", "-1", "an integer >= 0"),
    ("HVDLITE_ENGINE_PRIORITY", "low", "auto, normal, batch or idle"),
    ("HVDLITE_ENGINE_AFFINITY", "sideways", "auto, follow or none"),
    ("HVDLITE_SOCKET_IFNAME", "eth0,,eth1", "separated by commas"),
    ("HVDLITE_SOCKET_IFNAME", "an-interface-name-too-long", "at most 15 characters"),
    ("HOROVOD_FUSION_THRESHOLD", "64MB", "an integer"),  # the Horovod alias is checked too
]


def clean_env():
    for key in [k for k in os.environ if k.startswith(("HVDLITE_", "HOROVOD_"))]:
        del os.environ[key]


@pytest.fixture
def restored_environ():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_settings(rank, size, restored_environ):
    """Malformed HVDLITE_* settings and timeline paths fail init() on every rank."""
    hvd.shutdown()  # settings are read by init()
    clean_env()
    count = 0
    for var, value, words in BAD_SETTINGS:
        os.environ[var] = value
        expect(hvd.InvalidArgumentError, hvd.init, f"{var}='{value}' is not valid", words, "Fix or unset")
        assert not hvd.is_initialized()
        del os.environ[var]
        count += 1
    # A setting bad on one rank only: every rank fails init(), none waits.
    if rank == 1:
        os.environ["HVDLITE_CACHE_CAPACITY"] = "lots"
    e = expect(hvd.InvalidArgumentError, hvd.init, "HVDLITE_CACHE_CAPACITY='lots'")
    if rank != 1:
        assert "failed on another rank" in str(e) and "rank 1:" in str(e), e
    clean_env()
    # The timeline file: only rank 0 writes it (no %r), yet all ranks fail.
    os.environ["HVDLITE_TIMELINE"] = "/nonexistent-dir/timeline.json"
    e = expect(hvd.InvalidArgumentError, hvd.init, "timeline: cannot create '/nonexistent-dir/timeline.json'")
    if rank != 0:
        assert "rank 0:" in str(e), e
    os.environ["HVDLITE_TIMELINE"] = "/proc/timeline-%r.json"  # not creatable, even as root
    expect(hvd.InvalidArgumentError, hvd.init, "timeline: cannot create")
    clean_env()
    hvd.init()
    still_works(rank, size, "bad settings")
    # At run time a bad path fails on the calling rank and nothing else changes.
    expect(hvd.InvalidArgumentError, lambda: hvd.start_timeline("/nonexistent-dir/t-%r.json"), "cannot create")
    if rank == 0:  # without %r only rank 0 writes; a directory cannot be the file
        expect(hvd.InvalidArgumentError, lambda: hvd.start_timeline(tempfile.gettempdir()), "cannot create")
    still_works(rank, size, "bad timeline")


# ---------------------------------------------------------------- large counts

BIG = (1 << 31) + 3


def test_large_counts_refused(rank, size):
    """Counts beyond 2^31 that must be refused (the arrays are never touched)."""
    # np.empty maps pages lazily: the engine must refuse before touching them.
    half = np.empty(BIG, np.float16)
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(half, name="big.f16"), "16-bit float", "split")
    expect(hvd.InvalidArgumentError, lambda: hvd.reducescatter(half.reshape(-1, 1)[: BIG - BIG % size]),
           "16-bit float")
    del half
    f32 = np.empty(BIG, np.float32)
    expect(hvd.InvalidArgumentError,
           lambda: hvd.allreduce(f32, compression=hvd.Compression.fp16, name="big.fp16"), "Compression.none")
    del f32
    wide = np.empty(1 << 28, np.float32)  # top-k at ratio 1 puts 2^31 bytes on the wire
    expect(hvd.InvalidArgumentError,
           lambda: hvd.allreduce(wide, compression=hvd.Compression.topk(1.0), name="big.topk"),
           "more than 2^31-1 bytes", "lower the ratio")
    del wide
    still_works(rank, size, "large refusals")


LARGE = pytest.mark.skipif(os.environ.get("HVDLITE_TEST_LARGE") != "1",
                           reason="about 5 GB per rank: set HVDLITE_TEST_LARGE=1")


@LARGE
def test_large_int8_allreduce(rank, size):
    """An int8 allreduce of 2^31+3 elements (~5 GB per rank at the peak)."""
    x = np.zeros(BIG, np.int8)
    # Marks around the 2^30-element chunk borders and in the last, short chunk.
    marks = [0, (1 << 30) - 1, 1 << 30, (1 << 31) - 1, 1 << 31, BIG - 1]
    for i, m in enumerate(marks):
        x[m] = i + 1 + rank
    t0 = time.time()
    got = hvd.allreduce(x, op=hvd.Sum, name="big.int8")
    took = time.time() - t0
    assert got.shape == (BIG,) and got.dtype == np.int8
    for i, m in enumerate(marks):
        want = sum(i + 1 + k for k in range(size))
        assert got[m] == want, (m, got[m], want)
    got[marks] = 0
    assert not got.any(), "values appeared outside the marks"
    print(f"RANK {rank} LARGE allreduce of {BIG} int8 took {took:.1f} s", flush=True)


@LARGE
def test_large_uint8_broadcast(rank, size):
    """A uint8 broadcast of 2^31+3 elements."""
    y = np.empty(BIG, np.uint8) if rank != 0 else np.full(BIG, 7, np.uint8)
    if rank == 0:
        y[-3:] = [1, 2, 3]
    got = hvd.broadcast(y, root_rank=0, name="big.bcast")
    assert got[0] == 7 and list(got[-3:]) == [1, 2, 3] and got[(1 << 31) - 5] == 7
    assert np.count_nonzero(got != 7) == 3

