"""One rank fails while the others keep submitting collectives.

usage: reliability_failure.py TAG MODE VICTIM
  TAG      ignored; lets the test find leftover processes by command line
  MODE     raise     the victim dies of an unhandled ValueError
           raise_pending  the same, raised while it has pending async handles
           exit      the victim calls sys.exit(3)
           shutdown  the victim calls hvdlite.shutdown(), sleeps, exits 0
           sigkill   the victim SIGKILLs itself
           sigstop   the victim SIGSTOPs itself (a hung rank)
           stall     every rank but the victim submits one extra tensor
  VICTIM   the rank that fails

Every rank prints "READY <rank> <pid>" once warmed up, the victim prints
"FAIL_AT <time>" just before failing, and every survivor that sees an hvdlite
error prints "SURVIVOR <rank> ERROR_AT <time> <class>: <message>" and re-raises.
"""
import os
import signal
import sys
import time

import numpy as np

import hvdlite as hvd


def boom(rank):
    raise ValueError("simulated failure in rank %d" % rank)


def fail(mode, rank):
    print("FAIL_AT %.3f" % time.time(), flush=True)
    if mode == "raise":
        raise ValueError("simulated failure in rank %d" % rank)
    if mode == "raise_pending":
        # The exception unwinds past a list of pending handles that is being
        # built; dropping them must not wait for collectives no peer submits.
        x = np.ones(10, np.float32)
        [hvd.allreduce_async(x, name="pending.%d" % i) if i < 3 else boom(rank) for i in range(4)]
    if mode == "exit":
        sys.exit(3)
    if mode == "shutdown":
        hvd.shutdown()
        time.sleep(3)  # alive, but no longer in hvdlite, while the others submit
        sys.exit(0)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(600)
    raise SystemExit("unknown mode %r" % mode)


def main():
    mode, victim = sys.argv[2], int(sys.argv[3])
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    x = np.ones(1000, np.float32)
    hvd.allreduce(x, op=hvd.Sum, name="warmup")
    print("READY %d %d" % (r, os.getpid()), flush=True)
    keep = []
    if mode == "stall":
        # Every rank but the victim submits a tensor the victim never does;
        # all go on training, until the stall inspector stops them.
        print("FAIL_AT %.3f" % time.time(), flush=True)
        if r != victim:
            keep.append(hvd.allreduce_async(x, name="stalled"))
    elif r == victim:
        time.sleep(0.5)
        fail(mode, r)
    step = 0
    try:
        while True:  # a training loop: mixed collectives, some cached, some new
            got = hvd.allreduce(x, op=hvd.Sum, name="step.%d" % (step % 8))
            assert got[0] == n
            if step % 5 == 0:
                hvd.allgather(np.full((1, 3), r, np.int32), name="gather.%d" % step)
            step += 1
    except hvd.HvdliteError as e:
        print("SURVIVOR %d ERROR_AT %.3f %s: %s" % (r, time.time(), type(e).__name__, e),
              flush=True)
        raise


if __name__ == "__main__":
    main()
