"""Going on without a lost host (hvdlite.abandon, issue 39) on the engine's
paths between hosts: the hierarchical allreduce, allgather and reducescatter,
and Adasum.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_abandon.py
runs it at 6 ranks on 3 hosts of 2 ranks (tests/harness/fake_hosts.py), with
the ring's threshold lowered so that the checks' tensors take the
hierarchical paths, in several pieces. Its cases are one scenario, in order:

1. every rank starts an engine on COMM_WORLD; hierarchical collectives match
   NumPy; Adasum is refused on 6 ranks and matches its reference on a
   process set of 4;
2. the last host's two ranks hang while the others submit a hierarchical
   allreduce they never submit; a watcher abandons each survivor's engine
   and the allreduce raises HvdliteShutdownError at once; the lost host's
   ranks abandon their own engines;
3. the survivors (2 hosts of 2 ranks) start a new engine on their
   communicator: the hierarchical allreduce, allgather and reducescatter
   run again (the engine's statistics say so) and match NumPy, and so does
   Adasum, on the whole new world (4 ranks now) and on a process set;
4. the engine shuts down and MPI finalises on every rank (the job's exit).
"""
import re
import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

import hvdlite as hvd
from adasum_reference import adasum_tree
from hvdlite import HvdliteShutdownError

WORLD = MPI.COMM_WORLD
ME = WORLD.Get_rank()
N = WORLD.Get_size()
PER_HOST = 2
LOST = [r for r in range(N) if r // PER_HOST == N // PER_HOST - 1]   # the last host
SURVIVORS = [r for r in range(N) if r not in LOST]
REASON = f"host of ranks {LOST} lost (test)"
EVICTED = "this rank was evicted (test)"
WATCHER_DELAY_S = 0.3
HANG_S = 1.5
# Above HVDLITE_RING_THRESHOLD (tests/test_abandon.py): the hierarchical paths.
LARGE = 20000
# max |got - want| / max |want| for Adasum (tests/scripts/engine_adasum.py).
ADASUM_TOL = {np.dtype(np.float64): 1e-13, np.dtype(np.float32): 1e-6, np.dtype(np.float16): 1e-3}

state = {}


def values(r, n, salt, dtype=np.float32):
    """Rank r's input: small integers, so sums are exact in every dtype used."""
    rng = np.random.default_rng(1000 * salt + r)
    return rng.integers(-8, 9, n).astype(dtype)


def gradient(r, n, salt, dtype):
    """Rank r's Adasum input: a direction every rank shares plus its own,
    scaled by r + 1, so that the coefficients are far from 1."""
    shared = np.random.default_rng(salt).standard_normal(n)
    own = np.random.default_rng(7919 * salt + r).standard_normal(n)
    return ((r + 1) * (shared + own)).astype(dtype)


def check_adasum_result(got, want, dtype, what):
    dt = np.dtype(dtype)
    assert got.dtype == dt, f"{what}: dtype {got.dtype} != {dt}"
    err = float(np.max(np.abs(got.astype(np.float64) - want))) / float(np.max(np.abs(want)))
    assert err <= ADASUM_TOL[dt], f"{what}: relative error {err:.3g} > {ADASUM_TOL[dt]:.1g}"


def grown(before, *keys):
    after = hvd.engine_stats()
    return {k: after[k] - before[k] for k in keys}


def check_topology(members):
    hosts = len({r // PER_HOST for r in members})
    assert hvd.size() == len(members) and hvd.rank() == members.index(ME), (hvd.size(), hvd.rank())
    assert (hvd.local_size(), hvd.cross_size(), hvd.is_homogeneous()) == (PER_HOST, hosts, True), \
        (hvd.local_size(), hvd.cross_size(), hvd.is_homogeneous())


def check_hierarchical_allreduce(members, what):
    """Sum and Average, large enough for the hierarchical allreduce: reduced
    in each host, around the ring between hosts, gathered in the host."""
    before = hvd.engine_stats()
    got = hvd.allreduce(values(ME, LARGE, 1), op=hvd.Sum, name=f"{what}.sum")
    np.testing.assert_array_equal(got, sum(values(r, LARGE, 1) for r in members))
    got = hvd.allreduce(values(ME, LARGE + 7, 2, np.float64), op=hvd.Average, name=f"{what}.avg")
    np.testing.assert_allclose(got, sum(values(r, LARGE + 7, 2, np.float64) for r in members) / len(members))
    # Several ranks per host take the ring only hierarchically (not forced).
    assert grown(before, "ring_collectives") == {"ring_collectives": 2}, grown(before, "ring_collectives")


def check_hierarchical_allgather(members, what):
    """Rows per rank differ; across hosts by local rank, then in the host."""
    me = members.index(ME)
    before = hvd.engine_stats()
    rows = lambda i: LARGE // 4 + 100 * i  # noqa: E731
    got = hvd.allgather(values(ME, 4 * rows(me), 3).reshape(-1, 4), name=f"{what}.gather")
    np.testing.assert_array_equal(
        got, np.concatenate([values(r, 4 * rows(i), 3).reshape(-1, 4) for i, r in enumerate(members)]))
    assert grown(before, "hierarchical_allgathers") == {"hierarchical_allgathers": 1}


def check_hierarchical_reducescatter(members, what):
    """In the host, then across hosts; earlier ranks take one row more."""
    me, n = members.index(ME), len(members)
    before = hvd.engine_stats()
    count = LARGE + 3
    got = hvd.reducescatter(values(ME, count, 4).reshape(-1, 1), op=hvd.Sum, name=f"{what}.scatter")
    counts = [count // n + (i < count % n) for i in range(n)]
    start = sum(counts[:me])
    full = sum(values(r, count, 4) for r in members).reshape(-1, 1)
    np.testing.assert_array_equal(got, full[start:start + counts[me]])
    assert grown(before, "hierarchical_reducescatters") == {"hierarchical_reducescatters": 1}


def check_adasum(members, what, process_set=None):
    """allreduce(op=Adasum) of every float dtype and of a group of tensors,
    against the binary tree over ``members`` in rank order."""
    set_ = process_set or hvd.global_process_set
    for i, dtype in enumerate((np.float32, np.float64, np.float16)):
        got = hvd.allreduce(gradient(ME, 1000 + i, 10 + i, dtype), op=hvd.Adasum, process_set=set_,
                            name=f"{what}.adasum.{i}")
        want = adasum_tree([gradient(r, 1000 + i, 10 + i, dtype).astype(np.float64) for r in members])
        check_adasum_result(got, want, dtype, f"{what} {np.dtype(dtype).name}")
    sizes = (5, 300, 4000)
    got = hvd.grouped_allreduce([gradient(ME, n, 20 + n, np.float32) for n in sizes], op=hvd.Adasum,
                                process_set=set_, name=f"{what}.adasum.group")
    for n, g in zip(sizes, got):
        want = adasum_tree([gradient(r, n, 20 + n, np.float32).astype(np.float64) for r in members])
        check_adasum_result(g, want, np.float32, f"{what} group of {len(sizes)}, {n} elements")


def split_world(survivors):
    """Every rank of COMM_WORLD takes part; the others get None."""
    comm = WORLD.Split(0 if ME in survivors else MPI.UNDEFINED, ME)
    return None if comm == MPI.COMM_NULL else comm


def test_hierarchical_collectives_before_the_loss():
    hvd.init()
    members = list(range(N))
    check_topology(members)
    check_hierarchical_allreduce(members, "before")
    check_hierarchical_allgather(members, "before")
    check_hierarchical_reducescatter(members, "before")


def test_adasum_before_the_loss():
    with pytest.raises(hvd.InvalidArgumentError, match="power-of-2"):
        hvd.allreduce(np.ones(4, np.float32), op=hvd.Adasum, name="before.adasum.refused")
    four = hvd.add_process_set([0, 1, 2, 3])
    if ME in four.ranks:
        check_adasum(four.ranks, "before", four)
    hvd.remove_process_set(four)


def test_lost_host_blocks_a_hierarchical_allreduce_until_the_abandon():
    if ME in LOST:
        time.sleep(HANG_S)  # its Python thread hangs; its engine still answers
        start = time.monotonic()
        hvd.abandon(EVICTED)
        assert time.monotonic() - start < 1.0
        return
    timings = {}

    def watch():
        time.sleep(WATCHER_DELAY_S)
        timings["abandon_called"] = time.monotonic()
        hvd.abandon(REASON)
        timings["abandon_s"] = time.monotonic() - timings["abandon_called"]
    watcher = threading.Thread(target=watch, name="peer-watcher")
    watcher.start()
    with pytest.raises(HvdliteShutdownError, match=re.escape(REASON)):
        hvd.allreduce(values(ME, LARGE, 5), op=hvd.Sum, name="stuck.hierarchical")
    late = time.monotonic() - timings["abandon_called"]
    watcher.join()
    print(f"TIMING rank {ME}: abandon {timings['abandon_s'] * 1e3:.1f} ms; the blocked allreduce raised "
          f"{late * 1e3:.1f} ms after the abandon began")
    assert late < 1.0 and timings["abandon_s"] < 1.0, (late, timings)


def test_survivors_start_a_new_engine_on_two_hosts():
    comm = split_world(SURVIVORS)
    if comm is None:
        return
    start = time.monotonic()
    hvd.init(comm=comm)
    print(f"TIMING rank {ME}: init on {len(SURVIVORS)} survivors {(time.monotonic() - start) * 1e3:.1f} ms")
    check_topology(SURVIVORS)


def test_hierarchical_allreduce_on_the_new_engine():
    if ME in SURVIVORS:
        check_hierarchical_allreduce(SURVIVORS, "second")


def test_hierarchical_allgather_on_the_new_engine():
    if ME in SURVIVORS:
        check_hierarchical_allgather(SURVIVORS, "second")


def test_hierarchical_reducescatter_on_the_new_engine():
    if ME in SURVIVORS:
        check_hierarchical_reducescatter(SURVIVORS, "second")


def test_adasum_on_the_new_engine():
    """4 ranks now: the whole world takes Adasum."""
    if ME in SURVIVORS:
        check_adasum(SURVIVORS, "second")


def test_adasum_on_a_process_set_of_the_new_engine():
    if ME not in SURVIVORS:
        return
    pair = hvd.add_process_set([1, 2])   # one rank of each host
    if hvd.rank() in pair.ranks:
        check_adasum([SURVIVORS[r] for r in pair.ranks], "second.pair", pair)
    hvd.remove_process_set(pair)


def test_shutdown_at_the_end():
    if hvd.is_initialized():
        hvd.shutdown()
    assert not hvd.is_initialized()
    WORLD.Barrier()
