"""The rank's side of hvdrun's rendezvous, under in-place recovery.

Under ``hvdrun --recovery in-place`` (docs/elastic.md) every rank is its own
MPI job: MPI_COMM_WORLD holds this process only. The job's communicator is
formed at hvdrun's rendezvous (launcher/rendezvous_server.py has the
protocol), generation after generation: the first from every rank hvdrun
started, each later one from the ranks still there after a rank was lost, and
from the ranks hvdrun started for new hosts.

- ``join()`` joins the next generation and returns its communicator (an
  mpi4py intracommunicator, ranks in the order hvdrun gave), built by MPI
  connect/accept: every rank opens a port, member k connects to member k-1's
  port while the members merged so far accept it together (one connect per
  port; several on one port fail intermittently on the ofi netmod).
  ``hvdlite.init()`` calls it when given no communicator.
- ``watch()`` is this process's connection for hvdrun's pushes: the notice
  that the current generation is over (a member died, or one already left
  for the next generation) calls ``Watch.on_notice``; a new hosts version
  (ranks for new hosts wait at the rendezvous) is ``Watch.hosts_changed()``.

This module needs no torch and no engine; it imports mpi4py when it joins.
"""
import atexit
import os
import socket
import sys
import threading
import time

from .exceptions import HvdliteError

RENDEZVOUS_VAR = "HVDLITE_ELASTIC_RENDEZVOUS"     # host:port of hvdrun's rendezvous
UID_VAR = "HVDLITE_ELASTIC_UID"                   # this rank process's id in the job
TOKEN_VAR = "HVDLITE_ELASTIC_TOKEN"               # hvdrun's token for this job
CONNECT_TIMEOUT_VAR = "HVDLITE_ELASTIC_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 2
TCP_CONNECT_TIMEOUT_S = 10.0
FORM_ATTEMPTS = 3           # failed connect/accept chains in a row before join() gives up


class RendezvousError(HvdliteError):
    """This rank cannot join a generation at hvdrun's rendezvous."""


class LeftOutError(RendezvousError):
    """hvdrun left this rank out: it did not join in time (hvdrun stops it)."""


class JobOverError(RendezvousError):
    """hvdrun ended the job (training finished, hvdrun gave up, or it is stopping)."""


class Generation:
    """One generation of the job's communicator, as hvdrun formed it."""

    def __init__(self, number, rank, size, hosts_version, members, comm=None):
        self.number = number
        self.rank = rank
        self.size = size
        self.hosts_version = hosts_version
        self.members = members      # uids, in rank order
        self.comm = comm

    def __repr__(self):
        return "Generation(%d, rank %d of %d, uids %s)" % (self.number, self.rank, self.size, self.members)


def in_place():
    """True when this rank runs under hvdrun's in-place recovery."""
    return bool(os.environ.get(RENDEZVOUS_VAR)) and os.environ.get(UID_VAR, "").isdigit()


def uid():
    """This rank process's id in the job (its output prefix under hvdrun)."""
    return int(os.environ[UID_VAR])


def first_line(request):
    """A connection's first line to hvdrun: the job's token, then the request."""
    return ("%s %s\n" % (os.environ.get(TOKEN_VAR, "-"), request)).encode()


def _address():
    host, _, port = os.environ[RENDEZVOUS_VAR].rpartition(":")
    return host.strip("[]"), int(port)


class Watch:
    """A daemon thread holding this rank's connection to hvdrun for its pushes.

    ``on_notice(reason)`` is called from this thread, at most once per
    generation, when the generation this rank is in is over: a member ended
    (``DEAD``) or a member left for the next generation (``REFORM``). It
    should stop the rank's collectives promptly and must not block (e.g.
    ``hvdlite.abandon``); the rank then calls ``join()``. No notice comes
    after the rank called ``leave()`` or while it is inside ``join()``: a
    generation that loses a member while it forms is joined again there."""

    def __init__(self, on_notice=None):
        self.on_notice = on_notice
        self.hosts_version = 0      # the newest pushed
        self.closed = False         # hvdrun closed the connection
        self._lock = threading.Lock()
        self._generation = None     # the Generation this rank is in
        self._joining = True
        self._dead = {}             # uid -> why, of every member announced dead
        self._reformed = set()      # generations some member left
        self._noticed = set()       # generations whose notice was delivered
        self._sock = socket.create_connection(_address(), timeout=TCP_CONNECT_TIMEOUT_S)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(first_line("WATCH %d" % uid()))
        self._lines = self._sock.makefile("r")
        first = self._lines.readline().split()
        if len(first) != 2 or first[0] != "WATCHING":
            self._sock.close()
            raise JobOverError("hvdrun's rendezvous refused this rank's watch connection "
                               "(the job is over, this rank was left out, or its %s is not the "
                               "job's)" % TOKEN_VAR)
        self.hosts_version = int(first[1])
        self._sock.settimeout(None)
        # A watch connection that closes without BYE tells hvdrun at once that
        # this process ended (killed, or left with os._exit): the kernel closes
        # it, sooner than the rank's exit reaches hvdrun through MPI's launcher.
        atexit.register(self._say_bye)
        threading.Thread(target=self._run, name="hvdlite-rendezvous-watch", daemon=True).start()

    def _say_bye(self):
        try:
            self._sock.sendall(b"BYE\n")
        except OSError:
            pass

    def hosts_changed(self):
        """True when hvdrun pushed a hosts version newer than the one of the
        generation this rank joined last: ranks for new hosts wait to join."""
        with self._lock:
            joined = self._generation.hosts_version if self._generation else 0
            return self.hosts_version > joined

    def _run(self):
        try:
            for line in self._lines:
                try:
                    self._take(line.rstrip("\n").split(" ", 3))
                except (ValueError, IndexError):
                    sys.stderr.write("hvdlite rendezvous: cannot read hvdrun's push %r\n" % line)
        except OSError:
            pass
        self.closed = True

    def _take(self, words):
        notice = None
        with self._lock:
            if words[0] == "HOSTS":
                self.hosts_version = max(self.hosts_version, int(words[1]))
            elif words[0] == "DEAD":
                dead = int(words[2])
                self._dead[dead] = words[3] if len(words) > 3 else "ended"
                gen = self._generation
                if gen is not None and dead in gen.members and dead != uid():
                    notice = "rank %d (uid %d) of generation %d ended: %s" % (
                        gen.members.index(dead), dead, gen.number, self._dead[dead])
            elif words[0] == "REFORM":
                number, who = int(words[1]), int(words[2])
                self._reformed.add(number)
                gen = self._generation
                if gen is not None and gen.number == number and who != uid():
                    notice = "rank %d (uid %d) left generation %d for the next one" % (
                        gen.members.index(who) if who in gen.members else -1, who, number)
            if notice is None or self._joining or self._generation.number in self._noticed:
                return
            self._noticed.add(self._generation.number)
        callback = self.on_notice
        if callback is not None:
            try:
                callback(notice)
            except Exception as e:  # noqa: BLE001 - the watch thread must go on
                sys.stderr.write("hvdlite rendezvous: the notice callback raised %r\n" % e)

    def say_stopped(self):
        """Tells hvdrun that this rank's collectives of its generation have
        stopped (after a notice): hvdrun then waits for its join past the join
        deadline, up to its rejoin timeout, since nothing can hold the rank in
        MPI any more; its training thread may take a while to get to join()."""
        with self._lock:
            if self._generation is None or self._joining:
                return
            number = self._generation.number
        try:
            self._sock.sendall(b"STOPPED %d\n" % number)
        except OSError:
            pass

    def leave(self):
        """This rank leaves its generation on its own (it is going to join the
        next one, e.g. after HostsUpdatedInterrupt): no notice for it from now
        on. join() calls it too."""
        with self._lock:
            self._joining = True

    def _enter(self, generation):
        """join() formed ``generation``: the rank is in it unless it is over
        already (a member died or left while it formed); returns whether it is."""
        with self._lock:
            if generation.number in self._reformed or \
                    any(u in self._dead for u in generation.members if u != uid()):
                return False
            self._generation = generation
            self._joining = False
            return True

    def generation(self):
        with self._lock:
            return None if self._joining else self._generation


_watch = None
_watch_lock = threading.Lock()


def watch():
    """This process's Watch (connected on the first call)."""
    global _watch
    with _watch_lock:
        if _watch is None:
            if not in_place():
                raise RendezvousError("this rank does not run under hvdrun's in-place recovery "
                                      "(%s is not set)" % RENDEZVOUS_VAR)
            _watch = Watch()
        return _watch


def current():
    """The Generation this rank is in (None before the first join() returns
    and while it joins)."""
    return _watch.generation() if _watch is not None else None


def _mpi():
    from mpi4py import MPI
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    return MPI


def _ask(port, timeout):
    """One JOIN: (Generation, port to connect to, the connection, on which the
    rank says DONE once it holds the communicator), or raises LeftOutError /
    JobOverError."""
    s = None
    try:
        s = socket.create_connection(_address(), timeout=TCP_CONNECT_TIMEOUT_S)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(first_line("JOIN %d %s" % (uid(), port)))
        s.settimeout(timeout)
        line = s.makefile("r").readline()
    except socket.timeout:
        s.close()
        raise RendezvousError("no generation formed at hvdrun's rendezvous within %g s" % timeout) from None
    except OSError as e:
        if s is not None:
            s.close()
        raise JobOverError("cannot reach hvdrun's rendezvous at %s (%s): the job is over"
                           % (os.environ[RENDEZVOUS_VAR], e)) from None
    words = line.rstrip("\n").split(" ")
    if words[0] == "MEMBER" and len(words) == 7:
        generation = Generation(int(words[1]), int(words[2]), int(words[3]), int(words[4]),
                                [int(u) for u in words[5].split(",")])
        return generation, (None if words[6] == "-" else words[6]), s
    s.close()
    why = " ".join(words[2:]) if len(words) > 2 else "hvdrun closed the connection"
    if words[0] == "OUT" and len(words) > 1 and words[1] == "left-out":
        raise LeftOutError("hvdrun left this rank (uid %d) out: %s" % (uid(), why))
    raise JobOverError("hvdrun ended the job: %s" % why)


def _connect(MPI, port, info, timeout_s):
    """MPI_Comm_connect to ``port``, again while its owner is not accepting
    yet: MPICH's ofi netmod then fails the connect at once with MPI_ERR_PORT
    (seen while the member below was still merging the ones below it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return MPI.COMM_SELF.Connect(port, info, root=0)
        except MPI.Exception as e:
            if e.Get_error_class() != MPI.ERR_PORT or time.monotonic() > deadline:
                raise
        time.sleep(0.005)


def _chain(MPI, port, generation, previous_port, timeout_s):
    """The generation's communicator, from MPI_COMM_SELF: connect to the
    member below, then accept each member above, merging each time."""
    info = MPI.Info.Create()
    info.Set("timeout", str(timeout_s))     # MPICH: an accept whose peer vanished fails
    intra = MPI.COMM_SELF
    try:
        if generation.rank:
            inter = _connect(MPI, previous_port, info, timeout_s)
            intra = inter.Merge(high=True)
            inter.Free()
        while intra.Get_size() < generation.size:
            k = intra.Get_size()            # the next member; member k - 1 holds the port it connects to
            inter = intra.Accept(port if intra.Get_rank() == k - 1 else None, info, root=k - 1)
            merged = inter.Merge(high=False)
            inter.Free()
            if intra != MPI.COMM_SELF:
                intra.Free()
            intra = merged
    finally:
        info.Free()
    if intra.Get_rank() != generation.rank:
        raise RendezvousError("generation %d formed with this rank at %d instead of %d"
                              % (generation.number, intra.Get_rank(), generation.rank))
    if intra == MPI.COMM_SELF:          # a generation of one: a communicator of its own
        intra = MPI.COMM_SELF.Dup()
    return intra


def _say_done(conn):
    """Tells hvdrun this rank holds the communicator: a member that never
    does is stuck in MPI's connect/accept, and hvdrun leaves it out."""
    try:
        conn.sendall(b"DONE\n")
    except OSError:
        pass        # hvdrun is gone: the next join or the notice says so


def join(timeout=None):
    """Joins the next generation; returns ``(generation number, communicator)``.

    Blocks until hvdrun forms it (``timeout`` seconds at most; None: as long
    as hvdrun keeps the job going). The old communicator, if any, is left as
    it is: abandon it, never free it (a peer may be dead). Raises
    LeftOutError when hvdrun left this rank out (the rank should exit; hvdrun
    stops it anyway), JobOverError when the job is over, RendezvousError when
    the generation could not be formed."""
    MPI = _mpi()
    w = watch()
    w.leave()
    timeout_s = int(os.environ.get(CONNECT_TIMEOUT_VAR, DEFAULT_CONNECT_TIMEOUT_S))
    failures = 0
    while True:
        port = MPI.Open_port()
        try:
            generation, previous_port, conn = _ask(port, timeout)
            try:
                comm = _chain(MPI, port, generation, previous_port, timeout_s)
                _say_done(conn)
            except MPI.Exception as e:
                failures += 1
                if failures >= FORM_ATTEMPTS:
                    raise RendezvousError("forming generation %d failed %d times; last: %s"
                                          % (generation.number, failures, e.Get_error_string())) from e
                sys.stderr.write("hvdlite rendezvous: forming generation %d failed (%s); joining the next\n"
                                 % (generation.number, e.Get_error_string().splitlines()[0]))
                continue
            finally:
                conn.close()
        finally:
            MPI.Close_port(port)
        generation.comm = comm
        if w._enter(generation):
            return generation.number, comm
        # A member died or left while the generation formed: it is over already.
