"""Rank script: hvdlite.init() with no communicator under in-place recovery
forms the world at hvdrun's rendezvous; one allreduce through the engine.
Prints {"ev": "init", uid, rank, size, sum}. ``--raise UID``: that rank then
raises ValueError (an error of the training script, not a lost peer)."""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import hvdlite  # noqa: E402
from hvdlite import rendezvous  # noqa: E402

hvdlite.init()
total = hvdlite.allreduce(np.ones(2) * (hvdlite.rank() + 1), op=hvdlite.Sum, name="sum")
print(json.dumps({"ev": "init", "uid": rendezvous.uid(), "rank": hvdlite.rank(), "size": hvdlite.size(),
                  "sum": [float(x) for x in total]}), flush=True)
if "--raise" in sys.argv and rendezvous.uid() == int(sys.argv[sys.argv.index("--raise") + 1]):
    raise ValueError("a bug in the training script")
hvdlite.barrier()
