"""Elastic jobs with in-place recovery: hvdrun's side (launcher/recovery.py chooses it).

hvdrun starts every rank as its own MPI job (rank_process.py) and runs the
rendezvous where the ranks form each generation of their communicator
(rendezvous_server.py; the rank's side is hvdlite/rendezvous.py). Then:

* a rank that ends before the training does is lost: the members of its
  generation get the notice from the rendezvous at once (MPI reports nothing),
  hvdrun blacklists its host as the restart mode does (no new rank starts
  there; the ranks on it go on), and the survivors' joins form the next
  generation. A survivor that does not join within the join deadline, or
  does not finish forming the generation (one stuck inside MPI), is left
  out: hvdrun stops it and, once its host answers SSH again, starts a new
  rank in its place, which joins the next generation;
* fewer than --min-np ranks: hvdrun starts ranks where discovery allows and
  gives up after --elastic-timeout, naming the lost hosts;
* hosts found by discovery get ranks, which wait at the rendezvous; once all
  of them wait, the rendezvous pushes a new hosts version and the members
  join them at their next commit. The ranks of a host that discovery no
  longer lists are stopped, which the others see as a loss;
* a member that exits with 0 ends the training: the rendezvous answers every
  join with OUT from then on, and hvdrun exits 0 when every member did.

Every rank's output is prefixed with its uid (its rank in the first
generation; ranks started later get the next numbers).
"""

import collections
import os
import queue
import selectors
import signal
import sys
import tempfile
import threading
import time

from .elastic import (COMMIT_ROOT_VAR, DEFAULT_ENGINE_TIMEOUT_S, DISCOVERY_PERIOD_S, DiscoveryError,
                      _user_error, address_toward)
from .flight_report import FlightDumps, parse_flight_line
from .hosts import Host, describe, is_local
from .job import ESCALATE_S, EXIT_LAUNCH_ERROR, EXIT_RESTART, GIVE_UP_S, LaunchError, _signal_name, log
from .mpi_command import interface_env
from .output import Echo, RankFiles, is_rank_line, parse_report
from .rank_process import RankProcess
from .rendezvous_server import RendezvousServer
from .ssh_check import check_hosts

JOIN_DEADLINE_VAR = "HVDLITE_ELASTIC_JOIN_DEADLINE"
DEFAULT_JOIN_DEADLINE_S = 0.5
# A survivor that said its engine stopped is coming: its training thread may
# be in a long step, or in a framework unwinding the error.
REJOIN_TIMEOUT_VAR = "HVDLITE_ELASTIC_REJOIN_TIMEOUT"
DEFAULT_REJOIN_TIMEOUT_S = 30.0
# The ranks' connect/accept timeout (hvdlite/rendezvous.py has the same
# default; hydra passes hvdrun's environment on to the ranks). A member that
# has not formed the generation this much later is stuck in MPI.
CONNECT_TIMEOUT_VAR = "HVDLITE_ELASTIC_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 2
FORMATION_MARGIN_S = 1.0
# After the training ended, ranks that never were members (started for hosts
# that came late) get this long to read the rendezvous' OUT and end.
FINISH_GRACE_S = 2.0
SSH_RECHECK_S = 30.0


class InPlaceJob:
    def __init__(self, driver, mpi):
        self.driver = driver
        self.opts = driver.opts
        self.mpi = mpi
        deadline = float(os.environ.get(JOIN_DEADLINE_VAR, DEFAULT_JOIN_DEADLINE_S))
        formation = float(os.environ.get(CONNECT_TIMEOUT_VAR, DEFAULT_CONNECT_TIMEOUT_S)) + FORMATION_MARGIN_S
        rejoin = float(os.environ.get(REJOIN_TIMEOUT_VAR, DEFAULT_REJOIN_TIMEOUT_S))
        self.server = RendezvousServer(self.opts.min_np, deadline, formation, self._post, rejoin_timeout_s=rejoin)
        self.ranks = {}             # uid -> RankProcess, every one started
        self.next_uid = 0
        self.events = queue.SimpleQueue()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.out, self.err = Echo(1), Echo(2)
        self.files = RankFiles(self.opts.output_filename) if self.opts.output_filename else None
        self.flight = FlightDumps()
        self.port = None
        self.tmp = None
        self.ssh_script = None
        self.finished_at = None     # the training ended (a member exited with 0)
        self.exit_code = None       # decided: a failure, giving up, a signal
        self.stop_at = None
        self.user_signal = None
        self.below_since = None     # fewer than --min-np ranks since
        self.loss = None            # (monotonic time, what) of the newest loss not yet recovered from
        self.declared = []          # (uid, how) of the ranks lost, for the flight report
        self.closed_early = set()   # uids whose death the rendezvous saw first
        self.failure = None         # (RankProcess, how, ranks stopped with it) that ended the job
        self.gave_up = False
        self._stop_discovery = threading.Event()
        self._recheck = set()       # hosts to check over SSH again before ranks start there

    # ---- running ------------------------------------------------------------------
    def run(self):
        try:
            plan = self.driver._wait_for_hosts()
        except LaunchError as e:
            log(str(e))
            return EXIT_LAUNCH_ERROR
        if plan is None:
            return self.driver._give_up()
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
        old = {s: signal.signal(s, self._on_signal) for s in handled}
        with tempfile.TemporaryDirectory(prefix="hvdrun-") as self.tmp:
            try:
                self.port = self.server.serve_on("0.0.0.0")
                for h in plan:
                    self._start_ranks(h.name, h.slots)
                threading.Thread(target=self._discover, name="hvdrun-discovery", daemon=True).start()
                self._loop()
            finally:
                for s, h in old.items():
                    signal.signal(s, h)
                self._stop_discovery.set()
                self.server.close()
                if self.files:
                    self.files.close()
                self.driver._remove_commits()
        self._say_how_it_ended()
        self._write_flight_report()
        return 0 if self.exit_code is None else self.exit_code

    def _loop(self):
        while True:
            for key, _ in self.sel.select(timeout=0.1):
                if key.data is None:
                    self._drain_wake()
                else:
                    self._read(key.data, key.fileobj)
            while True:
                try:
                    kind, fields = self.events.get_nowait()
                except queue.Empty:
                    break
                getattr(self, "_on_" + kind)(**fields)
            now = time.monotonic()
            for rp in list(self.ranks.values()):
                if rp.ended is None and not rp.splitters and rp.proc.poll() is not None:
                    rc = rp.proc.returncode
                    self._ended(rp, rc if rc >= 0 else 128 - rc, None,
                                "its mpiexec ended (%s) before the rank said how it ended"
                                % ("killed by %s" % _signal_name(-rc) if rc < 0 else "exit code %d" % rc))
                rp.reap()
            self._timers(now)
            if (self.exit_code is not None or self.finished_at is not None) and self._all_gone():
                return
            if self.stop_at is not None and now - self.stop_at > GIVE_UP_S:
                return              # something holds the pipes open; do not hang

    def _all_gone(self):
        return all(not rp.splitters and rp.proc.poll() is not None for rp in self.ranks.values())

    def _post(self, kind, **fields):
        """From other threads (the rendezvous, discovery, signals): run in the loop."""
        self.events.put((kind, fields))
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:
            pass

    def _drain_wake(self):
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    # ---- ranks --------------------------------------------------------------------
    def _start_ranks(self, host, count):
        for _ in range(count):
            uid, self.next_uid = self.next_uid, self.next_uid + 1
            try:
                rp = RankProcess(uid, host, self.mpi, self.opts, self._rank_env(uid, host),
                                 self._ssh_script(host))
                self.server.expect(uid)
                rp.start()
            except (LaunchError, OSError) as e:
                log("elastic: cannot start rank %d on %s: %s" % (uid, host, e))
                self.server.lost(uid, "could not be started")
                self.driver._lose(host, "could not start rank %d (%s)" % (uid, e), in_place=True)
                continue
            self.ranks[uid] = rp
            for pipe in rp.splitters:
                self.sel.register(pipe, selectors.EVENT_READ, rp)
            if self.opts.verbose:
                log("elastic: rank %d on %s: %s" % (uid, host, " ".join(rp.argv)))

    def _ssh_script(self, host):
        if is_local(host):
            return None
        if self.ssh_script is None:
            path = os.path.join(self.tmp, "ssh")
            with open(path, "w") as f:
                f.write(self.driver._ssh().wrapper_script())
            os.chmod(path, 0o700)
            self.ssh_script = path
        return self.ssh_script

    def _rank_env(self, uid, host):
        opts = self.opts
        address = "%s:%d" % (address_toward([Host(host, 1)], opts.network_interfaces), self.port)
        env = dict(opts.rank_env)
        env.update(interface_env(opts.network_interfaces, os.environ))
        env.update(HVDLITE_ELASTIC="1", HVDLITE_ELASTIC_RUN_ID=self.driver.run_id,
                   HVDLITE_ELASTIC_UID=str(uid), HVDLITE_ELASTIC_RENDEZVOUS=address,
                   HVDLITE_ELASTIC_DRIVER=address, HVDLITE_ELASTIC_TOKEN=self.server.token,
                   HVDLITE_ELASTIC_HOSTS_VERSION=str(self.server.hosts_version),
                   # connect/accept between MPI jobs: ucx crashes in MPI_Comm_accept,
                   # and libfabric's shm provider aborts survivors when a peer dies.
                   MPICH_CH4_NETMOD="ofi", FI_PROVIDER="tcp")
        if opts.network_interfaces:
            env.setdefault("FI_TCP_IFACE", opts.network_interfaces[0])
        if "HVDLITE_TIMEOUT_SECONDS" not in env and "HVDLITE_TIMEOUT_SECONDS" not in os.environ:
            env["HVDLITE_TIMEOUT_SECONDS"] = str(DEFAULT_ENGINE_TIMEOUT_S)
        if os.environ.get(COMMIT_ROOT_VAR) and COMMIT_ROOT_VAR not in env:
            env[COMMIT_ROOT_VAR] = os.environ[COMMIT_ROOT_VAR]
        return env

    def _live(self):
        return [rp for rp in self.ranks.values() if rp.running]

    # ---- output and reports ------------------------------------------------------------
    def _read(self, rp, pipe):
        splitter, stream = rp.splitters[pipe]
        try:
            data = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return
        echo = self.out if stream == "stdout" else self.err
        for line in (splitter.feed(data) if data else splitter.rest()):
            self._line(rp, line, echo)
        if not data:
            self.sel.unregister(pipe)
            del rp.splitters[pipe]
            pipe.close()

    def _line(self, rp, line, echo):
        flight = parse_flight_line(line)
        if flight is not None:
            self.flight.add(*flight)
            return
        report = parse_report(line)
        if report is not None:
            self._report(rp, report)
            return
        if not is_rank_line(line) and not self.opts.verbose and \
                (rp.ended is not None or rp.stop_reason is not None):
            return      # hydra's words on a rank that ended ("BAD TERMINATION ...")
        echo.write(line)
        if self.files:
            self.files.write(line)

    def _report(self, rp, report):
        event = report.get("event")
        if event == "start":
            rp.pid = report.get("pid")
        elif event == "failing":
            rp.failing = report.get("reason") or "no reason given"
            if _user_error("failed: " + rp.failing) and self.exit_code is None:
                log("elastic: rank %d raised an error in the training script; the others would "
                    "meet it again, so the job ends here" % rp.uid)
                self._fail(rp, report.get("code") or 1, "failed: %s" % rp.failing)
        elif event == "exit":
            code, sig = report.get("code", 1), report.get("signal")
            how = ("was killed by %s" % _signal_name(sig)) if sig else "exited with code %d" % code
            if rp.failing and code != 0:
                how = "failed: %s" % rp.failing
            self._ended(rp, code, sig, how)

    # ---- a rank's end --------------------------------------------------------------
    def _ended(self, rp, code, sig, how):
        if rp.ended is not None:
            return
        rp.ended = (code, sig, how)
        member = rp.uid in self.server.members
        self.server.lost(rp.uid, how)
        if self.exit_code is not None:
            return                  # hvdrun is stopping the job
        if self.finished_at is not None:
            if code != 0 and member:
                self._fail(rp, code, "%s after the training ended" % how)
            return
        if code == 0 and (member or self.server.generation < 0):
            self._finish()
            return
        if rp.stop_reason is not None or code == 0:
            self._check_min_np()   # stopped by hvdrun (counted when stopped), or ended before joining
            return
        if rp.uid not in self.closed_early:     # else counted from its watch connection's end
            self.loss = (time.monotonic(), "rank %d on %s" % (rp.uid, rp.host))
        self.declared.append((rp.uid, how))
        if code == EXIT_RESTART:
            # It left on its own (hvdlite's stuck-engine path): its host is fine.
            log("elastic: rank %d on %s left the job (exit code %d)" % (rp.uid, rp.host, code))
        else:
            self.driver._lose(rp.host, "lost rank %d (%s)" % (rp.uid, how), in_place=True)
        self._check_min_np()

    def _finish(self):
        self.finished_at = time.monotonic()
        self.server.end("the training ended")

    def _fail(self, rp, code, how):
        running = [r for r in self._live() if r is not rp]
        self.exit_code = code
        self.failure = (rp, how, len(running))
        self._stop_all("rank %d failed" % rp.uid)

    def _stop_all(self, why, sig=signal.SIGTERM, spare_waiting=False):
        """Ends the job. With ``spare_waiting`` the ranks waiting in join() get
        no signal: the rendezvous' OUT ends them, with the reason in their
        output (the timers kill them if they do not end)."""
        if self.stop_at is None:
            self.stop_at = time.monotonic()
        waiting = self.server.pending() if spare_waiting else set()
        self.server.end(why)
        for rp in self.ranks.values():
            if rp.ended is None:
                if rp.uid in waiting:
                    rp.stop(why, sig=None)
                else:
                    rp.stop(why, sig)

    def _check_min_np(self):
        live = len(self._live())
        if live >= self.opts.min_np:
            self.below_since = None
        elif self.below_since is None and self.exit_code is None and self.finished_at is None:
            self.below_since = time.monotonic()
            log("elastic: %d rank%s left, --min-np is %d: waiting up to %g s for hosts"
                % (live, "" if live == 1 else "s", self.opts.min_np, self.opts.elastic_timeout))

    # ---- timers ---------------------------------------------------------------------
    def _timers(self, now):
        for rp in self.ranks.values():
            if rp.ended is not None:
                continue
            if rp.stop_reason is not None:
                if not rp.killed and now - rp.stopped_at > ESCALATE_S:
                    rp.kill()
            elif rp.pid is None and now - rp.started_at > self.opts.start_timeout:
                self._stop_lost(rp, "did not start within %g s (--start-timeout)" % self.opts.start_timeout)
            elif self.finished_at is not None and rp.uid not in self.server.ever_members \
                    and now - self.finished_at > FINISH_GRACE_S:
                rp.stop("the training ended before it joined")
        if self.below_since is not None and now - self.below_since >= self.opts.elastic_timeout \
                and self.exit_code is None:
            self.below_since = None
            self.gave_up = True
            self.exit_code = EXIT_LAUNCH_ERROR
            self._stop_all("hvdrun gave up: fewer than --min-np %d ranks" % self.opts.min_np, spare_waiting=True)

    def _stop_lost(self, rp, why):
        """Stop a rank hvdrun gives up on. A rank stuck inside MPI says nothing
        against its host: the host is checked over SSH again (a host cut off
        fails the check and is blacklisted), and where it answers, the next
        round of discovery starts a new rank in this one's slot."""
        log("elastic: rank %d on %s %s; hvdrun stops it" % (rp.uid, rp.host, why))
        self.declared.append((rp.uid, why))
        rp.stop(why)
        self.server.lost(rp.uid, why)
        self.loss = self.loss or (time.monotonic(), "rank %d on %s" % (rp.uid, rp.host))
        self._recheck.add(rp.host)
        self._check_min_np()

    # ---- events ------------------------------------------------------------------------
    def _on_formed(self, generation, members, hosts_version):
        per_host = collections.OrderedDict()
        for uid in members:
            per_host[self.ranks[uid].host] = per_host.get(self.ranks[uid].host, 0) + 1
        since = ""
        if self.loss is not None:
            since = ", %.2f s after %s was lost" % (time.monotonic() - self.loss[0], self.loss[1])
            self.loss = None
        log("elastic: generation %d on %s (%d rank%s: uids %s)%s"
            % (generation, describe([Host(h, n) for h, n in per_host.items()]), len(members),
               "" if len(members) == 1 else "s", ",".join(map(str, members)), since))
        self._check_min_np()

    def _on_closed(self, uid):
        """The rendezvous told the members that ``uid`` died (its watch
        connection closed); its exit's report follows."""
        self.closed_early.add(uid)
        rp = self.ranks.get(uid)
        if rp is not None and self.loss is None:
            self.loss = (time.monotonic(), "rank %d on %s" % (uid, rp.host))

    def _on_left_out(self, uid, why):
        rp = self.ranks[uid]
        if rp.running:
            self._stop_lost(rp, why)

    def _on_announced(self, hosts_version, uids):
        many = len(uids) > 1
        log("elastic: rank%s %s wait%s at the rendezvous (hosts version %d); the members join %s "
            "at their next commit" % ("s" if many else "", ",".join(map(str, uids)), "" if many else "s",
                                      hosts_version, "them" if many else "it"))

    def _on_signal_event(self, sig):
        if sig == signal.SIGUSR1:
            for rp in self._live():
                rp.signal(sig)      # every rank dumps its flight recorder; the job goes on
        elif self.user_signal is None:
            self.user_signal = sig
            self.exit_code = 128 + sig
            self._stop_all("stopped by %s" % _signal_name(sig), sig)
        else:
            for rp in self.ranks.values():
                rp.kill()           # second Ctrl-C: no more waiting

    def _on_signal(self, sig, _frame):
        self._post("signal_event", sig=sig)

    def _on_hosts(self, found, failures, rechecked):
        for host, why in failures.items():
            self.driver._lose(host, "failed the SSH check: %s" % why, in_place=True)
        self._recheck -= rechecked
        if self.exit_code is not None or self.finished_at is not None:
            return
        live = self._live()
        if self.driver.discovery.script is not None:
            listed = {h.name for h in found}
            for rp in live:
                if rp.host not in listed:
                    log("elastic: host %s is no longer listed; stopping rank %d" % (rp.host, rp.uid))
                    rp.stop("host %s is no longer listed by the discovery script" % rp.host)
            live = self._live()
        count = collections.Counter(rp.host for rp in live)
        room = None if self.opts.max_np is None else self.opts.max_np - len(live)
        starts = []
        for h in found:
            usable = self.driver.blacklist.allows(h.name) and h.name not in self._recheck
            n = h.slots - count[h.name] if usable else 0
            n = n if room is None else min(n, room)
            if n > 0:
                starts.append(Host(h.name, n))
                room = None if room is None else room - n
        if starts:
            log("elastic: starting %d rank%s on %s; they join at the next generation"
                % (sum(h.slots for h in starts), "" if sum(h.slots for h in starts) == 1 else "s",
                   describe(starts)))
            for h in starts:
                self._start_ranks(h.name, h.slots)
        self._check_min_np()

    def _on_discovery_error(self, text):
        log("elastic: %s; the job goes on with the ranks it has" % text)

    def _discover(self):
        """Discovery and the SSH check of new hosts (both block), on a thread of their own."""
        checked = dict(self.driver.checked)
        said = None
        while not self._stop_discovery.wait(DISCOVERY_PERIOD_S):
            try:
                found = self.driver.discovery.find()
            except DiscoveryError as e:
                if str(e) != said:          # once per distinct failure, not every second
                    self._post("discovery_error", text=str(e))
                    said = str(e)
                continue
            rechecked = set(self._recheck)      # the loop's set: read here, changed there
            for host in rechecked:
                checked.pop(host, None)
            now = time.monotonic()
            unchecked = [h.name for h in found if not is_local(h.name) and
                         self.driver.blacklist.allows(h.name) and now - checked.get(h.name, -1e9) > SSH_RECHECK_S]
            failures = {}
            if unchecked:
                try:
                    results = check_hosts(unchecked, self.driver._ssh(), python=sys.executable)
                except LaunchError as e:
                    results, failures = [], {h: str(e) for h in unchecked}
                for r in results:
                    if r.ok:
                        checked[r.host] = time.monotonic()
                    else:
                        failures[r.host] = r.reason
            self._post("hosts", found=found, failures=failures, rechecked=rechecked)

    # ---- the end ---------------------------------------------------------------------
    def _say_how_it_ended(self):
        """hvdrun's last line, once every rank is gone: why the job ended, when not by finishing."""
        if self.gave_up:
            self.driver._give_up()
        elif self.failure is not None:
            rp, how, running = self.failure
            others = ("; hvdrun stopped the %d other rank%s still running"
                      % (running, "s" if running > 1 else "")) if running else ""
            log("rank %d on host %s %s%s" % (rp.uid, rp.host, how, others))
        elif self.user_signal is not None:
            log("job stopped by %s; all ranks were stopped" % _signal_name(self.user_signal))

    def _write_flight_report(self):
        self.flight.write_report(self.opts, self.declared, log)
