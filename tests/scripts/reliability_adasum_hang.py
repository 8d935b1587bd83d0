"""A rank stops (SIGSTOP) in the middle of an Adasum allreduce, whose
exchanges are point-to-point messages rather than one MPI collective: the
other ranks must still give up after HVDLITE_TIMEOUT_SECONDS.

usage: reliability_adasum_hang.py TAG
  TAG  ignored; lets the test find leftover processes by command line

Prints the lines reliability_failure.py prints (READY, FAIL_AT, SURVIVOR) and
"WAITED_IN <rank> <what timed out>" for each survivor.
"""
import os
import signal
import threading
import time

import numpy as np

import hvdlite as hvd

ELEMENTS = 8_000_000  # an Adasum of 32 MB takes 0.05-0.2 s on 4 ranks
STEPS = 1000  # far more than fit before the stop; a survivor never finishes them


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    victim = n - 1
    x = np.full(ELEMENTS, r + 1.0, np.float32)
    hvd.allreduce(x, op=hvd.Adasum, name="big")  # negotiated once: cached from now on
    print("READY %d %d" % (r, os.getpid()), flush=True)
    hvd.barrier()
    if r == victim:
        def stop():
            time.sleep(0.05)  # past the cached negotiation, inside the exchanges
            print("FAIL_AT %.3f" % time.time(), flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        threading.Thread(target=stop, daemon=True).start()
    try:
        # Every rank keeps reducing until the victim's stop lands: one Adasum
        # can finish in under 0.05 s on a fast machine, and a survivor that had
        # finished would then wait in MPI_Finalize for the stopped rank instead.
        # Nearly all of each step is spent in the exchanges, so that is where
        # the stop lands; the survivors report where they waited.
        for _ in range(STEPS):
            hvd.allreduce(x, op=hvd.Adasum, name="big")
        if r == victim:
            time.sleep(600)  # stopped by then; never gets here awake
        print("NOT_STOPPED %d" % r, flush=True)
    except hvd.HvdliteError as e:
        print("WAITED_IN %d %s" % (r, str(e).split(" did not complete")[0]), flush=True)
        print("SURVIVOR %d ERROR_AT %.3f %s: %s" % (r, time.time(), type(e).__name__, e), flush=True)
        raise


if __name__ == "__main__":
    main()
