"""Faults while the device executor runs collectives (HVDLITE_DEVICE_TRANSPORT=gloo).

usage: device_faults.py TAG MODE
  TAG   ignored; lets the test find leftover processes by command line
  MODE  shutdown  every rank submits large async allreduces and at once calls
                  hvdlite.shutdown(): each handle completes or raises
                  HvdliteShutdownError; nothing hangs
        raise     rank 1 dies of an unhandled ValueError while device
                  allreduces are in flight; the others' handles fail with an
                  error naming it

Prints "READY <rank> <pid>", the victim "FAIL_AT <time>", every survivor that
sees an error "SURVIVOR <rank> ERROR_AT <time> <class>: <message>", and with
mode shutdown "DONE <rank> <completed> <failed>".
"""
import os
import sys
import time

import torch

import hvdlite
import hvdlite.torch as hvd


def main():
    mode = sys.argv[2]
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    assert hvd.device.backend_name() == "gloo", "HVDLITE_DEVICE_TRANSPORT=gloo expected"
    got = hvd.allreduce(torch.ones(1000), op=hvd.Sum, name="warmup")
    assert torch.equal(got, torch.full((1000,), float(n)))
    print("READY %d %d" % (r, os.getpid()), flush=True)
    if mode == "shutdown":
        # The first rank to shut down stops the others' engines too: a rank
        # still submitting gets HvdliteShutdownError at once.
        handles, completed, failed = [], 0, 0
        for i in range(20):
            try:
                handles.append(hvd.allreduce_async(torch.full((1 << 20,), float(r)), name="big.%d" % i))
            except hvdlite.HvdliteShutdownError:
                failed += 1
        hvd.shutdown()
        for h in handles:
            try:
                out = hvd.synchronize(h)
                assert torch.equal(out, torch.full((1 << 20,), (n - 1) / 2.0)), "wrong result"
                completed += 1
            except hvdlite.HvdliteShutdownError:
                failed += 1
        print("DONE %d %d %d" % (r, completed, failed), flush=True)
        return
    step = 0
    try:
        while True:
            handles = [hvd.allreduce_async(torch.full((1 << 16,), 1.0), op=hvd.Sum, name="step.%d.%d" % (step % 4, i))
                       for i in range(4)]
            if r == 1 and step == 20:
                print("FAIL_AT %.3f" % time.time(), flush=True)
                raise ValueError("simulated failure in rank 1")
            for h in handles:
                assert hvd.synchronize(h)[0] == n
            step += 1
    except hvdlite.HvdliteError as e:
        print("SURVIVOR %d ERROR_AT %.3f %s: %s" % (r, time.time(), type(e).__name__, e), flush=True)
        raise


if __name__ == "__main__":
    main()
