"""Hosts and slots: parsing ``-H``, hostfiles, and telling local hosts from remote ones."""

import os
import re
import socket

# A host name, an IPv4 address, or an IPv6 address in brackets.
_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)$")


class HostsError(ValueError):
    """A user error in -H or a hostfile; the message is shown as is."""


class Host:
    __slots__ = ("name", "slots")

    def __init__(self, name, slots):
        self.name = name
        self.slots = slots

    def __repr__(self):
        return "%s:%d" % (self.name, self.slots)

    def __eq__(self, other):
        return isinstance(other, Host) and (self.name, self.slots) == (other.name, other.slots)


def _slots(text, where):
    if not text.isdigit() or int(text) < 1:
        raise HostsError("%s: slots must be a positive integer, got %r" % (where, text))
    return int(text)


def _host_name(text, where):
    if not _HOST_RE.match(text):
        raise HostsError("%s: %r is not a valid host name" % (where, text))
    return text.strip("[]")


def _split_host_slots(entry, where):
    """'name' / 'name:4' / '[::1]:4' -> (name, slots or None)."""
    if entry.startswith("["):                       # bracketed IPv6 may contain ':'
        close = entry.find("]")
        name, rest = entry[:close + 1], entry[close + 1:]
        if rest and not rest.startswith(":"):
            raise HostsError("%s: cannot parse %r" % (where, entry))
        return _host_name(name, where), (_slots(rest[1:], where) if rest else None)
    if entry.count(":") > 1:
        raise HostsError("%s: cannot parse %r (expected HOST or HOST:SLOTS)" % (where, entry))
    name, sep, slots = entry.partition(":")
    return _host_name(name, where), (_slots(slots, where) if sep else None)


def _add(hosts, name, slots, where):
    # A host listed twice is almost always a copy-paste error; MPI launchers
    # disagree on whether they add or ignore the duplicate, so refuse it.
    if any(h.name == name for h in hosts):
        raise HostsError("%s: host %r is listed twice" % (where, name))
    hosts.append(Host(name, slots))


def parse_hosts_arg(text):
    """Parse ``-H a:2,b:2`` (slots default to 1, as in Horovod) into [Host]."""
    hosts = []
    if not text or not text.strip():
        raise HostsError("-H: empty host list (expected HOST[:SLOTS],...)")
    for entry in text.split(","):
        entry = entry.strip()
        where = "-H %s" % text
        if not entry:
            raise HostsError("%s: empty entry (stray comma?)" % where)
        name, slots = _split_host_slots(entry, where)
        _add(hosts, name, slots or 1, where)
    return hosts


def parse_hostfile(path):
    """Parse a hostfile into [Host].

    Accepted line forms (so the files written by SLURM scripts, Open MPI users and
    the Kubernetes MPI operator all work): ``host slots=N``, ``host:N``, ``host``
    (1 slot); ``#`` starts a comment; blank lines are ignored.
    """
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise HostsError("hostfile %s: no such file" % path)
    except OSError as e:
        raise HostsError("hostfile %s: cannot read it: %s" % (path, e.strerror))
    hosts = []
    for lineno, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = "hostfile %s line %d" % (path, lineno)
        fields = line.split()
        name, slots = _split_host_slots(fields[0], where)
        for field in fields[1:]:
            key, sep, value = field.partition("=")
            if key in ("slots", "max_slots", "max-slots") and sep:
                if key == "slots":
                    if slots is not None:
                        raise HostsError("%s: slots given twice" % where)
                    slots = _slots(value, where)
                # max_slots is Open MPI's oversubscription cap: accepted, not needed.
            else:
                raise HostsError("%s: unknown field %r (expected slots=N)" % (where, field))
        _add(hosts, name, slots or 1, where)
    if not hosts:
        raise HostsError("hostfile %s lists no hosts" % path)
    return hosts


def total_slots(hosts):
    return sum(h.slots for h in hosts)


def describe(hosts):
    return ",".join(repr(h) for h in hosts)


def _local_names():
    names = {"localhost", "127.0.0.1", "::1", "localhost.localdomain"}
    try:
        names.add(socket.gethostname())
        names.add(socket.getfqdn())
    except OSError:
        pass
    return names


def is_local(name):
    """True if ``name`` is this machine.

    Checked by name first, then by trying to bind to one of its addresses: binding
    only succeeds for an address of a local interface, which also catches a host
    listed by its IP or by an alias from /etc/hosts.  A name that does not resolve
    is not local (the SSH check reports it).
    """
    if name in _local_names():
        return True
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False


def slurm_np():
    """Number of tasks of the SLURM allocation hvdrun runs in, or None."""
    for var in ("SLURM_NTASKS", "SLURM_NPROCS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


# Where the Kubeflow MPI operator's launcher finds the MPIJob's hostfile (it
# mounts /etc/mpi/hostfile and names it in the MPI implementation's variable).
MPIJOB_HOSTFILE_VARS = ("OMPI_MCA_orte_default_hostfile", "HYDRA_HOST_FILE", "I_MPI_HYDRA_HOST_FILE")


def scheduler_hostfile(environ=None):
    """(variable, path) of a hostfile a scheduler named for this job's MPI
    launcher (an MPIJob's /etc/mpi/hostfile), or None."""
    environ = os.environ if environ is None else environ
    for var in MPIJOB_HOSTFILE_VARS:
        path = environ.get(var, "")
        if path and os.path.isfile(path):
            return var, path
    return None


def scheduler_description(environ=None):
    """One line naming the scheduler this process runs under, or None."""
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_JOB_ID"):
        nodes = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or "?"
        tasks = environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS") or "?"
        return "SLURM job %s: %s tasks on %s nodes (%s)" % (
            environ["SLURM_JOB_ID"], tasks, nodes, environ.get("SLURM_JOB_NODELIST", "?"))
    found = scheduler_hostfile(environ)
    if found:
        var, path = found
        try:
            hosts = parse_hostfile(path)
            what = "%d hosts, %d slots" % (len(hosts), total_slots(hosts))
        except HostsError as e:
            what = str(e)
        return "hostfile %s from $%s (Kubeflow MPIJob or another scheduler): %s" % (path, var, what)
    return None
