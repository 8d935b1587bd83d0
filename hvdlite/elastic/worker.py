"""The rank's side of an elastic job (see launcher/elastic.py for hvdrun's).

Under ``hvdrun --min-np/--max-np/--host-discovery-script`` every rank gets
HVDLITE_ELASTIC=1 and the job's run id, generation, hosts version and the
address of hvdrun's hosts-version service.  This module

* keeps each commit where a rank started again on the same host finds it:
  one file per host, ``$HVDLITE_ELASTIC_COMMIT_DIR`` (default /dev/shm)
  ``/hvdlite-elastic-<run id>/<hostname>/commit-<seq>.pkl``, written by a
  background thread of the host's local rank 0 and renamed into place (a
  reader never sees half a commit). The commit does not wait for it: when
  a write is still running, the next one writes the newest commit after it
  (commits in between are skipped); leaving for a restart and the end of
  training wait for the newest;
* at the start of a generation has the ranks agree on the newest commit any
  host holds and broadcasts it from the lowest rank that holds it;
* learns whether the hosts changed: a thread of rank 0 asks hvdrun every
  HVDLITE_ELASTIC_HOSTS_POLL_MS (default 200) ms; at each commit rank 0
  starts a broadcast of what it knows, which the next commit reads (done
  by then: no wait), so every rank gets the same answer at the same commit;
* leaves with EXIT_RESTART when the hosts changed or a peer was lost.

Outside an elastic hvdrun job none of this runs: ``context()`` is None.
"""
import atexit
import glob
import os
import pickle
import shutil
import socket
import sys
import threading
import time

import numpy as np

from .. import basics, ops, rendezvous

EXIT_RESTART = 75           # the launcher's EXIT_RESTART (launcher/job.py)
_warned = set()


class ElasticContext:
    def __init__(self, env):
        self.run_id = env["HVDLITE_ELASTIC_RUN_ID"]
        self.generation = int(env.get("HVDLITE_ELASTIC_GENERATION", "1"))
        self.hosts_version = int(env.get("HVDLITE_ELASTIC_HOSTS_VERSION", "0"))
        # In place, the process outlives generations: the one it is in now.
        self.in_place = rendezvous.in_place()
        if self.in_place and _in_place_generation is not None:
            self.generation, self.hosts_version = _in_place_generation
        self.driver = env.get("HVDLITE_ELASTIC_DRIVER")
        root = env.get("HVDLITE_ELASTIC_COMMIT_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
        self.job_dir = os.path.join(root, "hvdlite-elastic-%s" % self.run_id)
        self.host_dir = os.path.join(self.job_dir, socket.gethostname())


_in_place_generation = None     # (number, hosts version) under in-place recovery


def start_generation(number, hosts_version):
    """Under in-place recovery: this process now runs in generation
    ``number``, formed with hvdrun's hosts version ``hosts_version``. The
    hosts agreement of the previous generation (its broadcast was on the
    abandoned engine; rank 0 may be another process now) is dropped."""
    global _in_place_generation, _agreement
    _in_place_generation = (number, hosts_version)
    if _agreement is not None:
        if _agreement.watch is not None:
            _agreement.watch.stop()
        _agreement = None


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


class Persister:
    """Writes commits to a CommitStore from a background thread: the newest
    one submitted, one at a time."""

    def __init__(self, store):
        self.store = store
        self.written = 0            # bytes of the last write
        self._cond = threading.Condition()
        self._ticket = None         # the newest commit not yet taken
        self._busy = False
        self._error = None
        self._thread = None

    def submit(self, ticket):
        with self._cond:
            self._raise_error()
            self._ticket = ticket
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hvdlite-elastic-persist",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout=None):
        """Waits until the newest submitted commit is written; False when
        ``timeout`` (seconds) passed first. Raises the writer's error."""
        with self._cond:
            done = self._cond.wait_for(lambda: self._ticket is None and not self._busy, timeout)
            self._raise_error()
            return done

    def _raise_error(self):
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("hvdlite elastic: writing a commit to %s failed: %s"
                               % (self.store.dir, error)) from error

    def _run(self):
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._ticket is not None)
                ticket, self._ticket = self._ticket, None
                self._busy = True
            try:
                taken = ticket.acquire()
                while taken is None:        # a save is writing into it: it ends soon
                    time.sleep(0.0002)
                    taken = ticket.acquire()
                try:
                    self.written = self.store.write(*taken)
                finally:
                    ticket.release()
            except BaseException as e:      # noqa: BLE001 - raised by the next commit
                self._error = e
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


_persister = None


def _the_persister(ctx):
    global _persister
    if _persister is None or _persister.store.dir != ctx.host_dir:
        if _persister is None:
            atexit.register(_flush_at_exit)
        else:
            _persister.flush()
        _persister = Persister(CommitStore(ctx))
    return _persister


def _flush_at_exit():
    # The writer is a daemon thread: an exit would cut its write short
    # (harmless: the file is renamed into place only when complete), and
    # the newest commit would not be there.
    try:
        flush_commits(timeout=60.0)
    except RuntimeError as e:
        sys.stderr.write("%s\n" % e)


def persist(state, wait=False):
    """Called by ``state.commit()`` after ``save()``: the host's local rank 0
    hands the commit to the background writer. With ``wait``, waits until it
    is written and returns its size in bytes; otherwise returns 0 (as a rank
    that writes nothing does)."""
    ctx = context()
    # In place, survivors restore from their own memory and newcomers get
    # the state from a peer: no commit goes to the host's shared memory.
    if ctx is None or ctx.in_place or basics.local_rank() != 0:
        return 0
    persister = _the_persister(ctx)
    persister.submit(state._persist_ticket())
    if wait:
        persister.flush()
        return persister.written
    return 0


def flush_commits(timeout=None):
    """Waits until the newest commit handed to the background writer is
    written (no-op where there is none)."""
    if _persister is not None:
        return _persister.flush(timeout)
    return True


# ---- hosts updates -------------------------------------------------------------------

def _ask_hosts_version(ctx):
    host, _, port = ctx.driver.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0) as s:
            s.sendall(rendezvous.first_line("version"))
            answer = s.makefile("r").readline()
        return int(answer)
    except (OSError, ValueError) as e:
        _warn_once("driver", "cannot ask hvdrun at %s whether the hosts changed (%s); "
                   "training goes on with the hosts it has" % (ctx.driver, e))
        return ctx.hosts_version


class HostsWatch:
    """Rank 0's thread asking hvdrun for its hosts version every ``poll_s``
    seconds; ``changed`` becomes True (and stays) when it moved."""

    def __init__(self, ctx, poll_s):
        self.ctx = ctx
        self.poll_s = poll_s
        self.changed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hvdlite-elastic-hosts", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            if _ask_hosts_version(self.ctx) != self.ctx.hosts_version:
                self.changed = True
                return
            self._stop.wait(self.poll_s)

    def stop(self):
        self._stop.set()


class PushedHosts:
    """Rank 0's view of the hosts under in-place recovery: hvdrun pushes its
    hosts version on the rank's watch connection (no polling)."""

    @property
    def changed(self):
        return rendezvous.watch().hosts_changed()

    def stop(self):
        pass


class HostsAgreement:
    """Every rank's answer to "did the hosts change?", the same on every
    rank at the same call: each call reads the broadcast the previous call
    started (rank 0's flag then; finished by now, as ranks ran a training
    step in between) and starts the next one."""

    def __init__(self, ctx):
        self.ctx = ctx
        poll_ms = float(os.environ.get("HVDLITE_ELASTIC_HOSTS_POLL_MS", "200"))
        if poll_ms <= 0:
            raise ValueError("HVDLITE_ELASTIC_HOSTS_POLL_MS must be > 0, not %r"
                             % os.environ["HVDLITE_ELASTIC_HOSTS_POLL_MS"])
        if basics.rank() != 0:
            self.watch = None
        elif ctx.in_place:
            self.watch = PushedHosts()
        else:
            self.watch = HostsWatch(ctx, poll_ms / 1e3)
        self._handle = None

    def changed(self):
        decided = False
        if self._handle is not None:
            handle, self._handle = self._handle, None
            decided = bool(ops.synchronize(handle)[0])
        if basics.size() == 1:
            return decided or self.watch.changed
        if not decided:
            flag = 1 if self.watch is not None and self.watch.changed else 0
            self._handle = ops.broadcast_async(np.array([flag], dtype=np.int64), root_rank=0,
                                               name="elastic.hosts_changed")
        return decided

    def drain(self):
        """Finishes the broadcast in flight (all ranks call it together)."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            ops.synchronize(handle)
        if self.watch is not None:
            self.watch.stop()


_agreement = None


def hosts_changed():
    """True on every rank, at the same call, when hvdrun's hosts version
    moved since this generation started (see HostsAgreement)."""
    global _agreement
    ctx = context()
    if ctx is None or not (ctx.driver or ctx.in_place):
        return False
    if _agreement is None or _agreement.ctx.run_id != ctx.run_id:
        _agreement = HostsAgreement(ctx)
    return _agreement.changed()


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
    global _agreement
    if _agreement is not None:
        _agreement.drain()
        _agreement = None
    ops.barrier()
    flush_commits()
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
    try:
        if not flush_commits(timeout=60.0):
            sys.stderr.write("hvdlite elastic: %s: the newest commit was not written within 60 s\n" % who)
    except RuntimeError as e:
        sys.stderr.write("%s\n" % e)
    sys.stderr.write("hvdlite elastic: %s leaves for a restart: %s\n" % (who, why))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_RESTART)
