"""Point-to-point messages, monitored_barrier and the group's timeout on
torch.distributed's "hvdlite" backend (hvdlite/torch/c10d_p2p.py).

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_torch_distributed.py runs it at 2 and at 4 ranks under mpiexec.
Every rank rebuilds every rank's data (seeded by rank) and checks what it
received against the sender's data as NumPy, per dtype.
"""
import threading
import time
from datetime import timedelta

import numpy as np
import pytest

from harness.checks import check, check_equal, expect, require

torch = require("torch")

import torch.distributed as dist  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.torch  # noqa: E402,F401  (registers the backend)
from harness.c10d_ranks import data, group  # noqa: E402,F401  (group: a fixture)
from hvdlite.exceptions import HvdliteTimeoutError, InvalidArgumentError  # noqa: E402

torch.set_num_threads(1)

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool}


def ref(r, shape, dtype, salt=0):
    """Rank ``r``'s data as NumPy: what a receiver must hold."""
    return data(r, shape, dtype, salt).numpy()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_ring_exchange(group, rank, size, dtype):
    """batch_isend_irecv: each rank sends to the next and receives from the
    previous, then the other way round under another tag."""
    dt = DTYPES[dtype]
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    got = torch.zeros(3, 4, dtype=dt)
    back = torch.zeros(5, dtype=dt)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, data(rank, (3, 4), dt), nxt),
        dist.P2POp(dist.irecv, got, prev),
        dist.P2POp(dist.isend, data(rank, (5,), dt, salt=1), prev, tag=9),
        dist.P2POp(dist.irecv, back, nxt, tag=9)])
    for w in works:
        check("wait", w.wait() is True)
    check_equal(got.numpy(), ref(prev, (3, 4), dt), f"from rank {prev}")
    check_equal(back.numpy(), ref(nxt, (5,), dt, salt=1), f"from rank {nxt} (tag 9)")


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_send_recv(group, rank, size, dtype):
    """Blocking send/recv: rank 0 sends each rank its own message (tagged with
    the receiver's rank), then receives their answers in reverse rank order."""
    dt = DTYPES[dtype]
    if rank == 0:
        for r in range(1, size):
            dist.send(data(0, (6,), dt, salt=r), dst=r, tag=r)
        for r in reversed(range(1, size)):
            t = torch.empty(2, 2, dtype=dt)
            check("recv returns the source", dist.recv(t, src=r) == r)
            check_equal(t.numpy(), ref(r, (2, 2), dt, salt=50), f"answer of rank {r}")
    else:
        t = torch.empty(6, dtype=dt)
        dist.recv(t, src=0, tag=rank)
        check_equal(t.numpy(), ref(0, (6,), dt, salt=rank), "from rank 0")
        dist.send(data(rank, (2, 2), dt, salt=50), dst=0)


def test_tags_select_messages(group, rank, size):
    """Two messages to one rank under two tags, received in the other order."""
    if rank == 0:
        works = [dist.isend(data(0, (4,), torch.float32, salt=t), dst=1, tag=t) for t in (1, 2)]
        for w in works:
            w.wait()
    elif rank == 1:
        second, first = torch.empty(4), torch.empty(4)
        dist.recv(second, src=0, tag=2)
        dist.recv(first, src=0, tag=1)
        check_equal(second.numpy(), ref(0, (4,), torch.float32, salt=2), "tag 2")
        check_equal(first.numpy(), ref(0, (4,), torch.float32, salt=1), "tag 1")


def test_recv_anysource(group, rank, size):
    """recv without src: every other rank sends to rank 0, which learns who
    sent each message from recv's return value (a global rank)."""
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            t = torch.empty(3, dtype=torch.float64)
            src = dist.recv(t)
            check("a source other than rank 0", 0 < src < size, f"({src})")
            check_equal(t.numpy(), ref(src, (3,), torch.float64, salt=60), f"from rank {src}")
            seen.add(src)
        check("every rank's message once", seen == set(range(1, size)), f"({sorted(seen)})")
        work = dist.irecv(torch.empty(1))              # recv_anysource's work
        dist.send(torch.ones(1), dst=1, tag=61)      # (rank 1 answers with its rank)
        work.wait()
        check("work source rank", work._source_rank() == 1)
    else:
        dist.send(data(rank, (3,), torch.float64, salt=60), dst=0)
        if rank == 1:
            dist.recv(torch.empty(1), src=0, tag=61)
            dist.send(torch.ones(1), dst=0)


def test_future_completes_without_wait(group, rank, size):
    """get_future() of an irecv completes when the message comes, without
    wait(): on the backend's thread, which runs the then() callbacks."""
    if rank == 0:
        t = torch.zeros(4)
        done, seen = threading.Event(), []
        fut = dist.irecv(t, src=1, tag=3).get_future()
        fut.add_done_callback(lambda f: (seen.append(threading.current_thread().name), done.set()))
        doubled = fut.then(lambda f: f.value()[0] * 2)
        dist.send(torch.ones(1), dst=1, tag=4)        # now rank 1 sends
        check("completed without wait()", done.wait(60))
        check("callback thread", seen[0] in ("hvdlite-c10d-p2p", "MainThread"), seen)
        want = ref(1, (4,), torch.float32, salt=3)
        check_equal(t.numpy(), want, "received")
        check_equal(doubled.wait().numpy(), want * 2, "then()")
    elif rank == 1:
        dist.recv(torch.empty(1), src=0, tag=4)
        time.sleep(0.2)
        dist.send(data(1, (4,), torch.float32, salt=3), dst=0, tag=3)


def test_non_contiguous_and_self(group, rank, size):
    """A transposed tensor sent and received, and a message to this rank itself."""
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    out = data(rank, (3, 5), torch.float32, salt=70).t()
    into = torch.zeros(3, 5).t()
    check("not contiguous", not out.is_contiguous() and not into.is_contiguous())
    works = [dist.isend(out, dst=nxt), dist.irecv(into, src=prev)]
    for w in works:
        w.wait()
    check_equal(into.numpy(), ref(prev, (3, 5), torch.float32, salt=70).T, "transposed")
    mine = torch.zeros(2, dtype=torch.int32)
    works = [dist.isend(data(rank, (2,), torch.int32, salt=71), dst=rank, tag=5),
             dist.irecv(mine, src=rank, tag=5)]
    for w in works:
        w.wait()
    check_equal(mine.numpy(), ref(rank, (2,), torch.int32, salt=71), "to itself")


def test_errors(group, rank, size):
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    # the receiver's tensor holds fewer, then more bytes than the message
    for tag, n, words in ((80, 2, "the message is larger than the tensor's 8 bytes"),
                          (81, 8, f"the tensor holds 32 bytes, but group rank {prev} sent 16")):
        send = dist.isend(torch.ones(4), dst=nxt, tag=tag)
        expect(InvalidArgumentError, lambda: dist.recv(torch.zeros(n), src=prev, tag=tag),
               "recv", words)
        send.wait()
    expect(ValueError, lambda: dist.isend(torch.ones(1), dst=nxt, tag=2 ** 31 - 1), "tag")
    expect(ValueError, lambda: dist.isend(torch.ones(1), dst=nxt, tag=-1), "tag")
    # messages after the errors still arrive
    got = torch.zeros(3)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((3,), float(rank)), nxt),
                                     dist.P2POp(dist.irecv, got, prev)]):
        w.wait()
    check_equal(got.numpy(), np.full(3, prev, dtype=np.float32), "after the errors")


def test_subgroup(group, rank, size):
    """A ring inside a group of a registered process set (ranks 1..size-1;
    at 2 ranks, one rank sending to itself); peers named by global rank."""
    members = list(range(1, size))
    ps = hvdlite.add_process_set(members)
    try:
        sub = dist.new_group(members)
        if rank in members:
            i = members.index(rank)
            nxt, prev = members[(i + 1) % len(members)], members[(i - 1) % len(members)]
            got = torch.zeros(4, dtype=torch.float64)
            works = [dist.isend(data(rank, (4,), torch.float64, salt=90), dst=nxt, group=sub),
                     dist.irecv(got, src=prev, group=sub)]
            for w in works:
                w.wait()
            check_equal(got.numpy(), ref(prev, (4,), torch.float64, salt=90), f"from {prev}")
            dist.monitored_barrier(group=sub, timeout=timedelta(seconds=30))
        dist.barrier()
    finally:
        hvdlite.remove_process_set(ps)


def test_monitored_barrier(group, rank, size):
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
    dist.monitored_barrier()                     # the group's timeout


def test_monitored_barrier_names_late_ranks(group, rank, size):
    """Ranks that come later than the timeout: rank 0 names the first (all of
    them with wait_all_ranks), every other rank raises too; the next
    monitored_barrier, on time, passes (late reports are not taken for it)."""
    late = [size - 1] if size == 2 else [size - 2, size - 1]
    for wait_all in (False, True):
        if rank in late:
            time.sleep(2.0)
        timeout = timedelta(seconds=1)
        if rank == 0:
            named = late if wait_all else late[:1]
            expect(HvdliteTimeoutError,
                   lambda: dist.monitored_barrier(timeout=timeout, wait_all_ranks=wait_all),
                   f"Rank{'s' if len(named) > 1 else ''} {', '.join(map(str, named))} "
                   "failed to pass monitoredBarrier in 1000 ms")
        else:
            expect(HvdliteTimeoutError,
                   lambda: dist.monitored_barrier(timeout=timeout, wait_all_ranks=wait_all),
                   f"[Rank {rank}]", "rank 0 did not answer within 1000 ms")
        dist.barrier()
    dist.monitored_barrier(timeout=timedelta(seconds=30))


def test_group_timeout_is_the_default_for_waits(group, rank, size):
    """new_group(timeout=): wait() without a timeout of its own gives up after
    the group's, for a collective and for a receive; the work goes on and
    completes when the peer comes."""
    short = dist.new_group(timeout=timedelta(seconds=1))
    t = torch.full((3,), float(rank + 1))
    got = torch.zeros(2)
    if rank == 0:
        reduced = dist.all_reduce(t, group=short, async_op=True)
        received = dist.irecv(got, src=1, group=short, tag=12)
        for work in (reduced, received):
            started = time.monotonic()
            expect(HvdliteTimeoutError, work.wait, "group's timeout of 0:00:01",
                   "new_group(timeout=")
            took = time.monotonic() - started
            check("gave up after the group's timeout", 0.9 <= took < 10, f"({took:.2f} s)")
        expect(HvdliteTimeoutError, lambda: received.wait(timedelta(seconds=0.3)),
               "within 0:00:00.3")
    dist.barrier()                              # the others come now
    if rank != 0:
        dist.all_reduce(t, group=short)
        if rank == 1:
            dist.send(torch.tensor([5.0, 6.0]), dst=0, group=short, tag=12)
    else:
        reduced.wait(timedelta(seconds=60))
        received.wait(timedelta(seconds=60))
    check_equal(t.numpy(), np.full(3, size * (size + 1) / 2, dtype=np.float32), "all_reduce")
    if rank == 0:
        check_equal(got.numpy(), np.array([5.0, 6.0], dtype=np.float32), "recv")
    dist.destroy_process_group(short)


def test_waiting_does_not_keep_a_core_busy(group, rank, size):
    """A receive that waits 1.5 s, through wait() and through a future: the
    waiting thread (wait()'s, then the backend's) uses little CPU time."""
    if rank == 0:
        started, cpu = time.monotonic(), time.thread_time()
        dist.recv(torch.zeros(1), src=1, tag=20)
        waited, used = time.monotonic() - started, time.thread_time() - cpu
        check("wait() waited", waited >= 1.0, f"({waited:.2f} s)")
        check("wait() used little CPU", used < 0.25 * waited, f"({used:.3f} s of {waited:.2f} s)")
        fut = dist.irecv(torch.zeros(1), src=1, tag=21).get_future()
        poller = next(t for t in threading.enumerate() if t.name == "hvdlite-c10d-p2p")
        clock = time.pthread_getcpuclockid(poller.ident)
        started, cpu = time.monotonic(), time.clock_gettime(clock)
        dist.send(torch.ones(1), dst=1, tag=22)
        fut.wait()
        waited, used = time.monotonic() - started, time.clock_gettime(clock) - cpu
        check("the future waited", waited >= 1.0, f"({waited:.2f} s)")
        check("its thread used little CPU", used < 0.25 * waited,
              f"({used:.3f} s of {waited:.2f} s)")
    elif rank == 1:
        time.sleep(1.5)
        dist.send(torch.ones(1), dst=0, tag=20)
        dist.recv(torch.zeros(1), src=0, tag=22)
        time.sleep(1.5)
        dist.send(torch.ones(1), dst=0, tag=21)
    dist.barrier()
