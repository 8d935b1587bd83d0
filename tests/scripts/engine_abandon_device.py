"""Going on without a lost rank on the device path (hvdlite.abandon, issue 39):
the torch device executor (hvdlite/torch/device.py) on gloo with CPU tensors
(HVDLITE_DEVICE_TRANSPORT=gloo, the path of CUDA tensors with gloo in NCCL's
place).

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_abandon.py
runs it at 3 ranks. Its cases are one scenario, in order, as in
engine_abandon.py:

1. every rank starts an engine and its executor; device collectives (on
   every rank and on a process set) match NumPy;
2. the last rank's executor stalls in a job (as a rank whose device is
   stuck) and its Python thread hangs; the survivors' executors wait in
   gloo for it while a second job waits in negotiation; a watcher abandons
   the engine: both handles raise HvdliteShutdownError with the reason at
   once, and abandon() does not wait for the executor stuck in gloo;
3. device calls after the abandon raise the same way; no executor runs;
4. the survivors start a new engine on their communicator: a new executor
   with groups of the new world, whose collectives match NumPy;
5. the stalled rank lets its old job go on: the survivors' old executor
   threads leave their gloo call, and must leave the new engine alone (no
   job taken, none reported) while it runs more device collectives;
6. the engine shuts down on every rank (the job's exit).
"""
import re
import threading
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

import hvdlite as hvd
import hvdlite.torch as hvd_torch
from hvdlite import HvdliteShutdownError
from hvdlite.torch import device as hvd_device

from engine_abandon import abandon_later  # noqa: E402 (the scripts folder is on the path)

torch.set_num_threads(1)

WORLD = MPI.COMM_WORLD
ME = WORLD.Get_rank()
N = WORLD.Get_size()
LOST = N - 1
SURVIVORS = [r for r in range(N) if r != LOST]
REASON = f"rank {LOST} lost (test)"
EVICTED = "this rank was evicted (test)"
WATCHER_DELAY_S = 0.3
HANG_S = 1.5

state = {}


def values(r, n, salt, dtype=np.float32):
    """Rank r's input: small integers, so sums are exact."""
    rng = np.random.default_rng(1000 * salt + r)
    return rng.integers(-8, 9, n).astype(dtype)


def executor():
    return hvd_device._executor


class on_the_executor:
    """The collectives in the ``with`` block ran as device jobs."""

    def __enter__(self):
        self.before = hvd_device.counts["device_jobs"]

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            assert hvd_device.counts["device_jobs"] > self.before, "no job went through the executor"
        return False


def check_device_collectives(members, what):
    """allreduce (Sum, Average), allgather (rows per rank differ), broadcast
    and alltoall of CPU tensors through the executor, whose ranks are the
    COMM_WORLD ranks ``members`` in order, against NumPy."""
    me = members.index(ME)
    assert hvd.size() == len(members) and hvd.rank() == me, (hvd.size(), hvd.rank(), members)
    with on_the_executor():
        got = hvd_torch.allreduce(torch.from_numpy(values(ME, 1000, 1)), op=hvd_torch.Sum, name=f"{what}.sum")
        np.testing.assert_array_equal(got.numpy(), sum(values(r, 1000, 1) for r in members))
        x = torch.from_numpy(values(ME, 300, 2, np.float64))
        got = hvd_torch.allreduce(x, op=hvd_torch.Average, name=f"{what}.avg")
        np.testing.assert_allclose(got.numpy(), sum(values(r, 300, 2, np.float64) for r in members) / len(members))
        got = hvd_torch.allgather(torch.from_numpy(values(ME, 3 * (me + 1), 3).reshape(-1, 3)), name=f"{what}.gather")
        np.testing.assert_array_equal(
            got.numpy(), np.concatenate([values(r, 3 * (i + 1), 3).reshape(-1, 3) for i, r in enumerate(members)]))
        root = members[-1]
        got = hvd_torch.broadcast(torch.from_numpy(values(ME, 50, 4)), root_rank=members.index(root),
                                  name=f"{what}.bcast")
        np.testing.assert_array_equal(got.numpy(), values(root, 50, 4))
        # Rank i sends j + 1 rows to rank j.
        splits = [j + 1 for j in range(len(members))]
        rows = np.repeat(np.array([[100 * me + j] for j in range(len(members))], np.int64), splits, axis=0)
        got, received = hvd_torch.alltoall(torch.from_numpy(rows), splits=torch.tensor(splits, dtype=torch.int32),
                                           name=f"{what}.alltoall")
        np.testing.assert_array_equal(received.numpy(), [me + 1] * len(members))
        np.testing.assert_array_equal(got.numpy(), np.concatenate(
            [np.full((me + 1, 1), 100 * i + me, np.int64) for i in range(len(members))]))


def check_device_set(members, set_members, what):
    """An allreduce on a process set of the COMM_WORLD ranks ``set_members``
    (the executor's group of that set)."""
    ranks = [members.index(r) for r in set_members]
    ps = hvd.add_process_set(ranks)
    try:
        if ME in set_members:
            with on_the_executor():
                got = hvd_torch.allreduce(torch.from_numpy(values(ME, 20, 5)), op=hvd_torch.Sum,
                                          process_set=ps, name=f"{what}.set")
            np.testing.assert_array_equal(got.numpy(), sum(values(r, 20, 5) for r in set_members))
    finally:
        hvd.remove_process_set(ps)


def wait_until(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.01)


def split_world(survivors):
    """Every rank of COMM_WORLD takes part; the others get None."""
    comm = WORLD.Split(0 if ME in survivors else MPI.UNDEFINED, ME)
    return None if comm == MPI.COMM_NULL else comm


def test_device_collectives_before_the_loss():
    hvd_torch.init()
    assert hvd_device.backend_name() == "gloo", "HVDLITE_DEVICE_TRANSPORT=gloo expected"
    check_device_collectives(list(range(N)), "before")
    check_device_set(list(range(N)), [0, LOST], "before")
    state["executor"] = executor()


def test_device_jobs_in_flight_fail_at_the_abandon():
    ex = state["executor"]
    taken = threading.Event()
    run = ex._run
    release = state["release"] = threading.Event()

    def take(job):
        taken.set()
        if ME == LOST:
            # It stalls (a stuck device): the survivors' executors wait for
            # it inside gloo.
            release.wait()
        run(job)
    ex._run = take
    handle = hvd_torch.allreduce_async(torch.from_numpy(values(ME, 500, 6)), op=hvd_torch.Sum, name="stuck.executor")
    wait_until(taken.is_set, 30, "the executor taking the job")
    if ME == LOST:
        time.sleep(HANG_S)  # its Python thread hangs
        start = time.monotonic()
        hvd.abandon(EVICTED)
        took = time.monotonic() - start
        print(f"TIMING rank {ME}: abandon with the executor stalled in a job: {took * 1e3:.1f} ms")
        with pytest.raises(HvdliteShutdownError, match=re.escape(EVICTED)):
            hvd_torch.synchronize(handle)
        assert took < 1.0, took
        return
    # Agreed by every rank but the lost one: waits in negotiation.
    negotiating = hvd_torch.allreduce_async(torch.ones(7), name="stuck.negotiation")
    timings = {}
    watcher = abandon_later(REASON, WATCHER_DELAY_S, timings)
    with pytest.raises(HvdliteShutdownError) as raised:
        hvd_torch.synchronize(handle)
    raised_at = time.monotonic()
    watcher.join()
    assert "error" not in timings, timings
    assert REASON in str(raised.value), str(raised.value)
    late = raised_at - timings["abandon_called"]
    print(f"TIMING rank {ME}: abandon {timings['abandon_s'] * 1e3:.1f} ms with the executor in gloo; "
          f"its job raised {late * 1e3:.1f} ms after the abandon began")
    assert late < 1.0 and timings["abandon_s"] < 1.0, (late, timings)
    with pytest.raises(HvdliteShutdownError, match=re.escape(REASON)):
        hvd_torch.synchronize(negotiating)
    # The old executor is still in gloo, waiting for the stalled rank.
    assert ex._thread.is_alive()


def test_device_calls_after_the_abandon_raise():
    reason = EVICTED if ME == LOST else REASON
    assert hvd_device.backend_name() is None and hvd_device.executor_for(torch.ones(1)) is None
    for call in (lambda: hvd_torch.allreduce(torch.ones(3), name="after"),
                 lambda: hvd_torch.allgather(torch.ones(2, 1), name="after.gather"),
                 lambda: hvd_torch.broadcast(torch.ones(3), root_rank=0, name="after.bcast")):
        start = time.monotonic()
        with pytest.raises(HvdliteShutdownError, match=re.escape(reason)):
            call()
        assert time.monotonic() - start < 0.5


def test_survivors_start_a_new_engine_and_executor():
    comm = split_world(SURVIVORS)
    if comm is None:
        return
    start = time.monotonic()
    hvd.init(comm=comm)
    print(f"TIMING rank {ME}: init with a new executor on {len(SURVIVORS)} ranks "
          f"{(time.monotonic() - start) * 1e3:.1f} ms")
    ex = executor()
    assert hvd_device.backend_name() == "gloo" and ex is not state["executor"] and ex.alive()
    # Its groups are the new world's, on a store of the new engine.
    assert ex._world.size() == len(SURVIVORS) and ex._world.rank() == SURVIVORS.index(ME)
    assert state["executor"]._world is None or state["executor"]._world is not ex._world


def test_device_collectives_on_the_new_engine():
    if ME == LOST:
        return
    check_device_collectives(SURVIVORS, "second")
    check_device_set(SURVIVORS, [SURVIVORS[-1]], "second")


def test_the_old_executor_leaves_the_new_engine_alone():
    old = state["executor"]
    if ME == LOST:
        state["release"].set()  # its job goes on: the others' old gloo call completes
    WORLD.Barrier()
    # Every old executor thread ends (the stalled rank's included), taking
    # nothing from the engine that runs now.
    old._thread.join(timeout=30)
    assert not old._thread.is_alive(), "the old executor thread did not end"
    if ME == LOST:
        return
    jobs = hvd_device.counts["device_jobs"]
    for i in range(3):
        check_device_collectives(SURVIVORS, f"third.{i}")
    assert executor().alive() and hvd_device.counts["device_jobs"] >= jobs + 3 * 5


def test_shutdown_at_the_end():
    if hvd.is_initialized():
        hvd.shutdown()
    assert not hvd.is_initialized() and hvd_device.backend_name() is None
    WORLD.Barrier()
