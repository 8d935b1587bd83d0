"""The rank's side of an elastic job (see launcher/elastic.py for hvdrun's).

Under ``hvdrun --min-np/--max-np/--host-discovery-script`` every rank gets
HVDLITE_ELASTIC=1 and the job's run id, generation, hosts version and the
address of hvdrun's hosts-version service.  This module

* keeps each commit where a rank started again on the same host finds it:
  one file per host, ``$HVDLITE_ELASTIC_COMMIT_DIR`` (default /dev/shm)
  ``/hvdlite-elastic-<run id>/<hostname>/commit-<seq>.pkl``, written by the
  host's local rank 0 and renamed into place (a reader never sees half a
  commit);
* at the start of a generation has the ranks agree on the newest commit any
  host holds and broadcasts it from the lowest rank that holds it;
* asks hvdrun at each commit whether the hosts changed (rank 0 asks, every
  rank learns the answer by broadcast);
* leaves with EXIT_RESTART when the hosts changed or a peer was lost.

Outside an elastic hvdrun job none of this runs: ``context()`` is None.
"""
import glob
import os
import pickle
import shutil
import socket
import sys
import time

import numpy as np

from .. import basics, ops

EXIT_RESTART = 75           # the launcher's EXIT_RESTART (launcher/job.py)
_warned = set()


class ElasticContext:
    def __init__(self, env):
        self.run_id = env["HVDLITE_ELASTIC_RUN_ID"]
        self.generation = int(env.get("HVDLITE_ELASTIC_GENERATION", "1"))
        self.hosts_version = int(env.get("HVDLITE_ELASTIC_HOSTS_VERSION", "0"))
        self.driver = env.get("HVDLITE_ELASTIC_DRIVER")
        root = env.get("HVDLITE_ELASTIC_COMMIT_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
        self.job_dir = os.path.join(root, "hvdlite-elastic-%s" % self.run_id)
        self.host_dir = os.path.join(self.job_dir, socket.gethostname())


def context():
    """The elastic job this rank belongs to, or None outside elastic hvdrun."""
    if os.environ.get("HVDLITE_ELASTIC") != "1" or "HVDLITE_ELASTIC_RUN_ID" not in os.environ:
        return None
    return ElasticContext(os.environ)


def _warn_once(key, text):
    if key not in _warned:
        _warned.add(key)
        sys.stderr.write("hvdlite elastic: %s\n" % text)
        sys.stderr.flush()


# ---- commits on this host ------------------------------------------------------------

class CommitStore:
    """This host's newest commit, as a file in host memory."""

    def __init__(self, ctx):
        self.dir = ctx.host_dir

    def _path(self, seq):
        return os.path.join(self.dir, "commit-%012d.pkl" % seq)

    def newest(self):
        """The sequence number of the newest complete commit here, or -1."""
        seqs = [int(os.path.basename(p)[7:19]) for p in glob.glob(os.path.join(self.dir, "commit-*.pkl"))]
        return max(seqs, default=-1)

    def write(self, seq, payload):
        os.makedirs(self.dir, exist_ok=True)
        data = pickle.dumps({"seq": seq, "payload": payload}, protocol=pickle.HIGHEST_PROTOCOL)
        tmp = self._path(seq) + ".tmp.%d" % os.getpid()
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self._path(seq))
        for old in glob.glob(os.path.join(self.dir, "commit-*.pkl")):
            if old != self._path(seq):
                try:
                    os.unlink(old)
                except FileNotFoundError:
                    pass
        return len(data)

    def read(self, seq):
        with open(self._path(seq), "rb") as f:
            return f.read()


def persist(state):
    """Called by ``state.commit()`` after ``save()``: the host's local rank 0
    writes the commit to host memory.  Returns its size in bytes (0 when this
    rank writes nothing)."""
    ctx = context()
    if ctx is None or basics.local_rank() != 0:
        return 0
    return CommitStore(ctx).write(state._commit_seq, state._commit_payload())


# ---- hosts updates -------------------------------------------------------------------

def _ask_hosts_version(ctx):
    host, _, port = ctx.driver.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0) as s:
            s.sendall(b"version\n")
            answer = s.makefile("r").readline()
        return int(answer)
    except (OSError, ValueError) as e:
        _warn_once("driver", "cannot ask hvdrun at %s whether the hosts changed (%s); "
                   "training goes on with the hosts it has" % (ctx.driver, e))
        return ctx.hosts_version


def hosts_changed():
    """True on every rank when hvdrun's hosts version moved since this
    generation started (rank 0 asks; a broadcast tells the others)."""
    ctx = context()
    if ctx is None or not ctx.driver:
        return False
    version = _ask_hosts_version(ctx) if basics.rank() == 0 else 0
    agreed = ops.broadcast(np.array([version], dtype=np.int64), root_rank=0, name="elastic.hosts_version")
    return int(agreed[0]) != ctx.hosts_version


# ---- start of a generation -----------------------------------------------------------

# A commit crosses in pieces of this size: each piece is one engine wait,
# which HVDLITE_TIMEOUT_SECONDS bounds (a whole 1 GB commit over a 1 Gbit/s
# link would take longer than the elastic default of 10 s).
BROADCAST_PIECE_BYTES = 64 << 20


def _broadcast_bytes(data, root, name):
    length = ops.broadcast(np.array([len(data) if data is not None else 0], dtype=np.int64),
                           root_rank=root, name=name + ".length")
    total = int(length[0])
    out = bytearray(total)
    for offset in range(0, total, BROADCAST_PIECE_BYTES):
        end = min(total, offset + BROADCAST_PIECE_BYTES)
        piece = np.frombuffer(data, dtype=np.uint8, count=end - offset, offset=offset).copy() \
            if data is not None else np.empty(end - offset, dtype=np.uint8)
        out[offset:end] = ops.broadcast(piece, root_rank=root, name="%s.%d" % (name, offset)).tobytes()
    return bytes(out)


def resume(state, ctx):
    """Every rank takes the newest commit any host holds (or rank 0's state
    when there is none); after a restart, then runs the reset callbacks.
    Returns the commit's sequence number, or -1."""
    started = time.monotonic()
    store = CommitStore(ctx)
    mine = store.newest() if basics.local_rank() == 0 else -1
    seqs = ops.allgather(np.array([mine], dtype=np.int64), name="elastic.commits")
    best = int(seqs.max())
    if best < 0:
        state.sync()
    else:
        holder = int(np.flatnonzero(seqs == best)[0])
        data = _broadcast_bytes(store.read(best) if basics.rank() == holder else None, holder,
                                "elastic.commit")
        commit = pickle.loads(data)
        state._load_commit_payload(commit["payload"])
        state._commit_seq = commit["seq"]
        state.restore()
        if basics.rank() == 0:
            sys.stderr.write("hvdlite elastic: generation %d, %d ranks: resumed from commit %d "
                             "(held by rank %d) in %.2f s\n" % (ctx.generation, basics.size(), best, holder,
                                                                time.monotonic() - started))
            sys.stderr.flush()
    if ctx.generation > 1:
        state.on_reset()
    return best


def finish(ctx):
    """The training function returned on every rank: the commits are no
    longer needed."""
    ops.barrier()
    if basics.local_rank() == 0:
        shutil.rmtree(ctx.host_dir, ignore_errors=True)
        try:
            os.rmdir(ctx.job_dir)
        except OSError:
            pass


def leave(why):
    """Ends this rank for hvdrun to start the job again.  os._exit: the
    engine's peers are gone or leaving, and a normal exit would wait for them
    in MPI_Finalize."""
    try:
        who = "rank %d" % basics.rank()
    except Exception:       # the engine may be gone already
        who = "a rank"
    sys.stderr.write("hvdlite elastic: %s leaves for a restart: %s\n" % (who, why))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_RESTART)
