"""Rank script for hvdrun's tests that needs no MPI at all (so it tests only the launcher).

usage: launcher_rank.py TAG MODE [ARGS]
  TAG is ignored; it is there so tests can find leftover processes by command line.
  info              print one JSON line: rank, size, host, selected environment
  spray N           print N lines of many lengths, written in random pieces
  exit RANK CODE    rank RANK exits with CODE after 1 s; the others sleep
  kill RANK         rank RANK SIGKILLs itself after 1 s; the others sleep
  sleep             every rank sleeps (to be stopped with a signal)
Ranks print "READY <rank>" when they are running, and "FAIL_AT <time>" just before failing.
"""

import json
import os
import random
import signal
import socket
import sys
import time


def rank_size():
    for r, s in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    return 0, 1


def spray(rank, n):
    """Lines of 0..9000 bytes, each written in random pieces with a flush after each
    piece, so any launcher that forwards bytes as they come would mix them."""
    rnd = random.Random(rank)
    out = sys.stdout.buffer
    for i in range(n):
        body = b"%d:%d:" % (rank, i) + bytes([97 + rank % 26]) * rnd.choice([0, 10, 100, 1000, 3000, 5000, 9000])
        line = body + b"\n"
        pos = 0
        while pos < len(line):
            k = rnd.randint(1, 3000)
            out.write(line[pos:pos + k])
            out.flush()
            pos += k
    sys.stderr.write("stderr line from rank %d\n" % rank)


def main():
    mode = sys.argv[2]
    rank, size = rank_size()
    if mode == "info":
        env = {k: v for k, v in os.environ.items()
               if k.startswith(("HVDLITE_", "TEST_", "UCX_NET", "NCCL_SOCKET"))}
        line = json.dumps({"rank": rank, "size": size, "host": socket.gethostname(), "env": env,
                           "cwd": os.getcwd()})
        sys.stdout.write(line + "\n")  # one write: ranks share a pipe
        sys.stdout.flush()
        return 0
    if mode == "spray":
        spray(rank, int(sys.argv[3]))
        return 0
    print("READY %d" % rank, flush=True)
    if mode in ("exit", "kill") and rank == int(sys.argv[3]):
        time.sleep(1)
        print("FAIL_AT %.3f" % time.time(), flush=True)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return int(sys.argv[4])
    time.sleep(120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
