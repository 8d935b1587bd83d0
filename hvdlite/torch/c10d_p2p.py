"""Point-to-point messages of the "hvdlite" torch.distributed backend:
``send``, ``recv`` and ``recv_anysource`` (so ``dist.send``, ``dist.recv``,
``isend``, ``irecv``, ``batch_isend_irecv``), and ``monitored_barrier``.

hvdlite's engine runs collectives; a group's messages go over MPI directly,
from the calling thread (hvdlite starts MPI with MPI_THREAD_MULTIPLE), on a
communicator of the group's own, made when the group is: a duplicate of
hvdlite's communicator for a group of every rank, one of the process set's
ranks otherwise. They never meet the engine's messages, which travel on the
engine's own communicators. A message's MPI tag is c10d's tag; the highest
tag MPI allows (TAG_UB) is kept for monitored_barrier. A message carries the
tensor's bytes: the receiver's tensor must have as many (its dtype is not
checked, as gloo does not).

A :class:`P2PWork` completes from its MPI requests. ``wait()`` tests them in
the calling thread, pausing between tests (from none to 1 ms, so a long wait
does not keep a core busy); ``get_future()`` hands them to one thread of this
module, which tests every watched work the same way and completes its
future, running the callbacks chained with ``then()`` there.
"""
import threading
import time
from datetime import timedelta

import numpy as np
import torch

from hvdlite import basics, exceptions

from .c10d_work import OutcomeWork, seconds

_SPIN_TESTS = 16            # tests without a pause before backing off
_FIRST_PAUSE_S = 10e-6
_MAX_PAUSE_S = 1e-3


def _backoff(tests, pause):
    """(tests, pause) after one more unsuccessful test: no pause for the
    first few, then a pause that doubles up to _MAX_PAUSE_S."""
    tests += 1
    if tests <= _SPIN_TESTS:
        return tests, 0.0
    return tests, min(_MAX_PAUSE_S, max(_FIRST_PAUSE_S, 2 * pause))


def make_comm(ranks):
    """The communicator of a group's messages: collective over ``ranks``
    (hvdlite ranks, increasing; None for all of them), which must all call it."""
    MPI = basics._mpi()
    base = basics._init_comm if basics._init_comm is not None else MPI.COMM_WORLD
    if ranks is None:
        return base.Dup()
    group = base.Get_group().Incl(list(ranks))
    try:
        return base.Create_group(group)
    finally:
        group.Free()


def _bytes(tensor):
    """A NumPy uint8 view of a contiguous CPU tensor's memory."""
    flat = tensor.detach().reshape(-1)
    return (flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)).numpy()


class P2PWork(OutcomeWork):
    """A send or receive (or several) over MPI requests; ``finish(statuses)``
    runs once they are complete and returns the future's value."""

    def __init__(self, requests, finish, what, timeout, keep=(), nbytes=0):
        super().__init__(what, timeout)
        self._nbytes = nbytes   # the tensor's, for errors
        MPI = basics._mpi()
        self._requests = requests
        self._statuses = [MPI.Status() for _ in requests]
        self._finish = finish
        self._keep = keep       # buffers MPI reads or writes until the requests complete
        self._watched = False

    def _test(self):
        """True once the work is finished; tests its requests otherwise
        (any thread; one at a time: MPI forbids testing a request twice at once)."""
        if self._outcome is not None:
            return True
        with self._outcome_lock:
            if self._outcome is not None:
                return True
            MPI = basics._mpi()
            try:
                if not MPI.Request.Testall(self._requests, self._statuses):
                    return False
                failure = None
            except MPI.Exception as e:
                failure = e
            self._settle_with(lambda: self._conclude(failure))
        return True

    def _conclude(self, failure):
        self._keep = ()
        if failure is not None:
            MPI = basics._mpi()
            code = failure.Get_error_code()
            if failure.Get_error_class() == MPI.ERR_IN_STATUS:
                code = next((s.Get_error() for s in self._statuses
                             if s.Get_error() != MPI.SUCCESS), code)
            text = MPI.Get_error_string(code).splitlines()[0].split(", error stack")[0]
            if MPI.Get_error_class(code) == MPI.ERR_TRUNCATE:
                raise exceptions.InvalidArgumentError(
                    f"{self._what}: the message is larger than the tensor's {self._nbytes} bytes "
                    f"(MPI: {text})")
            raise exceptions.MPIError(f"{self._what}: {text}")
        return self._finish(self._statuses)

    def wait(self, timeout=timedelta(0)):
        """Blocks until the messages are through and the results in place,
        at most ``timeout``, or the group's timeout where that is 0 (c10d's
        default); HvdliteTimeoutError after that (the work goes on)."""
        limit, words = self._wait_limit(timeout)
        deadline = time.monotonic() + limit if limit > 0 else None
        tests, pause = 0, 0.0
        while not self._test():
            if deadline is not None and time.monotonic() >= deadline:
                raise self._timed_out(words)
            tests, pause = _backoff(tests, pause)
            if pause:
                time.sleep(pause)
        return self._raise_outcome()

    def is_completed(self):
        return self._test()

    def get_future(self):
        with self._outcome_lock:
            watch, self._watched = not self._watched and self._outcome is None, True
        if watch:
            _poller().watch(self)
        return self._future

    def _source_rank(self):
        """The group rank a receive got its message from."""
        if self._outcome is None:
            raise exceptions.InvalidArgumentError(
                f"{self._what}: the source rank is known once the receive completed (wait() first)")
        return self._statuses[0].Get_source()

    source_rank = _source_rank


class _Poller:
    """One thread that tests the requests of every work a future was asked of."""

    def __init__(self):
        self._works = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hvdlite-c10d-p2p", daemon=True)
        self._thread.start()

    def watch(self, work):
        with self._cond:
            self._works.append(work)
            self._cond.notify()

    def _run(self):
        tests, pause = 0, 0.0
        while True:
            with self._cond:
                while not self._works:
                    self._cond.wait()
                    tests, pause = 0, 0.0
                works = list(self._works)
            finished = {id(w) for w in works if w._test()}
            if finished:
                with self._cond:
                    self._works = [w for w in self._works if id(w) not in finished]
                tests, pause = 0, 0.0
                continue
            tests, pause = _backoff(tests, pause)
            if pause:
                with self._cond:
                    if self._cond.wait(pause):  # a new work: test it at once
                        tests, pause = 0, 0.0


_the_poller = None
_poller_lock = threading.Lock()


def _poller():
    global _the_poller
    with _poller_lock:
        if _the_poller is None:
            _the_poller = _Poller()
        return _the_poller


class PointToPoint:
    """One group's messages: its communicator, sends, receives and
    monitored_barrier. Ranks are group ranks."""

    def __init__(self, comm, timeout):
        MPI = basics._mpi()
        self.comm = comm
        self.timeout = timeout
        self.barrier_tag = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        self.any_source = MPI.ANY_SOURCE
        self._barriers = 0      # monitored_barrier calls so far

    def _check(self, tensors, peer, tag, what):
        if len(tensors) != 1:
            raise exceptions.InvalidArgumentError(
                f"{what}: the hvdlite backend takes one tensor per message, not {len(tensors)}")
        tensor = tensors[0]
        if tensor.device.type != "cpu":
            raise exceptions.InvalidArgumentError(
                f"{what}: the hvdlite backend sends CPU tensors, not {tensor.device.type}")
        if peer is not None and not 0 <= peer < self.comm.Get_size():
            raise exceptions.InvalidArgumentError(
                f"{what}: rank {peer} is not in the group (size {self.comm.Get_size()})")
        if not 0 <= tag < self.barrier_tag:
            raise exceptions.InvalidArgumentError(
                f"{what}: tag {tag} is outside 0 to {self.barrier_tag - 1}, the tags MPI allows "
                "here (its highest, TAG_UB, is monitored_barrier's)")
        return tensor

    def send(self, tensors, dst, tag):
        tensor = self._check(tensors, dst, tag, "send")
        data = tensor.detach().contiguous()
        buf = _bytes(data)
        request = self.comm.Isend([buf, basics._mpi().BYTE], dst, tag)
        return P2PWork([request], lambda _statuses: [tensor], "send", self.timeout,
                       keep=(data, buf))

    def recv(self, tensors, src, tag):
        return self._recv(tensors, src, tag, "recv")

    def recv_anysource(self, tensors, tag):
        return self._recv(tensors, None, tag, "recv from any source")

    def _recv(self, tensors, src, tag, what):
        tensor = self._check(tensors, src, tag, what)
        MPI = basics._mpi()
        target = tensor.detach()
        into = target if target.is_contiguous() else torch.empty_like(target).contiguous()
        buf = _bytes(into)
        request = self.comm.Irecv([buf, MPI.BYTE], self.any_source if src is None else src, tag)

        def finish(statuses):
            got = statuses[0].Get_count(MPI.BYTE)
            if got != buf.nbytes:
                raise exceptions.InvalidArgumentError(
                    f"{what}: the tensor holds {buf.nbytes} bytes, but group rank "
                    f"{statuses[0].Get_source()} sent {got}")
            if into is not target:
                with torch.no_grad():
                    target.copy_(into)
            return [tensor]
        return P2PWork([request], finish, what, self.timeout, keep=(into, buf), nbytes=buf.nbytes)

    # ---- monitored_barrier
    def monitored_barrier(self, rank, timeout=None, wait_all_ranks=False):
        """torch's monitored_barrier, as gloo's: every rank reports to rank 0,
        which answers once all did. A rank that does not arrive within
        ``timeout`` (default: the group's) makes rank 0 raise naming it (all
        such ranks with ``wait_all_ranks``); the others raise when rank 0 does
        not answer in time. Each report carries the barrier's number, so a
        report that comes after its barrier failed is not taken for the next."""
        MPI = basics._mpi()
        limit = seconds(timeout) or seconds(self.timeout) or float("inf")
        deadline = time.monotonic() + limit
        seq, self._barriers = self._barriers, self._barriers + 1
        token = np.array([seq], dtype=np.int64)
        ms = "%d ms" % round(limit * 1000) if limit != float("inf") else "no time limit"
        if rank != 0:
            sent = self.comm.Isend([token, MPI.INT64_T], 0, self.barrier_tag)
            if self._tokens([0], seq, deadline):
                raise exceptions.HvdliteTimeoutError(
                    f"[Rank {rank}]: monitored_barrier: rank 0 did not answer within {ms} (rank "
                    "0 names the ranks that did not arrive)")
            sent.Wait()
            return
        missing = self._tokens(range(1, self.comm.Get_size()), seq, deadline)
        if missing:
            shown = missing if wait_all_ranks else missing[:1]
            raise exceptions.HvdliteTimeoutError(
                f"[Rank 0]: Rank{'s' if len(shown) > 1 else ''} {', '.join(map(str, shown))} "
                f"failed to pass monitoredBarrier in {ms}")
        MPI.Request.Waitall([self.comm.Isend([token, MPI.INT64_T], r, self.barrier_tag)
                             for r in range(1, self.comm.Get_size())])

    def _tokens(self, peers, seq, deadline):
        """Receives barrier ``seq``'s token from each of ``peers`` until
        ``deadline``; returns the peers whose token did not come (their
        receives cancelled). Tokens of earlier barriers are dropped."""
        MPI = basics._mpi()
        got = {p: np.zeros(1, dtype=np.int64) for p in peers}

        def post(p):
            return self.comm.Irecv([got[p], MPI.INT64_T], p, self.barrier_tag)
        pending = {p: post(p) for p in peers}
        tests, pause = 0, 0.0
        while pending and time.monotonic() < deadline:
            for p, request in list(pending.items()):
                if request.Test():
                    if got[p][0] == seq:
                        del pending[p]
                    else:
                        pending[p] = post(p)
            tests, pause = _backoff(tests, pause)
            if pending and pause:
                time.sleep(pause)
        missing = []
        for p, request in pending.items():
            status = MPI.Status()
            request.Cancel()
            request.Wait(status)
            if status.Is_cancelled() or got[p][0] != seq:
                missing.append(p)
        return missing


def free_comm(comm):
    """Frees a group's communicator (destroy_process_group), unless MPI has ended."""
    MPI = basics._mpi()
    if comm is not None and not MPI.Is_finalized() and comm != MPI.COMM_NULL:
        try:
            comm.Free()
        except MPI.Exception:
            pass
