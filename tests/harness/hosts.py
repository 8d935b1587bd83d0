"""Fake SSH hosts on one machine, for hvdrun's multi-host tests (root only).

Each host is a network namespace with its own hostname (UTS namespace), its own
/etc/hosts (mount namespace) and a real sshd, wired by a veth pair to a bridge
that lives in a separate "switch" namespace.  The root namespace gets only an
``unreachable`` route for the test subnet, so a connection that escapes the
namespaces by mistake fails at once instead of leaving the machine.

Layout of one host k::

    anchor process (sleep)  -- holds the host's UTS + mount namespaces, so sshd
                               can be stopped and started again without losing
                               the hostname or the private /etc/hosts
    sshd listener           -- started with nsenter into the anchor's namespaces
    eth0 <veth> v<k> in <prefix>-sw, enslaved to br0

Everything is named after a prefix that contains the pytest process id, so two
test runs at once do not collide, and ``cleanup_stale()`` can remove what a
killed run left behind.
"""

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import types
import time
from concurrent.futures import ThreadPoolExecutor

if not __package__:  # run as a script (below): tests/ holds the harness package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.checks import REQUIRE_ALL  # noqa: E402

SSHD = "/usr/sbin/sshd"
NS_PREFIX = "hvdl"          # namespaces are called hvdl<pid>-n<k> and hvdl<pid>-sw
SUBNETS = ["10.79.%d" % i for i in range(0, 250)]

# What CI must install for these tests (printed when something is missing).
INSTALL_HINT = ("apt-get update && apt-get install -y --no-install-recommends "
                "openssh-server openssh-client iproute2 util-linux")


def _run(args, check=True, **kw):
    """Run a short setup command; raise with its stderr on failure."""
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(args), p.returncode, p.stderr.strip()))
    return p


def missing_requirements():
    """Return a list of reasons these hosts cannot be made here ([] = all fine)."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append("not root")
    for tool in ("ip", "nsenter", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            reasons.append("missing %s" % tool)
    if not os.path.exists(SSHD):
        reasons.append("missing %s" % SSHD)
    if not reasons:
        probe = "hvdlprobe%d" % os.getpid()
        p = _run(["ip", "netns", "add", probe], check=False)
        if p.returncode != 0:
            reasons.append("cannot create network namespaces: %s" % p.stderr.strip())
        else:
            _run(["ip", "netns", "del", probe], check=False)
    return reasons


def _netns_list():
    p = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _netns_pids(ns):
    p = _run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split()]


def _alive(pid):
    """True while pid runs (a zombie waiting for its reaper does not count)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill_namespaces(names):
    """SIGTERM, then SIGKILL, every process living in the given namespaces, then delete them."""
    def pids():
        return sorted({pid for ns in names for pid in _netns_pids(ns)})
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while pids() and time.time() < deadline:
            time.sleep(0.05)
    for ns in names:
        _run(["ip", "netns", "del", ns], check=False)


def cleanup_stale():
    """Remove namespaces and guard routes left by test runs whose process is gone."""
    stale = {}
    for ns in _netns_list():
        if not ns.startswith(NS_PREFIX) or "-" not in ns:
            continue
        tag = ns[len(NS_PREFIX):].split("-", 1)[0]
        if tag.isdigit() and not os.path.exists("/proc/%s" % tag):
            stale.setdefault(tag, []).append(ns)
    for names in stale.values():
        _kill_namespaces(names)
    # Guard routes carry the owning pid as their metric (see _make_network).
    for line in _run(["ip", "route", "show", "type", "unreachable"], check=False).stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1].startswith("10.79.") and fields[2] == "metric" \
                and fields[3].isdigit() and not os.path.exists("/proc/%s" % fields[3]):
            _run(["ip", "route", "del", "unreachable", fields[1], "metric", fields[3]], check=False)


class NetnsHosts:
    """N SSH hosts in network namespaces.  Use ``up()`` / ``down()`` (or ``with``)."""

    def __init__(self, count=2, prefix=None, rate=None, delay=None):
        self.count = count
        # Optional link shaping (tc on both ends of each host's link), to emulate a
        # slower network: rate like "1gbit", delay like "100us" (netem).
        self.rate, self.delay = rate, delay
        self.prefix = prefix or "%s%d" % (NS_PREFIX, os.getpid())
        self.scratch = None
        self.net = None
        self.anchors = {}          # k -> Popen of the anchor process
        self.guard_route = None

    def describe(self):
        """What another process needs to run things on these hosts (``attach``)."""
        return {"count": self.count, "prefix": self.prefix, "net": self.net, "scratch": self.scratch,
                "anchors": {str(k): a.pid for k, a in self.anchors.items()}}

    @classmethod
    def attach(cls, description):
        """Hosts another process made and keeps (it alone calls ``down()``)."""
        hosts = cls(description["count"], prefix=description["prefix"])
        hosts.net, hosts.scratch = description["net"], description["scratch"]
        hosts.anchors = {int(k): types.SimpleNamespace(pid=pid) for k, pid in description["anchors"].items()}
        return hosts

    # ---- names -------------------------------------------------------------
    def name(self, k):
        """Hostname of host k (1-based).  Short and fixed: it is private to our UTS namespaces."""
        return "hvdl-n%d" % k

    @property
    def names(self):
        return [self.name(k) for k in range(1, self.count + 1)]

    def netns(self, k):
        return "%s-n%d" % (self.prefix, k)

    @property
    def switch_ns(self):
        return "%s-sw" % self.prefix

    def addr(self, k):
        return "%s.%d" % (self.net, 10 + k)

    @property
    def key(self):
        """The private key every host accepts (pass it to hvdrun with -i)."""
        return os.path.join(self.scratch, "ssh", "id_ed25519")

    @property
    def wrong_key(self):
        """A valid key that no host accepts."""
        return os.path.join(self.scratch, "ssh", "wrong_ed25519")

    @property
    def bin_dir(self):
        """Put this first in PATH: its ``ssh`` uses the hosts' ssh config."""
        return os.path.join(self.scratch, "bin")

    def sshd_pidfile(self, k):
        return os.path.join(self.scratch, "run", "sshd-%d.pid" % k)

    def sshd_pid(self, k):
        try:
            with open(self.sshd_pidfile(k)) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    # ---- running things "on" a host ---------------------------------------------
    def on_host(self, k, argv, cwd=None):
        """argv that runs ``argv`` inside host k (net + uts + mount namespaces)."""
        return ["nsenter", "--target", str(self.anchors[k].pid), "--net", "--uts", "--mount",
                "--wd=%s" % (cwd or os.getcwd()), "--"] + list(argv)

    def pids(self, k):
        """Processes living in host k's network namespace, minus the anchor and the sshd listener."""
        keep = {self.anchors[k].pid, self.sshd_pid(k)}
        return [p for p in _netns_pids(self.netns(k)) if p not in keep]

    def link_bytes(self, k):
        """(rx_bytes, tx_bytes) of host k's eth0: proof that traffic crossed the test network."""
        base = "/sys/class/net/eth0/statistics/"
        p = _run(self.on_host(k, ["cat", base + "rx_bytes", base + "tx_bytes"]))
        rx, tx = p.stdout.split()
        return int(rx), int(tx)

    # ---- failure injection -----------------------------------------------------
    def stop_sshd(self, k):
        pid = self.sshd_pid(k)
        if pid:
            os.kill(pid, signal.SIGTERM)
            deadline = time.time() + 3
            while _alive(pid) and time.time() < deadline:
                time.sleep(0.02)
        if os.path.exists(self.sshd_pidfile(k)):   # sshd removes it itself on SIGTERM
            os.unlink(self.sshd_pidfile(k))

    def start_sshd(self, k):
        pidfile = self.sshd_pidfile(k)
        if os.path.exists(pidfile):
            os.unlink(pidfile)
        _run(self.on_host(k, [SSHD, "-f", os.path.join(self.scratch, "ssh", "sshd_config"),
                              "-o", "ListenAddress=%s" % self.addr(k),
                              "-o", "PidFile=%s" % pidfile,
                              "-E", os.path.join(self.scratch, "log", "sshd-%d.log" % k)], cwd="/"))
        deadline = time.time() + 5
        while self.sshd_pid(k) is None:
            if time.time() > deadline:
                raise RuntimeError("sshd on %s did not write its pid file" % self.name(k))
            time.sleep(0.02)

    def set_link(self, k, up):
        _run(["ip", "-n", self.netns(k), "link", "set", "eth0", "up" if up else "down"])

    def set_silent(self, k, silent, seen_from=1):
        """Make host k silent for host ``seen_from``: its packets go to a MAC address
        nobody has, so connections get no answer at all (neither a reset nor an
        ICMP error), like a host that is down behind a firewall."""
        ns, ip = self.netns(seen_from), self.addr(k)
        if silent:
            _run(["ip", "-n", ns, "neigh", "replace", ip, "lladdr", "02:00:00:00:00:99",
                  "dev", "eth0", "nud", "permanent"])
        else:
            _run(["ip", "-n", ns, "neigh", "del", ip, "dev", "eth0"], check=False)

    def ssh(self, k_from, host, *command, timeout=10):
        """Run a command on ``host`` over ssh from host k_from; return CompletedProcess."""
        argv = [os.path.join(self.bin_dir, "ssh"), "-i", self.key, host] + list(command)
        return subprocess.run(self.on_host(k_from, argv, cwd="/"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)

    # ---- set up / tear down ------------------------------------------------------
    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()

    def up(self):
        reasons = missing_requirements()
        if reasons:
            raise RuntimeError("cannot make test hosts: %s (install: %s)"
                               % ("; ".join(reasons), INSTALL_HINT))
        cleanup_stale()
        self.scratch = tempfile.mkdtemp(prefix="hvdl-hosts-")
        try:
            self._write_files_and_keys()
            self._make_network()
            for k in range(1, self.count + 1):
                self._start_anchor(k)
            with ThreadPoolExecutor(self.count) as pool:
                list(pool.map(self.start_sshd, range(1, self.count + 1)))
            self._wait_until_reachable()
        except BaseException:
            self.down()
            raise
        return self

    def down(self):
        names = [ns for ns in _netns_list() if ns.startswith(self.prefix + "-")]
        _kill_namespaces(names)
        for a in self.anchors.values():   # reap our own children
            try:
                a.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        self.anchors = {}
        if self.guard_route:
            _run(["ip", "route", "del", "unreachable", self.guard_route, "metric",
                  str(os.getpid())], check=False)
            self.guard_route = None
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def _write_files_and_keys(self):
        s = self.scratch
        for d in ("ssh", "run", "log", "etc", "bin"):
            os.makedirs(os.path.join(s, d), mode=0o700, exist_ok=True)
        ssh_dir = os.path.join(s, "ssh")
        for key, comment in (("id_ed25519", "hvdl-test"), ("wrong_ed25519", "hvdl-wrong"),
                             ("host_ed25519", "hvdl-host")):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                  "-f", os.path.join(ssh_dir, key)])
        shutil.copy(os.path.join(ssh_dir, "id_ed25519.pub"), os.path.join(ssh_dir, "authorized_keys"))
        os.makedirs("/run/sshd", exist_ok=True)     # sshd's compiled-in privilege separation dir
        os.chmod("/run/sshd", 0o755)
        with open(os.path.join(ssh_dir, "sshd_config"), "w") as f:
            f.write("\n".join([
                "Port 22",
                "HostKey %s/host_ed25519" % ssh_dir,
                "AuthorizedKeysFile %s/authorized_keys" % ssh_dir,
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",              # pam_loginuid fails in containers
                "StrictModes no",         # the scratch dir is under /tmp
                "UseDNS no",
                "PrintMotd no",
                "PrintLastLog no",
                "MaxStartups 200",
                "MaxSessions 200",
                "LogLevel ERROR",
                ""]))
        # Client side: a known_hosts file that lists every host, strict checking, no
        # default identity: tests pass the key with hvdrun's -i.
        with open(os.path.join(ssh_dir, "host_ed25519.pub")) as f:
            host_key = " ".join(f.read().split()[:2])
        patterns = ",".join(self.names)
        with open(os.path.join(ssh_dir, "known_hosts"), "w") as f:
            f.write("%s %s\n" % (patterns, host_key))
        with open(os.path.join(ssh_dir, "config"), "w") as f:
            f.write("\n".join([
                "Host *",
                "    User root",
                "    IdentitiesOnly yes",
                "    IdentityFile none",
                "    UserKnownHostsFile %s/known_hosts" % ssh_dir,
                "    GlobalKnownHostsFile /dev/null",
                "    StrictHostKeyChecking yes",
                "    CheckHostIP no",
                "    PasswordAuthentication no",
                "    KbdInteractiveAuthentication no",
                "    GSSAPIAuthentication no",
                "    LogLevel ERROR",
                ""]))
        wrapper = os.path.join(self.bin_dir, "ssh")
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\nexec %s -F %s "$@"\n'
                    % (shutil.which("ssh"), os.path.join(ssh_dir, "config")))
        os.chmod(wrapper, 0o755)

    def _make_network(self):
        # Pick a /24 nobody routes yet; the guard route doubles as our claim on it,
        # and its metric names our pid so a later run can remove it if we die.
        for net in SUBNETS:
            if _run(["ip", "route", "show", net + ".0/24"], check=False).stdout.strip():
                continue
            p = _run(["ip", "route", "add", "unreachable", net + ".0/24", "metric",
                      str(os.getpid())], check=False)
            if p.returncode == 0:
                self.net, self.guard_route = net, net + ".0/24"
                break
        else:
            raise RuntimeError("no free 10.79.x.0/24 subnet for the test hosts")
        with open(os.path.join(self.scratch, "etc", "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
            for k in range(1, self.count + 1):
                f.write("%s %s\n" % (self.addr(k), self.name(k)))
        sw = self.switch_ns
        _run(["ip", "netns", "add", sw])
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        for k in range(1, self.count + 1):
            ns = self.netns(k)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                  "peer", "name", "v%d" % k, "netns", sw])
            _run(["ip", "-n", sw, "link", "set", "v%d" % k, "master", "br0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", "%s/24" % self.addr(k), "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            if self.rate or self.delay:
                self._shape(sw, "v%d" % k)
                self._shape(ns, "eth0")

    def _shape(self, ns, dev):
        """Limit the egress of ``dev`` in ``ns`` to self.rate and/or delay it by self.delay."""
        if self.delay:
            args = ["netem", "delay", self.delay] + (["rate", self.rate] if self.rate else [])
        else:
            args = ["tbf", "rate", self.rate, "burst", "256kb", "latency", "50ms"]
        _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root"] + args)

    def _start_anchor(self, k):
        script = 'hostname "$1" && mount --bind "$2" /etc/hosts && exec sleep infinity'
        self.anchors[k] = subprocess.Popen(
            ["ip", "netns", "exec", self.netns(k), "unshare", "--uts", "--mount",
             "--propagation", "private", "sh", "-c", script, "sh", self.name(k),
             os.path.join(self.scratch, "etc", "hosts")],
            stdin=subprocess.DEVNULL, start_new_session=True)
        # ip, unshare and sh all exec, so the pid becomes sleep once the namespace is ready.
        deadline = time.time() + 5
        while True:
            try:
                with open("/proc/%d/comm" % self.anchors[k].pid) as f:
                    if f.read().strip() == "sleep":
                        return
            except OSError:
                pass
            if self.anchors[k].poll() is not None or time.time() > deadline:
                raise RuntimeError("could not set up host %s" % self.name(k))
            time.sleep(0.01)

    def _wait_until_reachable(self):
        def check(k):
            deadline = time.time() + 10
            while True:
                p = self.ssh(1, self.name(k), "hostname")
                if p.returncode == 0 and p.stdout.strip() == self.name(k):
                    return
                if time.time() > deadline:
                    raise RuntimeError("host %s not reachable over ssh: %s"
                                       % (self.name(k), p.stderr.strip()))
                time.sleep(0.1)
        with ThreadPoolExecutor(self.count) as pool:
            list(pool.map(check, range(1, self.count + 1)))


# ---- helpers for the launcher tests ---------------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def needs_root(what):
    """A skip reason for a test that needs root: what for, and the command that
    runs it (the running test's file, from pytest's PYTEST_CURRENT_TEST)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0] or "tests"
    return ("needs root (%s); run it as root: bash scripts/test.sh %s (as root the script "
            "installs openssh-server, iproute2, slurm-wlm and munge with apt-get)" % (what, test))


def hosts_or_skip(count=2, what="SSH test hosts in network namespaces"):
    """``count`` hosts, up. Not root: skips, saying how to run the test; no
    network namespaces (a container without the capability): skips. Under
    HVDLITE_TEST_REQUIRE_ALL=1 (CI) both fail, and a missing tool always fails,
    naming the command that installs it."""
    import pytest
    reasons = missing_requirements()
    if reasons:
        msg = "cannot make SSH test hosts: %s" % "; ".join(reasons)
        if not REQUIRE_ALL:
            if os.geteuid() != 0:
                pytest.skip(needs_root(what))
            if all(r.startswith("cannot create network namespaces") for r in reasons):
                pytest.skip(msg)
        todo = ["run as root"] if os.geteuid() != 0 else []
        if any(r.startswith("missing") for r in reasons):
            todo.append("install with: %s" % INSTALL_HINT)
        pytest.fail("%s%s" % (msg, " (%s)" % "; ".join(todo) if todo else ""))
    return NetnsHosts(count).up()


def hosts_fixture(count, needs=(), doc=None):
    """A module-scoped pytest fixture of ``count`` netns hosts (hosts_or_skip),
    brought down after the module; ``needs``: modules it requires first."""
    import pytest

    from .checks import require

    def hosts():
        for module in needs:
            require(module)
        h = hosts_or_skip(count)
        yield h
        h.down()
    hosts.__doc__ = doc or "%d SSH test hosts in network namespaces." % count
    return pytest.fixture(scope="module", name="hosts")(hosts)


def hvdrun_argv():
    """(argv prefix that runs hvdrun, extra environment).

    The installed ``hvdlite.launcher`` when it is importable; otherwise (a checkout
    without ``pip install -e .``) the ``launcher`` directory itself, except in CI,
    where the installed one is required.
    """
    try:
        installed = importlib.util.find_spec("hvdlite.launcher") is not None
    except ImportError:
        installed = False
    if installed:
        return [sys.executable, "-m", "hvdlite.launcher"], {}
    if REQUIRE_ALL:
        raise RuntimeError("hvdlite.launcher is not importable (pip install -e . first)")
    return [sys.executable, "-m", "launcher"], {"PYTHONPATH": REPO}


def tagged_processes(tag):
    """{pid: command line} of every process whose command line contains ``tag``.

    /proc shows the processes of every network namespace (the hosts share our pid
    namespace), so this sees ranks left on any test host.
    """
    found = {}
    needle = tag.encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if needle in cmd:
            found[int(pid)] = cmd.replace(b"\0", b" ").decode(errors="replace")
    return found


def wait_until_gone(tag, timeout=3.0):
    """Wait for processes carrying ``tag`` to end; return those still there."""
    deadline = time.time() + timeout
    while True:
        left = tagged_processes(tag)
        if not left or time.time() > deadline:
            return left
        time.sleep(0.05)


def run_tagged(cmd, tag, **kwargs):
    """subprocess.run(cmd, capture_output=True, text=True, **kwargs) of a job
    whose processes carry ``tag``; afterwards none of them may be left (those
    still there after 5 s are killed, and the call fails naming them)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    finally:
        left = wait_until_gone(tag, timeout=5)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not left, f"processes left behind: {left}"
    return proc


if __name__ == "__main__":
    # Manual use (root):  python tests/harness/hosts.py [N [CMD...]]
    # runs CMD (default: an interactive shell) on host 1 while N hosts are up,
    # with their ssh first in PATH and $HVDL_KEY naming the key they accept.
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    command = sys.argv[2:] or [os.environ.get("SHELL", "/bin/bash")]
    with NetnsHosts(count) as h:
        sys.stdout.write("hosts %s up\n" % " ".join(h.names))
        sys.stdout.flush()
        env = dict(os.environ, PATH=h.bin_dir + os.pathsep + os.environ["PATH"], HVDL_KEY=h.key)
        status = subprocess.call(h.on_host(1, command), env=env)
    sys.exit(status)


def hvdrun_env(hosts, extra=None):
    argv, extra_env = hvdrun_argv()
    env = dict(os.environ)
    env.update(extra_env)
    # The hosts' ssh (their known_hosts) first in PATH; MPI over TCP so traffic
    # really crosses the test network instead of shared memory.
    env.update(PATH=hosts.bin_dir + os.pathsep + env["PATH"], UCX_TLS="tcp,self",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("HVDLITE_MPIEXEC", None)
    env.update(extra or {})
    return argv, env
