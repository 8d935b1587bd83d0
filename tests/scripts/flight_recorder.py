"""The engine's flight recorder on real ranks (tests/test_flight_recorder.py).

usage: flight_recorder.py TAG MODE
  TAG     ignored; lets the test find leftover processes by command line
  MODE    getter  a few allreduces, then hvdlite.flight_recorder() on every rank
                  (default size), again with HVDLITE_FLIGHT_RECORDER_EVENTS=8 after
                  100 allreduces, and with 0; prints "CHECKED <rank>"
          kill    the last rank SIGKILLs itself while the others are in an allreduce
                  it never submits (run under hvdrun)
          usr1    rank 0 waits for an allreduce that rank 1 submits only after it
                  sent rank 0 SIGUSR1; prints "DONE <rank>" (run under hvdrun)
"""
import os
import signal
import sys
import time

import numpy as np

import hvdlite as hvd


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def getter():
    # Default size: every step of every tensor, in order.
    hvd.init()
    x = np.ones(100, np.float32)
    names = ["grad.%d" % i for i in range(5)]
    for name in names:
        hvd.allreduce(x, name=name)
    # A handle completes just before the engine records its collective's end.
    deadline = time.time() + 5
    while True:
        events = hvd.flight_recorder()
        if events[-1]["kind"] == "collective_end" or time.time() > deadline:
            break
        time.sleep(0.01)
    kinds = [e["kind"] for e in events]
    seqs = [e["seq"] for e in events]
    check(seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "events out of order: %s" % seqs)
    enqueued = [e["name"] for e in events if e["kind"] == "enqueued"]
    check(enqueued == names, "enqueued %s, submitted %s" % (enqueued, names))
    for name in names:
        mine = [e["kind"] for e in events if e.get("name") == name]
        check(mine[:2] == ["enqueued", "decided"] and "collective_start" in mine and "collective_end" in mine,
              "%s: %s" % (name, mine))
    start = next(e for e in events if e["kind"] == "collective_start")
    check(start["op"] == "allreduce" and start["dtype"] == "float32" and start["bytes"] == 400 and start["detail"],
          "collective_start: %s" % start)
    check(all(e["ok"] for e in events if e["kind"] == "collective_end"), "a collective failed: %s" % kinds)
    decided = next(e for e in events if e["kind"] == "decided")
    check(decided["how"] in ("negotiated", "cache"), "decided: %s" % decided)
    summary = hvd.flight_recorder(summary=True)
    check(summary["rank"] == hvd.rank() and summary["in"] is None and summary["lost"] == [], "summary: %s" % summary)
    check(summary["last_decisions"][-1].startswith("grad.4 "), "last decisions: %s" % summary["last_decisions"])
    hvd.barrier()   # no rank shuts down (which stops every engine) before all have looked
    hvd.shutdown()

    # A ring of 8 after 100 allreduces keeps the last 8 events.
    os.environ["HVDLITE_FLIGHT_RECORDER_EVENTS"] = "8"
    hvd.init()
    for i in range(100):
        hvd.allreduce(x, name="step.%d" % i)
    events = hvd.flight_recorder()
    summary = hvd.flight_recorder(summary=True)
    check(len(events) == 8 and summary["capacity"] == 8 and summary["dropped"] > 0, "%d events" % len(events))
    check([e["seq"] for e in events] == list(range(events[0]["seq"], events[0]["seq"] + 8)), "not the last 8")
    steps = {int(e["name"].split(".")[1]) for e in events if "name" in e}
    check(steps and min(steps) >= 97, "old events kept: %s" % sorted(steps))
    hvd.barrier()
    hvd.shutdown()

    # 0: off.
    os.environ["HVDLITE_FLIGHT_RECORDER_EVENTS"] = "0"
    hvd.init()
    hvd.allreduce(x, name="off")
    check(hvd.flight_recorder() == [], "a recorder of size 0 recorded")
    hvd.barrier()
    print("CHECKED %d" % hvd.rank(), flush=True)
    hvd.shutdown()


def kill():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    x = np.ones(1000, np.float32)
    hvd.allreduce(x, name="warmup")
    print("READY %d %d" % (r, os.getpid()), flush=True)
    if r == n - 1:
        time.sleep(0.5)
        print("FAIL_AT %.3f" % time.time(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    step = 0
    while True:    # the others: a training loop that ends in an allreduce rank n-1 never submits
        hvd.allreduce(x, name="step.%d" % step)
        step += 1


def usr1():
    hvd.init()
    r = hvd.rank()
    pids = [int(p) for p in hvd.allgather(np.array([os.getpid()], np.int64), name="pids")]
    x = np.ones(10, np.float32)
    if r == 1:
        time.sleep(1.0)     # rank 0 is waiting for "late" by now
        os.kill(pids[0], signal.SIGUSR1)
        time.sleep(1.0)
    got = hvd.allreduce(x, op=hvd.Sum, name="late")
    check(got[0] == hvd.size(), "late: %s" % got[0])
    hvd.allreduce(x, name="after")
    print("DONE %d" % r, flush=True)


def main():
    mode = sys.argv[2]
    {"getter": getter, "kill": kill, "usr1": usr1}[mode]()


if __name__ == "__main__":
    main()
