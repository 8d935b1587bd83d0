"""Going on without a lost rank (hvdlite.abandon, issue 39), on real ranks.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_abandon.py
runs it at 3 and 4 ranks. Its cases are one scenario, in order, each case a
step that every rank takes (the state passes from case to case):

1. every rank starts an engine on COMM_WORLD; collectives match NumPy;
2. the last rank hangs (its Python thread sleeps, its engine still answers)
   while the others submit an allreduce it never submits; a watcher thread
   on each survivor abandons the engine 0.3 s later, and the blocked
   allreduce raises HvdliteShutdownError with the reason at once; the hung
   rank then abandons its own engine, which waits for peers that left;
3. every later call raises the same way; the old handles stay readable
   (NumPy and torch), registered process sets are unregistered, the flight
   recorder holds the abandonment and its dump was written;
4. every rank (the lost one with MPI.UNDEFINED) splits COMM_WORLD, and the
   survivors start a new engine on their communicator: allreduce,
   allgather, broadcast, alltoall, a process set added after it, a fused
   batch of small tensors (twice: the response cache), a large tensor (the
   launch's wire: shared memory or the ring) and fp16 compression match
   NumPy;
5. a second rank is lost while the others compute (not in a collective):
   their next allreduce raises at once; abandoning again is harmless; the
   remaining ranks start a third engine, whose collectives match NumPy;
6. the engine shuts down and MPI finalises on every rank (the job's exit).

Timings (the abandon, the blocked call's error, the re-init) are printed as
"TIMING ..." lines (pytest -s shows them).
"""
import os
import re
import tempfile
import threading
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

import hvdlite as hvd
import hvdlite.torch as hvd_torch
from hvdlite import HvdliteShutdownError

WORLD = MPI.COMM_WORLD
ME = WORLD.Get_rank()
N = WORLD.Get_size()
FIRST_LOST = N - 1    # hangs in step 2
SECOND_LOST = N - 2   # lost in step 5
REASON = f"rank {FIRST_LOST} lost (test)"
SECOND_REASON = f"rank {SECOND_LOST} lost (test)"
EVICTED = "this rank was evicted (test)"
WATCHER_DELAY_S = 0.3
HANG_S = 1.5
# Ring and shared-memory wires: the launch's choice (tests/test_abandon.py).
RING = os.environ.get("HVDLITE_RING_ALLREDUCE") == "1"

state = {}


def values(r, n, salt, dtype=np.float32):
    """Rank r's input: small integers, so sums are exact in every dtype used."""
    rng = np.random.default_rng(1000 * salt + r)
    return rng.integers(-8, 9, n).astype(dtype)


def abandon_later(reason, delay, timings):
    """A watcher thread: abandons the engine ``delay`` s from now, as one
    would when the launcher reports a dead peer."""
    def run():
        time.sleep(delay)
        start = time.monotonic()
        timings["abandon_called"] = start
        try:
            hvd.abandon(reason)
        except BaseException as e:  # noqa: BLE001 - reported by the case
            timings["error"] = e
        timings["abandon_s"] = time.monotonic() - start
    watcher = threading.Thread(target=run, name="peer-watcher")
    watcher.start()
    return watcher


def check_collectives(members, what):
    """allreduce (Sum, Average), allgather (rows per rank differ), broadcast
    and alltoall over the running engine, whose ranks are the COMM_WORLD
    ranks ``members`` in order, against NumPy."""
    me = members.index(ME)
    assert hvd.size() == len(members) and hvd.rank() == me, (hvd.size(), hvd.rank(), members)
    x = values(ME, 1000, 1)
    got = hvd.allreduce(x, op=hvd.Sum, name=f"{what}.sum")
    np.testing.assert_array_equal(got, sum(values(r, 1000, 1) for r in members))
    got = hvd.allreduce(x.astype(np.float64), op=hvd.Average, name=f"{what}.avg")
    np.testing.assert_allclose(got, sum(values(r, 1000, 1, np.float64) for r in members) / len(members))
    got = hvd.allgather(values(ME, 3 * (me + 1), 2).reshape(-1, 3), name=f"{what}.gather")
    np.testing.assert_array_equal(
        got, np.concatenate([values(r, 3 * (i + 1), 2).reshape(-1, 3) for i, r in enumerate(members)]))
    root = members[-1]
    got = hvd.broadcast(values(ME, 50, 3), root_rank=members.index(root), name=f"{what}.bcast")
    np.testing.assert_array_equal(got, values(root, 50, 3))
    # Rank i sends j + 1 rows to rank j.
    splits = [j + 1 for j in range(len(members))]
    rows = np.repeat(np.array([[100 * me + j] for j in range(len(members))], np.int64), splits, axis=0)
    got, received = hvd.alltoall(rows, splits=splits, name=f"{what}.alltoall")
    np.testing.assert_array_equal(np.asarray(received), [me + 1] * len(members))
    np.testing.assert_array_equal(got, np.concatenate([np.full((me + 1, 1), 100 * i + me, np.int64)
                                                       for i in range(len(members))]))


def split_world(survivors):
    """Every rank of COMM_WORLD takes part; the others get COMM_NULL."""
    start = time.monotonic()
    comm = WORLD.Split(0 if ME in survivors else MPI.UNDEFINED, ME)
    return (None if comm == MPI.COMM_NULL else comm), time.monotonic() - start


def test_collectives_before_the_loss():
    # The dumps of the flight recorder go where every rank of this host sees them.
    directory = WORLD.bcast(tempfile.mkdtemp(prefix="hvdlite-abandon-") if ME == 0 else None, root=0)
    os.environ["HVDLITE_FLIGHT_RECORDER_DIR"] = state["dump_dir"] = directory
    hvd.init()
    check_collectives(list(range(N)), "before")
    # A set that is not every rank of this engine nor of the survivors' next one.
    old = state["old_set"] = hvd.add_process_set(list(range(N - 2)))
    if ME in old.ranks:
        got = hvd.allreduce(values(ME, 10, 4), op=hvd.Sum, process_set=old, name="before.set")
        np.testing.assert_array_equal(got, sum(values(r, 10, 4) for r in old.ranks))


def test_blocked_allreduce_raises_the_reason():
    if ME == FIRST_LOST:
        # Hung: its Python thread stops calling hvdlite; its engine still answers.
        time.sleep(HANG_S)
        start = time.monotonic()
        hvd.abandon(EVICTED)  # its engine waits in a round for peers that left
        took = time.monotonic() - start
        print(f"TIMING rank {ME}: abandon of an engine waiting for peers that left: {took * 1e3:.1f} ms")
        assert took < 1.0, took
        return
    # Handles the abandon fails without anyone waiting on them (NumPy, torch).
    state["other"] = hvd.allreduce_async(np.ones(8, np.float32), name="stuck.other")
    state["torch"] = hvd_torch.allreduce_async(torch.ones(4), name="stuck.torch")
    timings = {}
    watcher = abandon_later(REASON, WATCHER_DELAY_S, timings)
    with pytest.raises(HvdliteShutdownError) as raised:
        hvd.allreduce(values(ME, 1000, 5), op=hvd.Sum, name="stuck.main")
    raised_at = time.monotonic()
    watcher.join()
    assert "error" not in timings, timings
    assert REASON in str(raised.value), str(raised.value)
    assert raised_at >= timings["abandon_called"], "the allreduce returned before the abandon"
    late = raised_at - timings["abandon_called"]
    print(f"TIMING rank {ME}: abandon {timings['abandon_s'] * 1e3:.1f} ms; the blocked allreduce raised "
          f"{late * 1e3:.1f} ms after the abandon began")
    assert late < 1.0, late
    assert timings["abandon_s"] < 1.0, timings


def test_calls_after_the_abandon_raise_the_reason():
    reason = EVICTED if ME == FIRST_LOST else REASON
    assert not hvd.is_initialized()
    for call in (lambda: hvd.allreduce(np.ones(3, np.float32), name="after"),
                 lambda: hvd.allreduce_async(np.ones(3, np.float32), name="after.async"),
                 lambda: hvd.broadcast(np.ones(3, np.float32), root_rank=0, name="after.bcast"),
                 hvd.rank):
        start = time.monotonic()
        with pytest.raises(HvdliteShutdownError, match=re.escape(reason)):
            call()
        assert time.monotonic() - start < 0.5
    if ME != FIRST_LOST:
        # The abandoned engine's handles stay readable until the next init.
        assert hvd.poll(state["other"])
        with pytest.raises(HvdliteShutdownError) as raised:
            hvd.synchronize(state["other"])
        assert REASON in str(raised.value)
        assert hvd_torch.poll(state["torch"])
        with pytest.raises(HvdliteShutdownError) as raised:
            hvd_torch.synchronize(state["torch"])
        assert REASON in str(raised.value)
    # Sets of the old engine are unregistered: the next engine's ids start over.
    assert state["old_set"].process_set_id is None


def test_flight_recorder_holds_the_abandon():
    reason = EVICTED if ME == FIRST_LOST else REASON
    events = hvd.flight_recorder()
    abandoned = [e for e in events if e["kind"] == "abandoned"]
    assert len(abandoned) == 1 and abandoned[0]["detail"] == reason, events[-5:]
    stopped = [e for e in events if e["kind"] == "stopped"]
    assert stopped and reason in stopped[-1]["detail"], events[-5:]
    if ME != FIRST_LOST:
        # The pending tensors were recorded as such.
        pending = {e.get("name") for e in events if e["kind"] == "error"}
        assert {"stuck.main", "stuck.other"} <= pending, pending
    path = os.path.join(state["dump_dir"], f"flight-recorder.rank{ME}.jsonl")
    with open(path) as f:
        assert "the engine was abandoned: " in f.readline()


def test_survivors_start_a_new_engine():
    survivors = [r for r in range(N) if r != FIRST_LOST]
    comm, split_s = split_world(survivors)
    if comm is None:
        assert ME == FIRST_LOST
        return
    start = time.monotonic()
    hvd.init(comm=comm)
    init_s = time.monotonic() - start
    print(f"TIMING rank {ME}: split {split_s * 1e3:.1f} ms, init on {len(survivors)} survivors "
          f"{init_s * 1e3:.1f} ms")
    assert hvd.is_initialized() and hvd.size() == len(survivors) and hvd.rank() == survivors.index(ME)
    state["members"] = survivors


def test_collectives_on_the_new_engine():
    if ME == FIRST_LOST:
        return
    check_collectives(state["members"], "second")


def test_process_set_added_after_the_new_init():
    if ME == FIRST_LOST:
        return
    assert hvd.global_process_set.process_set_id == 0 and hvd.global_process_set.size() == N - 1
    old = hvd.add_process_set(state["old_set"])  # unregistered by the abandon: added again
    assert old.process_set_id == 1, old
    if ME in old.ranks:
        got = hvd.allreduce(values(ME, 10, 6), op=hvd.Sum, process_set=old, name="second.set")
        np.testing.assert_array_equal(got, sum(values(r, 10, 6) for r in old.ranks))
    hvd.remove_process_set(old)


def test_fused_small_tensors_on_the_new_engine():
    if ME == FIRST_LOST:
        return
    members = state["members"]
    for round_ in range(2):  # the second time from the response cache
        before = hvd.engine_stats()
        handles = [hvd.allreduce_async(values(ME, 17 + i, 7 + i), op=hvd.Sum, name=f"small.{i}")
                   for i in range(64)]
        for i, h in enumerate(handles):
            np.testing.assert_array_equal(hvd.synchronize(h), sum(values(r, 17 + i, 7 + i) for r in members))
        after = hvd.engine_stats()
        assert after["tensors_fused"] > before["tensors_fused"], (before, after)
    assert after["cache_hits"] > before["cache_hits"], (before, after)


def test_large_tensor_on_the_new_engine():
    if ME == FIRST_LOST:
        return
    before = hvd.engine_stats()
    x = values(ME, 4 << 20, 8)  # 16 MB
    got = hvd.allreduce(x, op=hvd.Sum, name="large")
    np.testing.assert_array_equal(got, sum(values(r, 4 << 20, 8) for r in state["members"]))
    wire = "ring_collectives" if RING else "shm_collectives"
    assert hvd.engine_stats()[wire] > before[wire], (wire, before, hvd.engine_stats())


def test_fp16_compression_on_the_new_engine():
    if ME == FIRST_LOST:
        return
    x = values(ME, 5000, 9) / 8
    got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16, name="fp16")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, sum(values(r, 5000, 9) / 8 for r in state["members"]), atol=1e-2)


def test_second_loss_while_computing():
    if ME == FIRST_LOST:
        return
    if ME == SECOND_LOST:
        time.sleep(HANG_S)
        hvd.abandon(EVICTED)
        return
    timings = {}
    watcher = abandon_later(SECOND_REASON, WATCHER_DELAY_S, timings)
    a = np.random.default_rng(ME).standard_normal((200, 200))
    deadline = time.monotonic() + 2 * WATCHER_DELAY_S
    while time.monotonic() < deadline:  # computing, no collective in flight
        a = np.tanh(a @ a.T / 200)
    watcher.join()
    assert "error" not in timings, timings
    start = time.monotonic()
    with pytest.raises(HvdliteShutdownError) as raised:
        hvd.allreduce(values(ME, 100, 10), op=hvd.Sum, name="after.compute")
    took = time.monotonic() - start
    print(f"TIMING rank {ME}: abandon while computing {timings['abandon_s'] * 1e3:.1f} ms; "
          f"the next allreduce raised in {took * 1e3:.2f} ms")
    assert SECOND_REASON in str(raised.value) and took < 0.1, (str(raised.value), took)


def test_abandon_again_is_harmless():
    reason = EVICTED if ME in (FIRST_LOST, SECOND_LOST) else SECOND_REASON
    start = time.monotonic()
    callers = [threading.Thread(target=hvd.abandon, args=("again (test)",)) for _ in range(2)]
    for t in callers:
        t.start()
    hvd.abandon("again (test)")
    for t in callers:
        t.join()
    assert time.monotonic() - start < 0.5
    with pytest.raises(HvdliteShutdownError, match=re.escape(reason)):
        hvd.allreduce(np.ones(3, np.float32), name="again")


def test_the_rest_start_a_third_engine():
    rest = [r for r in range(N) if r not in (FIRST_LOST, SECOND_LOST)]
    comm, _ = split_world(rest)
    if comm is None:
        return
    start = time.monotonic()
    hvd.init(comm=comm)
    print(f"TIMING rank {ME}: init on {len(rest)} ranks {(time.monotonic() - start) * 1e3:.1f} ms")
    check_collectives(rest, "third")
    x = values(ME, 1 << 20, 11)
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, name="third.large"),
                                  sum(values(r, 1 << 20, 11) for r in rest))


def test_shutdown_at_the_end():
    if hvd.is_initialized():
        hvd.shutdown()
    assert not hvd.is_initialized()
    WORLD.Barrier()
    if ME == 0:
        for name in os.listdir(state["dump_dir"]):
            os.unlink(os.path.join(state["dump_dir"], name))
        os.rmdir(state["dump_dir"])
