"""What ``state.commit()`` costs in an elastic job, split into its parts.

    hvdrun --min-np 2 -H localhost:2 python bench/elastic_commit.py
    hvdrun --min-np 2 -H localhost:2 python bench/elastic_commit.py --json out.json

For two torch states, the digits MLP of examples/pytorch_elastic_digits.py
(SGD with momentum) and a 100 MB one (Linear(5000, 5000), plain SGD), it
times on rank 0, over --repeat commits (median):

- save: the copy in process memory (``state.save()``, a deep copy of the
  state dicts; what every commit does, elastic or not);
- persist: the host's local rank 0 pickles the saved copy and writes it to
  /dev/shm (elastic jobs only);
- host check: rank 0 asks hvdrun whether the hosts changed and broadcasts
  the answer (elastic jobs only);
- commit: all of it, as the training loop sees it.

Run outside elastic hvdrun, persist and host check do nothing.
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
        parts = {"save": [], "persist": [], "host check": [], "commit": []}
        written = 0
        for _ in range(args.repeat):
            parts["save"].append(timed(state.save))
            parts["persist"].append(timed(lambda: worker.persist(state)))
            parts["host check"].append(timed(worker.hosts_changed))
            parts["commit"].append(timed(state.commit))
            written = max(written, worker.persist(state))
        rows.append({"state": name, "state_mb": round(state_bytes(state) / 2**20, 1),
                     "written_mb": round(written / 2**20, 1),
                     **{k + "_ms": round(statistics.median(v), 2) for k, v in parts.items()}})
    if hvd.rank() == 0:
        print("elastic job: %s; %d ranks, %d per host; medians of %d"
              % ("yes" if elastic else "no (persist and host check do nothing)", hvd.size(),
                 hvd.local_size(), args.repeat))
        print("%-12s %9s %9s %9s %11s %9s" % ("state", "MB", "save ms", "persist ms", "check ms", "commit ms"))
        for r in rows:
            print("%-12s %9.1f %9.2f %9.2f %11.2f %9.2f" % (r["state"], r["state_mb"], r["save_ms"],
                                                           r["persist_ms"], r["host check_ms"], r["commit_ms"]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"elastic": elastic, "ranks": hvd.size(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
