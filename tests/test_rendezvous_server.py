"""hvdrun's rendezvous for in-place recovery (launcher/rendezvous_server.py),
spoken to over real sockets as the ranks speak to it: who forms each
generation, in which order, what the watchers hear, the join deadline, new
ranks, the end of the job. No MPI (the ranks' side: test_inplace_local.py)."""

import importlib
import socket
import sys
import threading
import time

import pytest

from harness.checks import REQUIRE_ALL
from harness.hosts import REPO

try:
    import hvdlite.launcher as pkg
except ImportError:
    if REQUIRE_ALL:
        raise
    sys.path.insert(0, REPO)
    import launcher as pkg

RendezvousServer = importlib.import_module(pkg.__name__ + ".rendezvous_server").RendezvousServer


class Server:
    """A RendezvousServer on 127.0.0.1 with its events recorded."""

    def __init__(self, min_np=1, deadline=0.3, expect=(), formation_timeout=2.0, rejoin_timeout=30.0):
        self.events = []
        self.cond = threading.Condition()
        self.rdv = RendezvousServer(min_np, deadline, formation_timeout, self._event,
                                    rejoin_timeout_s=rejoin_timeout)
        self.port = self.rdv.serve_on("127.0.0.1")
        for uid in expect:
            self.rdv.expect(uid)

    def _event(self, kind, **fields):
        with self.cond:
            self.events.append((kind, fields))
            self.cond.notify_all()

    def wait_event(self, kind, timeout=5.0, **match):
        """Every event ``kind`` so far, once one with the fields ``match`` came."""
        def found():
            return any(k == kind and all(f.get(n) == v for n, v in match.items()) for k, f in self.events)
        with self.cond:
            assert self.cond.wait_for(found, timeout), self.events
            return [f for k, f in self.events if k == kind]

    def connect(self, line, token=None):
        """A connection whose first line is ``line`` after the job's token (or ``token``)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(("%s %s\n" % (token or self.rdv.token, line)).encode())
        return s, s.makefile("r")

    def watch(self, uid):
        s, f = self.connect("WATCH %d" % uid)
        assert f.readline().split()[0] == "WATCHING"
        return f

    def join(self, uid):
        s, f = self.connect("JOIN %d port-of-%d" % (uid, uid))
        f.sock = s
        return f


def member(reply, done=True):
    """The MEMBER answer; with ``done`` the rank then says it holds the communicator."""
    words = reply.readline().split()
    assert words[0] == "MEMBER", words
    if done:
        reply.sock.sendall(b"DONE\n")
    return {"generation": int(words[1]), "rank": int(words[2]), "size": int(words[3]),
            "hosts_version": int(words[4]), "uids": [int(u) for u in words[5].split(",")],
            "port": words[6]}


def test_first_generation_forms_when_every_rank_joined_chaining_the_ports():
    srv = Server(expect=[0, 1, 2])
    try:
        replies = {u: srv.join(u) for u in (2, 0)}
        time.sleep(0.2)
        assert srv.rdv.generation == -1     # rank 1 has not joined yet
        replies[1] = srv.join(1)
        got = {u: member(r) for u, r in replies.items()}
        assert {u: (g["generation"], g["rank"], g["size"]) for u, g in got.items()} == \
            {0: (0, 0, 3), 1: (0, 1, 3), 2: (0, 2, 3)}
        assert all(g["uids"] == [0, 1, 2] for g in got.values())
        # Each member connects to the port of the member one rank below.
        assert [got[u]["port"] for u in (0, 1, 2)] == ["-", "port-of-0", "port-of-1"]
        assert srv.wait_event("formed")[0]["members"] == [0, 1, 2]
    finally:
        srv.rdv.close()


def test_a_lost_member_is_announced_and_the_survivors_form_the_next_generation():
    srv = Server(min_np=2, expect=[0, 1, 2])
    try:
        watchers = {u: srv.watch(u) for u in (0, 1, 2)}
        replies = {u: srv.join(u) for u in (0, 1, 2)}
        [member(r) for r in replies.values()]
        srv.rdv.lost(1, "was killed by SIGKILL")
        for u in (0, 2):
            assert watchers[u].readline().strip() == "DEAD 0 1 was killed by SIGKILL"
        first = srv.join(2)
        # The first survivor's join tells the others that generation 0 is over.
        assert watchers[0].readline().strip() == "REFORM 0 2"
        second = srv.join(0)
        a, b = member(first), member(second)
        # Survivors keep their order: uid 0 stays rank 0.
        assert (b["rank"], a["rank"], a["uids"], a["generation"]) == (0, 1, [0, 2], 1)
    finally:
        srv.rdv.close()


def test_a_member_that_does_not_join_by_the_deadline_is_left_out():
    srv = Server(min_np=2, deadline=0.3, expect=[0, 1, 2, 3])
    try:
        [member(r) for r in [srv.join(u) for u in (0, 1, 2, 3)]]
        srv.rdv.lost(3, "was killed by SIGKILL")
        started = time.monotonic()
        replies = {u: srv.join(u) for u in (0, 2)}      # uid 1 never comes
        got = {u: member(r) for u, r in replies.items()}
        took = time.monotonic() - started
        # (at least the deadline: waited for uid 1; no upper bound, a loaded host is slow)
        assert got[0]["uids"] == [0, 2] and took >= 0.25, (got, took)
        assert srv.wait_event("left_out")[0]["uid"] == 1
        late = srv.join(1).readline().split(" ", 2)
        assert late[:2] == ["OUT", "left-out"] and "did not join generation 1" in late[2]
    finally:
        srv.rdv.close()


def first_generation_watched(srv, uids):
    """Generation 0 of ``uids``, each watching; returns the watch files and
    the last uid's watch socket."""
    watchers = {u: srv.watch(u) for u in uids}
    [member(r) for r in [srv.join(u) for u in uids]]
    srv.wait_event("formed", generation=0)
    return watchers, watchers[uids[-1]].buffer.raw._sock


def test_a_member_whose_watch_connection_closes_is_dead_at_once():
    """The kernel closes a killed rank's watch connection: the others hear
    DEAD and form the next generation without waiting for hvdrun's lost()."""
    srv = Server(min_np=2, expect=[0, 1, 2])
    try:
        watchers, sock = first_generation_watched(srv, (0, 1, 2))
        watchers[2].close()
        sock.close()
        for u in (0, 1):
            assert watchers[u].readline().strip() == "DEAD 0 2 ended (its connection to hvdrun closed)"
        assert srv.wait_event("closed")[0]["uid"] == 2
        replies = [srv.join(u) for u in (0, 1)]
        assert [member(r)["uids"] for r in replies] == [[0, 1]] * 2
        srv.rdv.lost(2, "was killed by SIGKILL")       # hvdrun's word comes later: nothing more
        assert srv.rdv.generation == 1 and srv.wait_event("formed", generation=1)
    finally:
        srv.rdv.close()


def test_a_member_that_says_bye_is_not_dead():
    """BYE before the connection closes: the process ended normally (the
    training finished); hvdrun decides what its exit means."""
    srv = Server(min_np=2, expect=[0, 1, 2])
    try:
        watchers, sock = first_generation_watched(srv, (0, 1, 2))
        sock.sendall(b"BYE\n")
        watchers[2].close()
        sock.close()
        time.sleep(0.3)
        assert not [e for e in srv.events if e[0] == "closed"], srv.events
        assert 2 in srv.rdv.members and srv.rdv.generation == 0
    finally:
        srv.rdv.close()


def test_a_member_whose_engine_stopped_is_waited_for_past_the_deadline():
    """uid 1 said STOPPED on its watch connection (its training thread is
    still unwinding): the generation waits for it beyond the join deadline."""
    srv = Server(min_np=2, deadline=0.3, expect=[0, 1, 2])
    try:
        watch1 = srv.watch(1)
        watch1.sock = watch1.buffer.raw._sock
        [member(r) for r in [srv.join(u) for u in (0, 1, 2)]]
        srv.wait_event("formed", generation=0)
        srv.rdv.lost(2, "was killed by SIGKILL")
        assert watch1.readline().startswith("DEAD 0 2")
        watch1.sock.sendall(b"STOPPED 0\n")
        first = srv.join(0)
        time.sleep(1.0)         # past the join deadline
        assert srv.rdv.pending() == {0} and not [e for e in srv.events if e[0] == "left_out"], srv.events
        second = srv.join(1)
        a, b = member(first), member(second)
        assert (a["uids"], a["generation"], b["rank"]) == ([0, 1], 1, 1)
    finally:
        srv.rdv.close()


def test_a_member_whose_engine_stopped_is_left_out_after_the_rejoin_timeout():
    srv = Server(min_np=2, deadline=0.3, expect=[0, 1, 2, 3], rejoin_timeout=1.0)
    try:
        watch1 = srv.watch(1)
        watch1.sock = watch1.buffer.raw._sock
        [member(r) for r in [srv.join(u) for u in (0, 1, 2, 3)]]
        srv.wait_event("formed", generation=0)
        srv.rdv.lost(3, "was killed by SIGKILL")
        assert watch1.readline().startswith("DEAD 0 3")
        watch1.sock.sendall(b"STOPPED 0\n")
        started = time.monotonic()
        replies = {u: srv.join(u) for u in (0, 2)}      # uid 1 never comes
        got = {u: member(r) for u, r in replies.items()}
        assert got[0]["uids"] == [0, 2] and time.monotonic() - started >= 0.9, got
        left = srv.wait_event("left_out")
        assert [e["uid"] for e in left] == [1] and "of stopping its engine" in left[0]["why"], left
    finally:
        srv.rdv.close()


def test_a_member_stuck_forming_the_generation_is_left_out():
    """A member that never says DONE is stuck in MPI's connect/accept; the
    members whose accept timed out meanwhile join again and go on."""
    srv = Server(min_np=2, deadline=0.3, formation_timeout=1.0, expect=[0, 1, 2, 3])
    try:
        [member(r) for r in [srv.join(u) for u in (0, 1, 2, 3)]]
        srv.wait_event("formed", generation=0)      # every DONE read before uid 3 goes
        srv.rdv.lost(3, "was killed by SIGKILL")
        replies = {u: srv.join(u) for u in (0, 1, 2)}
        got = {u: member(r, done=u != 2) for u, r in replies.items()}     # uid 2 stays in MPI
        assert got[0]["generation"] == 1
        started = time.monotonic()
        again = {u: srv.join(u) for u in (0, 1)}        # their accept timed out: they join again
        time.sleep(0.5)
        assert srv.rdv.generation == 1      # no join deadline while generation 1 still forms
        got = {u: member(r) for u, r in again.items()}
        assert got[0]["uids"] == [0, 1] and got[0]["generation"] == 2
        assert time.monotonic() - started >= 0.9      # waited for the formation timeout
        left = srv.wait_event("left_out")[0]
        assert left["uid"] == 2 and "did not finish forming generation 1" in left["why"], left
        formed = srv.wait_event("formed", generation=2)
        assert [f["generation"] for f in formed] == [0, 2], formed      # generation 1 never formed
    finally:
        srv.rdv.close()


def test_no_generation_below_min_np():
    srv = Server(min_np=3, deadline=0.2, expect=[0, 1, 2])
    try:
        [member(r) for r in [srv.join(u) for u in (0, 1, 2)]]
        srv.rdv.lost(2, "was killed by SIGKILL")
        waiting = [srv.join(u) for u in (0, 1)]
        time.sleep(0.5)
        assert srv.rdv.generation == 0 and srv.rdv.pending() == {0, 1}
        srv.rdv.end("hvdrun gave up")
        assert [w.readline().strip() for w in waiting] == ["OUT over hvdrun gave up"] * 2
        assert srv.join(0).readline().strip() == "OUT over hvdrun gave up"
    finally:
        srv.rdv.close()


def test_new_ranks_wait_and_the_members_hear_a_new_hosts_version():
    srv = Server(min_np=1, expect=[0, 1])
    try:
        watchers = {u: srv.watch(u) for u in (0, 1)}
        [member(r) for r in [srv.join(u) for u in (0, 1)]]
        srv.rdv.expect(2)
        srv.rdv.expect(3)
        newcomers = {2: srv.join(2)}
        time.sleep(0.2)
        assert srv.rdv.hosts_version == 0       # uid 3 still starting: no push yet
        newcomers[3] = srv.join(3)
        for u in (0, 1):
            assert watchers[u].readline().strip() == "HOSTS 1"
        assert srv.wait_event("announced")[0] == {"hosts_version": 1, "uids": [2, 3]}
        olds = {u: srv.join(u) for u in (1, 0)}     # at their next commit
        got = {u: member(r) for u, r in list(olds.items()) + list(newcomers.items())}
        assert got[0]["uids"] == [0, 1, 2, 3] and got[3]["rank"] == 3
        assert got[0]["hosts_version"] == 1
        s, f = srv.connect("version")       # the restart mode's question still works
        with s:
            assert f.readline().strip() == "1"
    finally:
        srv.rdv.close()


@pytest.mark.parametrize("token", ["0" * 32, "", "WATCH"])
def test_a_connection_without_the_jobs_token_is_closed_unanswered(token):
    """Only the job's ranks (hvdrun gave them its token) are answered: a WATCH
    or JOIN with another token neither joins nor displaces a member's watch."""
    srv = Server(min_np=2, expect=(0, 1))
    try:
        watcher = srv.watch(0)
        for line in ("WATCH 0", "JOIN 0 port-of-intruder", "version"):
            s, f = srv.connect(line, token=token or " ")
            with s:
                assert f.readline() == "", line
        replies = {u: srv.join(u) for u in (0, 1)}
        got = {u: member(r) for u, r in replies.items()}
        assert got[0]["uids"] == [0, 1] and got[1]["port"] == "port-of-0"
        srv.rdv.lost(1, "was killed by SIGKILL")
        assert watcher.readline().strip() == "DEAD 0 1 was killed by SIGKILL", "the watch was taken over"
    finally:
        srv.rdv.close()
