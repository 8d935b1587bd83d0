"""hvdrun's rendezvous for in-place recovery: where the ranks of an elastic job
meet to form each generation of their communicator.

Under in-place recovery every rank is its own MPI job, started by hvdrun with a
unique id (its uid). The ranks of a generation build one communicator among
themselves by MPI connect/accept (hvdlite/rendezvous.py); this server tells
each one who is in the generation, its rank, and whose MPI port to connect to.
One line per message, over TCP. The first line of every connection starts
with the job's token (``HVDLITE_ELASTIC_TOKEN`` in the ranks' environment, made by hvdrun
for each job): a connection without it is closed unanswered, so no one else
who reaches the port can join a generation, take over a rank's watch or read
the job's state.

rank -> hvdrun
  ``WATCH <uid>``           answered ``WATCHING <hosts version>``; the connection
                            stays open for the pushes below
  ``JOIN <uid> <port>``     join the next generation, offering an MPI port;
                            answered once the generation forms:
                            ``MEMBER <generation> <rank> <size> <hosts version> <uids> <port>``
                            (uids comma-separated in rank order, port: that of the
                            member one rank below, ``-`` for rank 0), or
                            ``OUT left-out <why>`` / ``OUT over <why>``; after
                            MEMBER the rank writes ``DONE`` on the same connection
                            once it holds the generation's communicator
  ``version``               answered ``<hosts version>`` (the restart mode's question)
  ``STOPPED <generation>``  on the WATCH connection: after a notice the rank's
                            engine has stopped; it joins once its training
                            thread is out of the failed step
  ``BYE``                   on the WATCH connection: the rank's process ends
                            normally. A member's watch connection that closes
                            without it means the process died: the members hear
                            DEAD at once, without waiting for hvdrun to learn of
                            the exit through MPI's launcher
hvdrun -> rank (on WATCH connections)
  ``DEAD <generation> <uid> <why>``  a member of that generation ended
  ``REFORM <generation> <uid>``      a member of that generation joined the next one
  ``HOSTS <hosts version>``          ranks started for new hosts wait at the
                                     rendezvous: the members join them at their next commit

A generation forms when every live member of the newest one has joined (for
the first: every rank hvdrun started), with at least ``min_np`` ranks. A member
that has not joined ``join_deadline_s`` after the first member did, and has
not said STOPPED either, is left out: a survivor stuck inside MPI (it happens
when a peer dies mid-transfer) must not hold the others up; hvdrun then stops
it. A member that said STOPPED gets ``rejoin_timeout_s`` from then: its
training thread may be in a long computation, or unwinding a framework's
error (TensorFlow's takes a second or more). The same goes for a member
that has not said DONE ``formation_timeout_s`` (plus FORMATION_S_PER_MEMBER
for each member: the chain runs one step per member) after the generation
formed: it is stuck in MPI's connect/accept (members whose accept timed out
join again meanwhile). Members keep their order; ranks that join for the first time
follow, by uid.
"""

import hmac
import secrets
import socket
import threading
import time

LINE_TIMEOUT_S = 5.0        # a rank writes its request line right after connecting
FORMATION_S_PER_MEMBER = 0.05
PUSH_TIMEOUT_S = 1.0        # a watcher that does not read its pushes is dropped


def new_token():
    return secrets.token_hex(16)


def without_token(line, token):
    """The request of a connection's first line, or None where it does not
    start with ``token``."""
    given, _, request = line.partition(" ")
    return request if hmac.compare_digest(given.encode(), token.encode()) else None


class RendezvousServer:
    def __init__(self, min_np, join_deadline_s, formation_timeout_s, on_event=None, rejoin_timeout_s=30.0):
        self.token = new_token()    # for the ranks' environment (HVDLITE_ELASTIC_TOKEN)
        self.min_np = min_np
        self.join_deadline_s = join_deadline_s
        self.rejoin_timeout_s = rejoin_timeout_s
        self.formation_timeout_s = formation_timeout_s
        # on_event(kind, **fields), from the server's threads, for hvdrun's loop:
        # ("formed", generation, members, hosts_version): every member holds the
        # communicator; ("left_out", uid, why); ("announced", hosts_version, uids)
        self.on_event = on_event or (lambda kind, **fields: None)
        self.generation = -1        # the newest generation formed
        self.members = []           # its uids, in rank order
        self.hosts_version = 0
        self.ever_members = set()   # uids that were in some generation
        self._lock = threading.Lock()
        self._expected = set()      # live uids hvdrun started
        self._pending = {}          # uid -> (port, connection) of a JOIN waiting for an answer
        self._gone = {}             # uid -> why it will not be in a generation again
        self._watchers = {}         # uid -> connection
        self._reformed = set()      # generations some member left (REFORM pushed)
        self._deadline = None       # threading.Timer of the join deadline
        self._stopped = {}          # uid -> monotonic time it said STOPPED, members of the newest generation
        self._forming = {}          # uid -> connection of a member that has not said DONE yet
        self._formation_timer = None
        self._announced = frozenset()
        self._over = None           # why the job is over (every JOIN is answered OUT)
        self._sock = None

    # ---- hvdrun's side ---------------------------------------------------------------
    def serve_on(self, address):
        """Listen on ``address`` (an IP of this machine; 0.0.0.0: every
        interface); returns the port."""
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, 0))
        sock.listen(128)
        self._sock = sock
        threading.Thread(target=self._serve, args=(sock,), name="hvdrun-rendezvous", daemon=True).start()
        return sock.getsockname()[1]

    def expect(self, uid):
        """hvdrun started rank ``uid``: it will join."""
        with self._lock:
            self._expected.add(uid)
            self._gone.pop(uid, None)

    def lost(self, uid, why):
        """Rank ``uid`` ended (or hvdrun is stopping it): the members of its
        generation hear it, and the next generation forms without it."""
        with self._lock:
            self._expected.discard(uid)
            self._gone.setdefault(uid, why)
            entry = self._pending.pop(uid, None)
            if entry is not None:
                _close(entry[1])
            conn = self._forming.pop(uid, None)
            if conn is not None:
                _close(conn)
            watcher = self._watchers.pop(uid, None)
            if watcher is not None:
                _close(watcher)
            if uid in self.members:
                self._push("DEAD %d %d %s" % (self.generation, uid, _one_line(why)))
            self._progress()

    def end(self, why):
        """The job is over: every JOIN, waiting or to come, is answered OUT."""
        with self._lock:
            self._over = why
            self._cancel_timers()
            for uid, (_, conn) in list(self._pending.items()):
                _send(conn, "OUT over %s" % _one_line(why))
                _close(conn)
            self._pending.clear()

    def pending(self):
        with self._lock:
            return set(self._pending)

    def close(self):
        with self._lock:
            self._cancel_timers()
            if self._sock is not None:
                _close(self._sock)
                self._sock = None
            for conn in list(self._watchers.values()) + [c for _, c in self._pending.values()] + \
                    list(self._forming.values()):
                _close(conn)
            self._watchers.clear()
            self._pending.clear()
            self._forming.clear()

    # ---- connections ---------------------------------------------------------------
    def _serve(self, sock):
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return              # closed
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(LINE_TIMEOUT_S)
            request = without_token(_read_line(conn), self.token)
        except (OSError, UnicodeDecodeError):
            _close(conn)
            return
        if request is None:
            _close(conn)
            return
        words = request.split(" ", 2)
        try:
            if words[0] == "version":
                _send(conn, "%d" % self.hosts_version)
                _close(conn)
            elif words[0] == "WATCH" and len(words) == 2 and words[1].isdigit():
                self._watch(int(words[1]), conn)
            elif words[0] == "JOIN" and len(words) == 3 and words[1].isdigit():
                self._join(int(words[1]), words[2], conn)
            else:
                _close(conn)
        except OSError:
            _close(conn)

    def _watch(self, uid, conn):
        conn.settimeout(PUSH_TIMEOUT_S)
        with self._lock:
            old = self._watchers.pop(uid, None)
            if old is not None:
                _close(old)
            if uid in self._gone or self._over is not None:
                _close(conn)
                return
            self._watchers[uid] = conn
            _send(conn, "WATCHING %d" % self.hosts_version)
        self._read_watch(uid, conn)

    def _read_watch(self, uid, conn):
        """The rank's STOPPED and BYE lines, until its watch connection ends."""
        data = b""
        while True:
            try:
                chunk = conn.recv(4096)
            except socket.timeout:
                continue            # the timeout is the pushes'; reading waits on
            except OSError:
                chunk = b""
            if not chunk or len(data) > 65536:
                self._watch_closed(uid, conn)
                return
            data += chunk
            while b"\n" in data:
                line, data = data.split(b"\n", 1)
                words = line.decode(errors="replace").split()
                if words == ["BYE"]:
                    return
                if len(words) == 2 and words[0] == "STOPPED" and words[1].isdigit():
                    with self._lock:
                        if int(words[1]) == self.generation and uid in self.members:
                            self._stopped.setdefault(uid, time.monotonic())

    def _watch_closed(self, uid, conn):
        """A member's process ended without BYE (its watch connection closed):
        it is lost now; hvdrun's lost() follows when it hears of the exit."""
        with self._lock:
            if self._watchers.get(uid) is not conn or self._over is not None:
                return          # replaced, dropped by hvdrun, or the job is over
            del self._watchers[uid]
            if uid not in self.members or uid not in self._expected:
                return
            self._expected.discard(uid)
            self._gone.setdefault(uid, "ended (its connection to hvdrun closed)")
            self._push("DEAD %d %d %s" % (self.generation, uid, "ended (its connection to hvdrun closed)"))
            self.on_event("closed", uid=uid)
            self._progress()

    def _join(self, uid, port, conn):
        conn.settimeout(None)
        with self._lock:
            if self._over is not None:
                _send(conn, "OUT over %s" % _one_line(self._over))
                _close(conn)
                return
            if uid not in self._expected:
                _send(conn, "OUT left-out %s" % _one_line(self._gone.get(uid, "hvdrun did not start it")))
                _close(conn)
                return
            old = self._pending.pop(uid, None)
            if old is not None:
                _close(old[1])
            self._pending[uid] = (port, conn)
            if uid in self.members:
                # The newest generation is over: tell its other members (they may
                # be waiting for this rank inside a collective), and do not wait
                # long for the ones that do not come.
                if self.generation not in self._reformed:
                    self._reformed.add(self.generation)
                    self._push("REFORM %d %d" % (self.generation, uid))
                # While the generation still forms, its other members may be inside an
                # accept that times out: the formation timeout waits for them instead.
                if self._deadline is None and not self._forming:
                    self._deadline = _timer(self.join_deadline_s, self._expire, self.generation)
            self._progress()

    def _confirm(self, uid, generation, conn):
        """Waits for a member's DONE (or the end of its connection)."""
        try:
            conn.settimeout(None)
            done = _read_line(conn) == "DONE"
        except (OSError, UnicodeDecodeError):
            done = False
        _close(conn)
        with self._lock:
            if not done or generation != self.generation or self._forming.get(uid) is not conn:
                return
            del self._forming[uid]
            if not self._forming:
                self._formation_timer.cancel()
                self._formation_timer = None
                self.on_event("formed", generation=generation, members=list(self.members),
                              hosts_version=self.hosts_version)

    def _formation_expired(self, generation):
        with self._lock:
            if generation != self.generation or self._over is not None:
                return
            self._formation_timer = None
            for uid in list(self._forming):
                conn = self._forming.pop(uid)
                _close(conn)
                if uid in self._expected and uid not in self._pending:
                    self._leave_out(uid, "did not finish forming generation %d within %.2g s (stuck in MPI's "
                                         "connect/accept)" % (generation, self.formation_timeout_s +
                                                              FORMATION_S_PER_MEMBER * len(self.members)))
            if self._pending and self._deadline is None:
                self._deadline = _timer(self.join_deadline_s, self._expire, self.generation)
            self._progress()

    # ---- generations (under the lock) ----------------------------------------------
    def _progress(self):
        if self._over is not None:
            return
        live_members = [u for u in self.members if u in self._expected]
        waiting_for = live_members if self.generation >= 0 else self._expected
        if self._pending and all(u in self._pending for u in waiting_for) \
                and len(self._pending) >= self.min_np:
            if live_members or self.generation < 0 or not self._fresh_starting():
                self._form()
                return
        self._announce()

    def _fresh_starting(self):
        """Ranks that never were members and have not joined yet."""
        return [u for u in self._expected if u not in self.ever_members and u not in self._pending]

    def _announce(self):
        """Every rank started for new hosts waits, and the generation runs:
        push a new hosts version, so that the members join them at their next commit."""
        fresh = frozenset(u for u in self._expected if u not in self.ever_members)
        if self.generation < 0 or not fresh or self._fresh_starting() or fresh == self._announced \
                or self._forming or any(u in self._pending for u in self.members):
            return
        self._announced = fresh
        self.hosts_version += 1
        self._push("HOSTS %d" % self.hosts_version)
        self.on_event("announced", hosts_version=self.hosts_version, uids=sorted(fresh))

    def _expire(self, generation):
        with self._lock:
            if generation != self.generation or self._over is not None:
                return
            self._deadline = None
            now = time.monotonic()
            coming = []
            for uid in self.members:
                if uid not in self._expected or uid in self._pending:
                    continue
                if uid not in self._stopped:
                    self._leave_out(uid, "did not join generation %d within %g s of the first survivor"
                                    % (generation + 1, self.join_deadline_s))
                elif now - self._stopped[uid] >= self.rejoin_timeout_s:
                    self._leave_out(uid, "did not join generation %d within %g s of stopping its engine"
                                    % (generation + 1, self.rejoin_timeout_s))
                else:
                    coming.append(self._stopped[uid] + self.rejoin_timeout_s - now)
            if coming:
                self._deadline = _timer(min(coming), self._expire, generation)
            self._progress()

    def _leave_out(self, uid, why):
        self._expected.discard(uid)
        self._gone[uid] = why
        self.on_event("left_out", uid=uid, why=why)

    def _form(self):
        self._cancel_timers()
        for conn in self._forming.values():
            _close(conn)
        order = [u for u in self.members if u in self._pending]
        order += sorted(u for u in self._pending if u not in order)
        self.generation += 1
        listed = ",".join(str(u) for u in order)
        self._forming = {}
        for rank, uid in enumerate(order):
            before = self._pending[order[rank - 1]][0] if rank else "-"
            conn = self._pending[uid][1]
            if _send(conn, "MEMBER %d %d %d %d %s %s" % (self.generation, rank, len(order),
                                                         self.hosts_version, listed, before)):
                self._forming[uid] = conn
                threading.Thread(target=self._confirm, args=(uid, self.generation, conn), daemon=True).start()
            else:
                _close(conn)
        self._pending.clear()
        self.members = order
        self.ever_members.update(order)
        self._stopped = {}
        self._announced = frozenset()
        self._formation_timer = _timer(self.formation_timeout_s + FORMATION_S_PER_MEMBER * len(order),
                                       self._formation_expired, self.generation)

    def _cancel_timers(self):
        for timer in (self._deadline, self._formation_timer):
            if timer is not None:
                timer.cancel()
        self._deadline = self._formation_timer = None

    def _push(self, line):
        for uid, conn in list(self._watchers.items()):
            if not _send(conn, line):
                _close(conn)
                del self._watchers[uid]


def _timer(seconds, function, *args):
    timer = threading.Timer(seconds, function, args=args)
    timer.daemon = True
    timer.start()
    return timer


def _read_line(conn):
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > 65536:
            break
    return data.decode().strip()


def _send(conn, line):
    try:
        conn.sendall((line + "\n").encode())
        return True
    except OSError:
        return False


def _close(conn):
    try:
        conn.close()
    except OSError:
        pass


def _one_line(text):
    return " ".join(str(text).split()) or "-"

