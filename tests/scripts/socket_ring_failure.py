"""A rank fails while every rank's allreduces travel around the ring's own
sockets (HVDLITE_RING_WIRE=socket, forced on one host by the test; on fake
hosts of several ranks, the sockets of the ring between the hosts).

usage: socket_ring_failure.py TAG MODE VICTIM
  TAG      ignored; lets the test find leftover processes by command line
  MODE     sigstop   the victim SIGSTOPs itself mid-allreduce (a hung rank)
           abandon   the victim abandons its engine while its flight
                     recorder shows it inside a step's allreduce, which
                     closes its sockets (what its neighbours see of a rank
                     whose process died)
           between   the victim abandons its engine between two steps: its
                     neighbours wait in negotiation, on MPI, when the
                     sockets close
  VICTIM   the rank that fails

Prints as reliability_failure.py does: "READY <rank> <pid>", the victim's
"FAIL_AT <time>", and "SURVIVOR <rank> ERROR_AT <time> <class>: <message>"
for every other rank that sees an hvdlite error.
"""
import os
import signal
import sys
import threading
import time

import numpy as np

import hvdlite as hvd

BIG = 1 << 23  # 32 MB of float32 a reduction: most of a step is the ring's


def inside_a_step():
    """Whether this rank's engine is inside a step's collective (on the ring's
    sockets), not between two (where its neighbours wait in negotiation, on
    MPI, which does not see the sockets close)."""
    where = hvd.flight_recorder(summary=True)["in"]
    return where is not None and where["phase"] == "collective" and where["tensor"].startswith("step.")


def fail(mode):
    if mode == "abandon":
        deadline = time.time() + 10
        while not inside_a_step() and time.time() < deadline:
            time.sleep(0.001)
    print("FAIL_AT %.3f" % time.time(), flush=True)
    if mode == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif mode == "abandon":
        hvd.abandon("the test abandons this rank")


def main():
    mode, victim = sys.argv[2], int(sys.argv[3])
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    x = np.ones(BIG, np.float32)
    got = hvd.allreduce(x, op=hvd.Sum, name="warmup")
    if hvd.local_size() > 1:
        # Between hosts of several ranks (fake hosts) the allreduce is
        # hierarchical on MPI; the ring between the hosts carries the
        # compressed exchanges on its sockets.
        hvd.allreduce(x, op=hvd.Sum, name="warmup.fp16", compression=hvd.Compression.fp16)
    assert hvd.engine_stats()["socket_ring_collectives"] > 0, "the ring's sockets carried nothing"
    assert got[0] == n and got[-1] == n, got
    print("READY %d %d" % (r, os.getpid()), flush=True)
    if r == victim and mode != "between":
        threading.Timer(0.3, fail, (mode,)).start()
    step = 0
    try:
        while True:
            if r == victim and mode == "between" and step == 8:
                print("FAIL_AT %.3f" % time.time(), flush=True)
                hvd.abandon("the test abandons this rank between two steps")
            got = hvd.allreduce(x, op=hvd.Sum, name="step.%d" % (step % 4))
            assert got[0] == n and got[-1] == n, got
            step += 1
    except hvd.HvdliteError as e:
        if r != victim:
            print("SURVIVOR %d ERROR_AT %.3f %s: %s" % (r, time.time(), type(e).__name__, e), flush=True)
        # The other survivors' lines, before the launcher ends the job (the
        # victim's exit ends it too: it waits longer, for neighbours that hear
        # of it 2 s late, in negotiation).
        time.sleep(3 if r != victim else 6)
        os._exit(1)


if __name__ == "__main__":
    main()
