"""What ``state.commit()`` costs in an elastic job, split into its parts.

    hvdrun --min-np 2 -H localhost:2 python bench/elastic_commit.py
    hvdrun --min-np 2 -H localhost:2 python bench/elastic_commit.py --json out.json

For two torch states, the digits MLP of examples/pytorch_elastic_digits.py
(SGD with momentum) and a 100 MB one (Linear(5000, 5000), plain SGD), it
times on rank 0, over --repeat commits (median):

- save: the copy in process memory (``state.save()``: the state dicts'
  tensors copied into buffers allocated at the first save; what every
  commit does, elastic or not);
- persist: what the commit waits for of the write to /dev/shm: the host's
  local rank 0 hands the saved copy to the background writer (elastic jobs
  only);
- write: the background write itself (pickle, write, rename), timed here by
  waiting for it; the commit does not wait for it;
- host check: each rank reads the broadcast of rank 0's "hosts changed"
  flag started at the previous check, and starts the next (elastic jobs
  only; rank 0's thread asks hvdrun);
- commit: save + persist + host check, as the training loop sees it.

Run outside elastic hvdrun, persist, write and host check do nothing.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

import hvdlite.torch as hvd
from hvdlite.elastic import worker

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from pytorch_digits import make_model  # noqa: E402


def states():
    digits = make_model()
    yield "digits MLP", hvd.elastic.TorchState(
        model=digits, optimizer=torch.optim.SGD(digits.parameters(), lr=0.1, momentum=0.9), epoch=0)
    big = torch.nn.Linear(5000, 5000)
    yield "100 MB", hvd.elastic.TorchState(model=big, optimizer=torch.optim.SGD(big.parameters(), lr=0.1),
                                           epoch=0)


def state_bytes(state):
    return sum(t.numel() * t.element_size() for h in state._handlers.values()
               for t in _tensors(h.value.state_dict()))


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def timed(fn):
    hvd.barrier()
    start = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--json")
    args = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    elastic = worker.context() is not None
    rows = []
    for name, state in states():
        state.sync()
        parts = {"save": [], "persist": [], "write": [], "host check": [], "commit": []}
        written = 0
        for _ in range(args.repeat):
            parts["save"].append(timed(state.save))
            parts["persist"].append(timed(lambda: worker.persist(state)))
            worker.flush_commits()
            parts["write"].append(timed(lambda: worker.persist(state, wait=True)))
            parts["host check"].append(timed(worker.hosts_changed))
            parts["commit"].append(timed(state.commit))
            worker.flush_commits()
            written = max(written, worker.persist(state, wait=True))
        rows.append({"state": name, "state_mb": round(state_bytes(state) / 2**20, 1),
                     "written_mb": round(written / 2**20, 1),
                     **{k + "_ms": round(statistics.median(v), 4) for k, v in parts.items()}})
    if hvd.rank() == 0:
        print("elastic job: %s; %d ranks, %d per host; medians of %d"
              % ("yes" if elastic else "no (persist and host check do nothing)", hvd.size(),
                 hvd.local_size(), args.repeat))
        print("%-12s %7s %9s %10s %9s %9s %9s" % ("state", "MB", "save ms", "persist ms", "write ms",
                                                 "check ms", "commit ms"))
        for r in rows:
            print("%-12s %7.1f %9.3f %10.3f %9.3f %9.3f %9.3f"
                  % (r["state"], r["state_mb"], r["save_ms"], r["persist_ms"], r["write_ms"],
                     r["host check_ms"], r["commit_ms"]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"elastic": elastic, "ranks": hvd.size(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
