"""Rank script for hvdrun's tests that uses MPI through mpi4py (no hvdlite engine).

usage: launcher_mpi4py.py TAG MODE [ARGS]
  topology MB     JSON line per rank: host, world rank/size, local rank/size (shared-memory
                  split), cross rank/size, and the result of an MB-megabyte allreduce
  failing RANK    rank RANK announces its failure on stderr (as hvdlite's exit hook does)
                  and exits 3; it then waits in MPI_Finalize while the others wait in a
                  broadcast that never comes: only hvdrun can end this job
  vanish RANK     rank RANK ends with os._exit(3), without MPI_Finalize or a word (as a
                  crash in native code would); the others wait in a broadcast
"""

import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI


def topology(megabytes):
    world = MPI.COMM_WORLD
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    cross = world.Split(local.rank, world.rank)
    n = int(megabytes * 1024 * 1024 // 8)
    data = np.full(n, world.rank + 1, dtype=np.float64)
    out = np.empty_like(data)
    world.Allreduce(data, out, op=MPI.SUM)
    expected = world.size * (world.size + 1) / 2
    print(json.dumps({"rank": world.rank, "size": world.size, "host": socket.gethostname(),
                      "local_rank": local.rank, "local_size": local.size,
                      "cross_rank": cross.rank, "cross_size": cross.size,
                      "allreduce_ok": bool(n == 0 or (out == expected).all())}), flush=True)


def fail(bad_rank, mode):
    """Rank ``bad_rank`` fails as ``mode`` says (module docstring); the others
    wait in a broadcast from it that never comes."""
    world = MPI.COMM_WORLD
    print("READY %d" % world.rank, flush=True)
    world.Barrier()
    if world.rank == bad_rank:
        time.sleep(0.5)
        print("FAIL_AT %.3f" % time.time(), flush=True)
        if mode == "vanish":
            os._exit(3)
        sys.stderr.write('@hvdlite-ctl@ {"event": "failing", "code": 3, '
                         '"reason": "ValueError: simulated failure"}\n')
        sys.stderr.flush()
        sys.exit(3)         # mpi4py's exit hook now waits in MPI_Finalize for the others
    world.bcast(None, root=bad_rank)


if __name__ == "__main__":
    mode = sys.argv[2]
    if mode == "topology":
        topology(float(sys.argv[3]))
    elif mode in ("failing", "vanish"):
        fail(int(sys.argv[3]), mode)
    else:
        sys.exit("unknown mode %s" % mode)
