"""Rank script for in-place recovery tests: mpi4py only, on the communicator
from hvdlite.rendezvous.join() (no hvdlite engine).

usage: inplace_allreduce.py TAG [--steps N] [--count N] [--step-sleep S] [--withhold UID]
                             [--check-every N] [--pause UID:STEP ...] [--timeout S]

Each generation: check that the communicator holds the members hvdrun named,
in its order (an allgather of uids), agree on the step (the highest any member
reached), then allreduce ``arange(count) * (uid + 1)`` once a step and check it
against NumPy's sum. A notice from hvdrun (DEAD/REFORM) abandons the
communicator (a request may stay pending; it is never freed) and joins the
next generation. Every ``--check-every`` steps the members agree (an
allreduce of the flag) whether hvdrun pushed a new hosts version, as a
commit does, and all join the next generation if so. ``--withhold UID``:
that rank never joins again after a notice, as a survivor stuck inside MPI
would not. ``--pause UID:STEP``: that rank stops before the allreduce of
STEP and prints "paused", so that a test kills it while the others wait for
it inside the collective (a kill mid-transfer can leave a survivor stuck
inside MPI_Test, which the join deadline then leaves out). ``--timeout S``:
a wait longer than S seconds abandons the communicator too (the engine's
HVDLITE_TIMEOUT_SECONDS: how a silent host is noticed). Prints one JSON
line per event on stdout: gen, step, notice, hosts_changed, paused, withhold,
done (each with uid, pid and time).
"""

import argparse
import json
import os
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from hvdlite import rendezvous  # noqa: E402

UID = rendezvous.uid()


_emit_lock = threading.Lock()


def emit(ev, **fields):
    line = json.dumps(dict(fields, ev=ev, uid=UID, pid=os.getpid(), t=time.time())) + "\n"
    with _emit_lock:        # the notice comes from the watch thread
        sys.stdout.write(line)
        sys.stdout.flush()


class Abandoned(Exception):
    """The generation is over; ``step`` is the last one this rank completed."""

    step = None


TIMEOUT_S = [None]


def wait(request, notice):
    """Polls ``request`` as an engine would: a notice, or a wait past the
    timeout, abandons it."""
    started = time.monotonic()
    while not request.Test():
        if notice.is_set():
            raise Abandoned()
        if TIMEOUT_S[0] is not None and time.monotonic() - started > TIMEOUT_S[0]:
            emit("timeout")
            raise Abandoned()
        time.sleep(0.0002)


def run_generation(comm, generation, step, args, notice):
    progress = [step]
    try:
        return _steps(comm, generation, progress, args, notice)
    except Abandoned as e:
        e.step = progress[0]
        raise


def _steps(comm, generation, progress, args, notice):
    step = progress[0]
    members = rendezvous.current().members
    uids = np.empty(comm.Get_size(), dtype=np.int64)
    wait(comm.Iallgather(np.array([UID], dtype=np.int64), uids), notice)
    assert list(uids) == members, (list(uids), members)
    emit("gen", generation=generation, size=comm.Get_size(), rank=comm.Get_rank(), members=members)
    agreed = np.empty(1, dtype=np.int64)
    wait(comm.Iallreduce(np.array([step], dtype=np.int64), agreed, op=MPI.MAX), notice)
    step = progress[0] = int(agreed[0])
    base = np.arange(args.count, dtype=np.float64)
    expected = base * sum(u + 1 for u in members)
    while step < args.steps:
        if step % args.check_every == 0:
            changed = np.empty(1, dtype=np.int64)
            flag = np.array([int(rendezvous.watch().hosts_changed())], dtype=np.int64)
            wait(comm.Iallreduce(flag, changed, op=MPI.MAX), notice)
            if changed[0]:
                emit("hosts_changed", generation=generation, step=step)
                raise Abandoned()
        if step in args.pause.get(UID, ()):
            emit("paused", generation=generation, step=step)
            while True:
                time.sleep(1)
        out = np.empty_like(base)
        wait(comm.Iallreduce(base * (UID + 1), out, op=MPI.SUM), notice)
        assert np.array_equal(out, expected), "wrong sum at step %d of generation %d" % (step, generation)
        step += 1
        progress[0] = step
        emit("step", generation=generation, size=comm.Get_size(), rank=comm.Get_rank(), step=step)
        time.sleep(args.step_sleep)
    return step


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tag")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--step-sleep", type=float, default=0.01)
    p.add_argument("--withhold", type=int, default=-1)
    p.add_argument("--check-every", type=int, default=5)
    p.add_argument("--pause", action="append", default=[], metavar="UID:STEP")
    p.add_argument("--timeout", type=float)
    args = p.parse_args()
    TIMEOUT_S[0] = args.timeout
    pauses = {}
    for item in args.pause:
        who, _, at = item.partition(":")
        pauses.setdefault(int(who), set()).add(int(at))
    args.pause = pauses
    notice = threading.Event()

    def on_notice(reason):
        emit("notice", reason=reason)
        notice.set()

    rendezvous.watch().on_notice = on_notice
    generation, comm = rendezvous.join()
    step = 0
    while True:
        try:
            step = run_generation(comm, generation, step, args, notice)
            break
        except Abandoned as e:
            step = e.step       # drop comm as it is: a peer may be gone
        if UID == args.withhold:
            emit("withhold")
            while True:
                time.sleep(1)
        notice.clear()
        generation, comm = rendezvous.join()
    emit("done", generation=generation, step=step)


if __name__ == "__main__":
    main()
