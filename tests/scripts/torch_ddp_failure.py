"""A DDP training loop on the "hvdlite" backend in which one rank fails:
tests/test_torch_distributed.py's counterpart of reliability_failure.py
(the same usage, the same lines).

usage: torch_ddp_failure.py TAG MODE VICTIM
  TAG      ignored; lets the test find leftover processes by command line
  MODE     raise     the victim dies of an unhandled ValueError
           exit      the victim calls sys.exit(3)
           os_exit   the victim calls os._exit(3) (no exit handlers: as a kill)
           sigkill   the victim SIGKILLs itself
           sigstop   the victim SIGSTOPs itself (a hung rank)
           stall     every rank but the victim calls one dist.all_reduce of 7
                     elements that the victim skips; all go on training
           stall_future  the same, waiting on the all_reduce's future (as DDP
                     does), which no wait() timeout bounds
           shape     every rank calls one dist.all_reduce, of 7 + rank elements
  VICTIM   the rank that fails

TEST_GROUP_TIMEOUT_SECONDS, when set, is init_process_group's timeout.

Every rank prints "READY <rank> <pid>" once DDP has trained a step, the
victim (every rank, for stall) "FAIL_AT <time>" just before failing, and
every rank that sees an exception prints "SURVIVOR <rank> ERROR_AT <time>
<class>: <message>" and re-raises. The survivors are inside DDP's backward
(or the skipped all_reduce's wait) when it comes.
"""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hvdlite.torch  # noqa: F401  (registers the backend)


STALLS = ("stall", "stall_future", "shape")


def fail(mode, rank):
    print("FAIL_AT %.3f" % time.time(), flush=True)
    if mode == "raise":
        raise ValueError("simulated failure in rank %d" % rank)
    if mode == "exit":
        sys.exit(3)
    if mode == "os_exit":
        os._exit(3)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(600)
    raise SystemExit("unknown mode %r" % mode)


def main():
    mode, victim = sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    timeout = os.environ.get("TEST_GROUP_TIMEOUT_SECONDS")
    dist.init_process_group(backend="hvdlite", **(
        {"timeout": datetime.timedelta(seconds=float(timeout))} if timeout else {}))
    r = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i):
        g = torch.Generator().manual_seed(100 * i + r)
        model(torch.randn(4, 8, generator=g)).sum().backward()
        opt.step()
        opt.zero_grad()

    step(0)
    print("READY %d %d" % (r, os.getpid()), flush=True)
    started = time.time()
    i = 1
    try:
        while True:
            if mode in STALLS and i == 3:
                print("FAIL_AT %.3f" % time.time(), flush=True)
                if mode == "shape":
                    dist.all_reduce(torch.ones(7 + r))
                elif r != victim and mode == "stall":
                    dist.all_reduce(torch.ones(7))
                elif r != victim:
                    dist.all_reduce(torch.ones(7), async_op=True).get_future().wait()
            elif mode not in STALLS and r == victim and time.time() - started > 0.5:
                fail(mode, r)
            step(i)
            i += 1
    except Exception as e:
        if r == victim and mode not in STALLS:
            raise               # the simulated failure itself
        print("SURVIVOR %d ERROR_AT %.3f %s: %s" % (r, time.time(), type(e).__name__,
                                                    str(e).splitlines()[0]), flush=True)
        raise


if __name__ == "__main__":
    main()
