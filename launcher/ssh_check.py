"""Check, in parallel, that every remote host answers over SSH before launching.

MPI launchers report an unreachable host late and vaguely (or hang, or ask for a
password).  hvdrun instead opens one non-interactive SSH connection per host
with a connect timeout, and turns ssh's error text into one line per bad host.
"""

import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from .hosts import is_local

# Exit code of the remote check command when the Python that ranks run with is missing.
_NO_PYTHON = 97
# ssh clients started at once; more hosts are checked in rounds.
_MAX_PARALLEL = 128

# (pattern in ssh's stderr, reason shown to the user).  Order matters: the first
# match wins, and "Permission denied" must win over a generic "closed" line.
_REASONS = [
    (("Could not resolve hostname", "Name or service not known", "nodename nor servname",
      "Temporary failure in name resolution", "No address associated"),
     "unknown host name (it does not resolve: check the name, DNS or /etc/hosts)"),
    (("Connection refused",),
     "connection refused (no sshd listening on port {port}?)"),
    (("Connection timed out", "Operation timed out", "timed out"),
     "connection timed out after {timeout:g} s (host down, link down, or a firewall drops SSH)"),
    (("No route to host",),
     "no route to host (host down or its network link is down)"),
    (("Network is unreachable",),
     "network unreachable from this host"),
    (("Permission denied",),
     "permission denied: the SSH key was rejected (check -i/--ssh-identity-file, the user, "
     "and the host's authorized_keys; hvdrun never asks for a password)"),
    (("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED"),
     "host key verification failed (the host's key changed or is not in known_hosts)"),
    (("Connection closed", "Connection reset", "kex_exchange_identification"),
     "the connection was closed by the remote side (sshd refusing connections, "
     "MaxStartups, or not an SSH server)"),
]


class SshOptions:
    """How hvdrun (and the MPI launcher it drives) runs ssh."""

    def __init__(self, ssh, port=None, identity=None, connect_timeout=3.0):
        self.ssh = ssh                          # absolute path of the ssh client
        self.port = port
        self.identity = identity
        self.connect_timeout = connect_timeout

    def argv(self):
        """ssh plus the options every connection uses.

        BatchMode=yes: fail instead of prompting for a password or passphrase.
        ConnectTimeout: a silent host fails in seconds, not after TCP's ~2 minutes.
        StrictHostKeyChecking=accept-new: a first contact records the key (so a new
        cluster works without a manual step) but a *changed* key is still refused.
        """
        argv = [self.ssh,
                "-o", "BatchMode=yes",
                "-o", "ConnectTimeout=%d" % max(1, round(self.connect_timeout)),
                "-o", "StrictHostKeyChecking=accept-new",
                "-o", "NumberOfPasswordPrompts=0",
                "-o", "LogLevel=ERROR"]
        if self.port:
            argv += ["-p", str(self.port)]
        if self.identity:
            argv += ["-i", self.identity]
        return argv

    def wrapper_script(self):
        """A shell script usable as the MPI launcher's ssh (one executable, no arguments)."""
        return "#!/bin/sh\nexec %s \"$@\"\n" % " ".join(shlex.quote(a) for a in self.argv())


class HostCheck:
    __slots__ = ("host", "ok", "reason", "seconds", "local")

    def __init__(self, host, ok, reason=None, seconds=0.0, local=False):
        self.host, self.ok, self.reason, self.seconds, self.local = host, ok, reason, seconds, local

    def __repr__(self):
        return "HostCheck(%s, ok=%s, %r, %.2fs)" % (self.host, self.ok, self.reason, self.seconds)


def classify(returncode, stderr, opts, python=None):
    """Reason string for a failed check, or None if the host is fine."""
    if returncode == 0:
        return None
    if returncode == _NO_PYTHON and python:
        return "%s does not exist there (ranks run with the same Python path on every host)" % python
    text = stderr or ""
    for patterns, reason in _REASONS:
        if any(p in text for p in patterns):
            return reason.format(port=opts.port or 22, timeout=opts.connect_timeout)
    last = [l for l in text.strip().splitlines() if l.strip()]
    if returncode == 255:
        return "ssh failed: %s" % (last[-1] if last else "no error message")
    return "the remote shell failed (exit %d)%s" % (returncode, (": " + last[-1]) if last else "")


def check_host(host, opts, python=None, deadline=None):
    start = time.monotonic()
    if is_local(host):
        return HostCheck(host, True, seconds=time.monotonic() - start, local=True)
    remote = "true" if not python else "test -x %s || exit %d" % (shlex.quote(python), _NO_PYTHON)
    argv = opts.argv() + ["-T", "-x", host, remote]
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as e:
        return HostCheck(host, False, "cannot run %s: %s" % (opts.ssh, e.strerror))
    timeout = max(0.1, (deadline or start + opts.connect_timeout + 1.5) - time.monotonic())
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # ConnectTimeout covers the TCP connect; this catches a host that accepted
        # the connection but stalls in the SSH handshake or authentication.
        p.kill()
        p.communicate()
        return HostCheck(host, False, "no SSH answer within %.1f s (host or sshd hangs)"
                         % (time.monotonic() - start), time.monotonic() - start)
    reason = classify(p.returncode, err, opts, python)
    return HostCheck(host, reason is None, reason, time.monotonic() - start)


def check_hosts(hosts, opts, python=None):
    """Check every host at once; return [HostCheck] in the order given.

    All checks share one deadline (connect timeout + 1.5 s), so the whole check
    takes about as long as the slowest host, never the sum.
    """
    if not hosts:
        return []
    workers = min(len(hosts), _MAX_PARALLEL)
    rounds = -(-len(hosts) // workers)
    deadline = time.monotonic() + (opts.connect_timeout + 1.5) * rounds
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda h: check_host(h, opts, python, deadline), hosts))
