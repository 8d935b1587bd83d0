"""Elastic jobs: hvdrun keeps training going while hosts fail, leave or join.

hvdlite is elastic by restart.  hvdrun runs the job in generations, each an
ordinary MPI job on the hosts it has then:

* ranks commit their training state (``state.commit()``) into memory on their
  own host (/dev/shm), so a rank started again on that host finds it;
* when a rank dies (its host is lost, preempted, or the rank is killed) the
  others get an error from hvdlite within a second (or after
  HVDLITE_TIMEOUT_SECONDS for a host that went silent) and leave with
  EXIT_RESTART; hvdrun blacklists the host of the rank that died, finds the
  hosts it still has, and starts the next generation on them;
* when the discovery script lists new hosts (or stops listing one), hvdrun
  raises the hosts version; a thread of rank 0 reads it (every
  HVDLITE_ELASTIC_HOSTS_POLL_MS), every rank raises HostsUpdatedInterrupt
  at the same commit, leaves with EXIT_RESTART, and the next generation runs
  on the new hosts;
* at the start of a generation, ``hvd.elastic.run`` has the ranks agree on the
  newest commit any host holds and broadcasts it from a holder, so new hosts
  and hosts that lost their memory start from it too.

hvdrun gives up (non-zero exit, naming the hosts it lost) when fewer than
--min-np slots are usable for --elastic-timeout seconds, or after
--reset-limit restarts.
"""

import copy
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid

from .hosts import Host, describe, is_local
from .job import EXIT_LAUNCH_ERROR, EXIT_RESTART, Job, LaunchError, expected_hosts, log
from .rendezvous_server import new_token, without_token
from .ssh_check import check_hosts

DISCOVERY_PERIOD_S = 1.0        # how often hosts are discovered while a generation runs
DISCOVERY_TIMEOUT_S = 10.0      # a discovery script that takes longer failed
DEFAULT_ENGINE_TIMEOUT_S = 10   # HVDLITE_TIMEOUT_SECONDS in elastic ranks unless the user set it
COMMIT_ROOT_VAR = "HVDLITE_ELASTIC_COMMIT_DIR"


class DiscoveryError(RuntimeError):
    pass


class HostDiscovery:
    """The hosts a job may use now: the discovery script's output (one
    ``host`` or ``host:slots`` per line), or the fixed -H/--hostfile list."""

    def __init__(self, script=None, fixed=None, slots_per_host=None):
        self.script = script
        self.fixed = fixed
        self.slots_per_host = slots_per_host

    def find(self):
        if self.script is None:
            return [Host(h.name, h.slots) for h in self.fixed]
        try:
            p = subprocess.run(self.script, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=DISCOVERY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise DiscoveryError("--host-discovery-script %s took more than %g s"
                                 % (self.script, DISCOVERY_TIMEOUT_S))
        if p.returncode != 0:
            raise DiscoveryError("--host-discovery-script %s exited with %d: %s"
                                 % (self.script, p.returncode, p.stderr.strip()[-300:]))
        hosts = []
        for line in p.stdout.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, slots = line.partition(":")
            if slots and not slots.isdigit():
                raise DiscoveryError("--host-discovery-script printed %r: expected HOST or HOST:SLOTS"
                                     % line)
            count = int(slots) if slots else (self.slots_per_host or 1)
            if count > 0 and all(h.name != name for h in hosts):
                hosts.append(Host(name, count))
        return hosts


class Blacklist:
    """Hosts that failed.  Without a cooldown range a failed host stays out
    for the whole job (Horovod's default); with (lo, hi) it is out for lo
    seconds after its first failure, doubling with each further failure, at
    most hi, plus up to 10 % jitter so that hosts do not all return at once."""

    def __init__(self, cooldown_range=None):
        self.cooldown_range = cooldown_range
        self.failures = {}          # host -> count
        self.until = {}             # host -> monotonic time it may come back (inf: never)
        self.reasons = {}           # host -> why it was blacklisted (the last time)

    def add(self, host, reason, now=None):
        now = time.monotonic() if now is None else now
        count = self.failures.get(host, 0) + 1
        self.failures[host] = count
        self.reasons[host] = reason
        if self.cooldown_range is None:
            self.until[host] = float("inf")
        else:
            lo, hi = self.cooldown_range
            wait = min(hi, lo * 2 ** (count - 1))
            self.until[host] = now + wait * (1 + 0.1 * random.random())

    def allows(self, host, now=None):
        now = time.monotonic() if now is None else now
        return now >= self.until.get(host, 0.0)


def plan_hosts(hosts, max_np):
    """The hosts (in discovery order) and slots one generation uses: every
    slot, up to max_np."""
    plan, left = [], max_np if max_np is not None else float("inf")
    for h in hosts:
        if left <= 0:
            break
        take = int(min(h.slots, left))
        plan.append(Host(h.name, take))
        left -= take
    return plan


class HostsVersionService:
    """Answers ranks' question "has the set of hosts changed?" with a
    number: the version of the hosts hvdrun would use now.  A tiny TCP
    server on the address the hosts reach this machine at; a thread of
    rank 0 asks every HVDLITE_ELASTIC_HOSTS_POLL_MS (one line each way)."""

    def __init__(self):
        self.token = new_token()    # for the ranks' environment (HVDLITE_ELASTIC_TOKEN)
        self.version = 0
        self._sock = None
        self._address = None
        self._lock = threading.Lock()

    def serve_on(self, address):
        """Listen on ``address`` (an IP of this machine); returns 'ip:port'."""
        if self._address and self._address[0] == address:
            return "%s:%d" % self._address
        self.close()
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, 0))
        sock.listen(64)
        self._sock = sock
        self._address = (address, sock.getsockname()[1])
        threading.Thread(target=self._serve, args=(sock,), daemon=True).start()
        return "%s:%d" % self._address

    def bump(self):
        with self._lock:
            self.version += 1

    def _serve(self, sock):
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return              # closed
            with conn:
                try:
                    conn.settimeout(2.0)
                    with conn.makefile("r", errors="replace") as lines:
                        request = without_token(lines.readline(256).rstrip("\n"), self.token)
                    if request is None:
                        continue    # not one of the job's ranks: closed unanswered
                    with self._lock:
                        answer = "%d\n" % self.version
                    conn.sendall(answer.encode())
                except OSError:
                    pass

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._address = None


def address_toward(hosts, interfaces=()):
    """This machine's IP as the hosts of a job reach it (127.0.0.1 when every
    host is this machine)."""
    remote = [h.name for h in hosts if not is_local(h.name)]
    if not remote:
        return "127.0.0.1"
    try:
        family, _, _, _, target = socket.getaddrinfo(remote[0], 22, proto=socket.IPPROTO_TCP)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(target)           # picks the route; sends nothing
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


class ElasticDriver:
    def __init__(self, opts):
        self.opts = opts
        self.discovery = HostDiscovery(opts.host_discovery_script, opts.hosts, opts.slots_per_host)
        self.blacklist = Blacklist(opts.blacklist_cooldown_range)
        self.service = HostsVersionService()
        self.run_id = uuid.uuid4().hex[:16]
        self.generation = 0
        self.resets = 0
        self.lost = {}              # host -> why hvdrun stopped using it
        self.checked = {}           # host -> monotonic time of its last good SSH check
        self.current = None         # the plan of the running generation
        self.all_hosts = set()
        self._stop_discovery = threading.Event()

    # ---- hosts ------------------------------------------------------------------
    def _ssh(self):
        return Job(self.opts)._ssh_options()

    def _usable(self):
        """Discovered hosts that are not blacklisted and answer SSH."""
        now = time.monotonic()
        found = [h for h in self.discovery.find() if self.blacklist.allows(h.name, now)]
        self.all_hosts.update(h.name for h in found)
        unchecked = [h.name for h in found if not is_local(h.name) and
                     now - self.checked.get(h.name, -1e9) > 30.0]
        if unchecked:
            for r in check_hosts(unchecked, self._ssh(), python=sys.executable):
                if r.ok:
                    self.checked[r.host] = time.monotonic()
                else:
                    self._lose(r.host, "failed the SSH check: %s" % r.reason)
        return [h for h in found if self.blacklist.allows(h.name)]

    def _lose(self, host, why, in_place=False):
        if self.blacklist.allows(host):
            # In place, the ranks still on the host go on; only new ones stay off it.
            out = "no new rank starts there" if in_place else "it is out"
            log("elastic: host %s %s; %s" % (host, why, "%s for the rest of the job" % out
                                              if self.opts.blacklist_cooldown_range is None
                                              else "%s for a cooldown" % out))
        self.blacklist.add(host, why)
        self.lost[host] = why
        self.checked.pop(host, None)

    def _wait_for_hosts(self):
        """A plan with at least --min-np slots, or None after --elastic-timeout."""
        deadline = time.monotonic() + self.opts.elastic_timeout
        said = False
        while True:
            try:
                plan = plan_hosts(self._usable(), self.opts.max_np)
            except DiscoveryError as e:
                log("elastic: %s" % e)
                plan = []
            slots = sum(h.slots for h in plan)
            if slots >= self.opts.min_np:
                return plan
            if time.monotonic() >= deadline:
                return None
            if not said:
                log("elastic: %d slot%s usable (%s), --min-np is %d: waiting up to %g s for hosts"
                    % (slots, "" if slots == 1 else "s", describe(plan) or "no hosts",
                       self.opts.min_np, self.opts.elastic_timeout))
                said = True
            time.sleep(DISCOVERY_PERIOD_S)

    def _watch_hosts(self):
        """While a generation runs: a change of the plan raises the hosts version."""
        said = None
        while not self._stop_discovery.wait(DISCOVERY_PERIOD_S):
            try:
                found = [h for h in self.discovery.find() if self.blacklist.allows(h.name)]
            except DiscoveryError as e:
                if str(e) != said:          # once per distinct failure, not every second
                    log("elastic: %s; the job goes on with the hosts it has" % e)
                    said = str(e)
                continue
            if any(all(h.name != c.name for c in self.current) for h in found):
                # Grow only onto hosts that answer: check them now, not at the restart.
                try:
                    found = self._usable()
                except DiscoveryError as e:
                    log("elastic: %s" % e)
                    continue
            plan = plan_hosts(found, self.opts.max_np)
            if plan != self.current and sum(h.slots for h in plan) >= self.opts.min_np:
                self.service.bump()
                log("elastic: hosts changed (%s -> %s); the ranks restart at their next commit"
                    % (describe(self.current), describe(plan)))
                return

    # ---- generations --------------------------------------------------------------
    def _generation_opts(self, plan, version):
        opts = copy.copy(self.opts)
        opts.hosts = plan
        opts.np = sum(h.slots for h in plan)
        opts.skip_ssh_check = True
        opts.elastic = True
        env = dict(self.opts.rank_env)
        env.update(HVDLITE_ELASTIC="1", HVDLITE_ELASTIC_RUN_ID=self.run_id,
                   HVDLITE_ELASTIC_GENERATION=str(self.generation),
                   HVDLITE_ELASTIC_HOSTS_VERSION=str(version),
                   HVDLITE_ELASTIC_TOKEN=self.service.token,
                   HVDLITE_ELASTIC_DRIVER=self.service.serve_on(
                       address_toward(plan, self.opts.network_interfaces)))
        if "HVDLITE_TIMEOUT_SECONDS" not in env and "HVDLITE_TIMEOUT_SECONDS" not in os.environ:
            env["HVDLITE_TIMEOUT_SECONDS"] = str(DEFAULT_ENGINE_TIMEOUT_S)
        if os.environ.get(COMMIT_ROOT_VAR) and COMMIT_ROOT_VAR not in env:
            env[COMMIT_ROOT_VAR] = os.environ[COMMIT_ROOT_VAR]
        opts.rank_env = env
        return opts

    def run(self):
        try:
            return self._run()
        finally:
            self._stop_discovery.set()
            self.service.close()
            self._remove_commits()

    def _run(self):
        while True:
            try:
                plan = self._wait_for_hosts()
            except LaunchError as e:
                log(str(e))
                return EXIT_LAUNCH_ERROR
            if plan is None:
                return self._give_up()
            self.generation += 1
            self.current = plan
            version = self.service.version
            log("elastic: generation %d on %s (%d rank%s)%s"
                % (self.generation, describe(plan), sum(h.slots for h in plan),
                   "" if sum(h.slots for h in plan) == 1 else "s",
                   "" if self.generation == 1 else ", from the newest commit"))
            self._stop_discovery.clear()
            watcher = threading.Thread(target=self._watch_hosts, daemon=True)
            watcher.start()
            job = Job(self._generation_opts(plan, version))
            rc = job.run()
            self._stop_discovery.set()
            watcher.join()
            outcome = self._judge(job, plan, rc)
            if outcome is not None:
                return outcome
            self.resets += 1
            if self.opts.reset_limit is not None and self.resets > self.opts.reset_limit:
                log("elastic: stopping after %d restarts (--reset-limit %d)"
                    % (self.resets - 1, self.opts.reset_limit))
                return EXIT_LAUNCH_ERROR

    def _judge(self, job, plan, rc):
        """None: start another generation; else hvdrun's exit code."""
        np_ = sum(h.slots for h in plan)
        where = expected_hosts(plan, np_)
        codes = {rank: code for rank, (code, _) in job.exits.items()}
        if job.user_signal is not None:
            return rc
        if job.first_failure is None and len(codes) == np_ and all(c == 0 for c in codes.values()):
            return 0
        failure = job.first_failure
        if failure is not None:
            rank, _, code, how, _ = failure
            if _user_error(how):
                log("elastic: rank %s raised an error in the training script; a restart would "
                    "raise it again, so the job ends here" % rank)
                return code
            if rank in where:
                self._lose(where[rank], "lost rank %s (%s)" % (rank, how))
        silent = sorted({where[r] for r in range(np_) if r not in codes and r in where} - set(self.lost))
        if silent:
            # Ranks that never reported how they ended: their host may be gone.
            for r in check_hosts([h for h in silent if not is_local(h)], self._ssh(), python=sys.executable):
                if not r.ok:
                    self._lose(r.host, "stopped answering (%s)" % r.reason)
        if failure is None and not any(c == EXIT_RESTART for c in codes.values()):
            # The launcher failed without a rank telling why (e.g. at start-up).
            log("elastic: generation %d ended with exit code %d; starting again" % (self.generation, rc))
        return None

    def _give_up(self):
        lost = ", ".join("%s (%s)" % (h, why) for h, why in sorted(self.lost.items())) or "none"
        log("elastic: fewer than --min-np %d slots for %g s (--elastic-timeout); hosts lost: %s"
            % (self.opts.min_np, self.opts.elastic_timeout, lost))
        return EXIT_LAUNCH_ERROR

    def _remove_commits(self):
        """The commits live in each host's memory; remove them on every host
        that still answers (the ranks of a finished job remove their own)."""
        root = os.environ.get(COMMIT_ROOT_VAR) or "/dev/shm"
        target = os.path.join(root, "hvdlite-elastic-%s" % self.run_id)
        remote = sorted(h for h in self.all_hosts if not is_local(h) and h not in self.lost)
        shutil.rmtree(target, ignore_errors=True)
        if not remote:
            return
        try:
            ssh = self._ssh()
        except LaunchError:
            return
        procs = [subprocess.Popen(ssh.argv() + ["-T", h, "rm -rf %s" % shlex.quote(target)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for h in remote]
        deadline = time.monotonic() + self.opts.ssh_connect_timeout + 2
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# Errors of hvdlite that mean "a peer is gone", not "the script is wrong".
_PEER_ERRORS = ("HvdliteShutdownError", "HvdliteTimeoutError", "MPIError", "HorovodInternalError")


def _user_error(how):
    """True for a rank that failed with an exception of its own (a bug a
    restart would repeat), False for a rank killed, lost or leaving."""
    if not how.startswith("failed: "):
        return False
    reason = how[len("failed: "):]
    return not any(name in reason.split(":", 1)[0] for name in _PEER_ERRORS)


def run_elastic(opts):
    return ElasticDriver(opts).run()
