"""A real SLURM cluster on the network-namespace hosts of tests/harness/hosts.py.

slurmctld runs on host 1, a slurmd on every host (each in its host's network, UTS
and mount namespaces, so each has its own hostname and address), and one munged
serves them all (its socket is a file, shared by the hosts' common filesystem).
Everything lives in a scratch directory named by ``SLURM_CONF``; nothing of the
machine's own SLURM configuration is read or changed.

Needs Debian's ``slurm-wlm`` and ``munge`` packages (scripts/test.sh installs
them when run as root) and what the SSH hosts need (root, network namespaces);
not root, the tests skip, saying how to run them.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time

from harness.hosts import NetnsHosts, hosts_or_skip

INSTALL_HINT = "apt-get install -y --no-install-recommends slurm-wlm munge"
TOOLS = ("slurmctld", "slurmd", "srun", "sbatch", "salloc", "sinfo", "munged")


def missing_tools():
    return [t for t in TOOLS if shutil.which(t) is None and not os.path.exists("/usr/sbin/" + t)]


class SlurmCluster:
    """``SlurmCluster(hosts).up()``: every host of ``hosts`` a node with
    ``cpus`` CPUs, in one partition; ``down()`` stops the daemons."""

    def __init__(self, hosts, cpus=2):
        self.hosts = hosts
        self.cpus = cpus
        self.dir = None
        self.procs = []

    @property
    def conf(self):
        return os.path.join(self.dir, "slurm.conf")

    def env(self, extra=None):
        env = dict(os.environ, SLURM_CONF=self.conf)
        env.update(extra or {})
        return env

    def on_node(self, k, argv):
        """argv run on node k (its namespaces), with this cluster's SLURM_CONF."""
        return self.hosts.on_host(k, ["env", "SLURM_CONF=" + self.conf] + list(argv))

    def up(self):
        self.dir = tempfile.mkdtemp(prefix="hvdl-slurm-")
        d = self.dir
        os.makedirs(os.path.join(d, "state"))
        for name in self.hosts.names:
            os.makedirs(os.path.join(d, "spool", name))
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = os.path.join(d, "munge.sock")
        self._start(["munged", "-F", "--force", "--socket", sock, "--key-file", key,
                     "--pid-file", os.path.join(d, "munged.pid"), "--log-file", os.path.join(d, "munged.log"),
                     "--seed-file", os.path.join(d, "munge.seed")], "munged")
        self._wait_for(lambda: os.path.exists(sock), "munged's socket")
        with open(os.path.join(d, "cgroup.conf"), "w") as f:
            # The machine's cgroup v1 hierarchy; no plugin here uses it for jobs.
            f.write("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nIgnoreSystemd=yes\n")
        nodes = "\n".join("NodeName=%s NodeAddr=%s CPUs=%d State=UNKNOWN"
                          % (self.hosts.name(k), self.hosts.addr(k), self.cpus)
                          for k in range(1, self.hosts.count + 1))
        with open(self.conf, "w") as f:
            f.write("""ClusterName=hvdl
SlurmctldHost={ctl}({ctl_addr})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ReturnToService=2
KillWait=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
PlugStackConfig=/dev/null
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""".format(ctl=self.hosts.name(1), ctl_addr=self.hosts.addr(1), sock=sock, d=d, nodes=nodes))
        self._start(self.on_node(1, ["slurmctld", "-D", "-i"]), "slurmctld")
        for k in range(1, self.hosts.count + 1):
            self._start(self.on_node(k, ["slurmd", "-D", "-N", self.hosts.name(k)]), "slurmd-%d" % k)
        self._wait_for(self._all_idle, "every node idle in sinfo", timeout=60)
        return self

    def _start(self, argv, label):
        log = open(os.path.join(self.dir, label + ".out"), "w")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                           start_new_session=True))

    def _all_idle(self):
        p = subprocess.run(self.on_node(1, ["sinfo", "-h", "-N", "-o", "%N %t"]), capture_output=True, text=True)
        states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
        return len(states) == self.hosts.count and all(s == "idle" for s in states.values())

    def _wait_for(self, ready, what, timeout=20.0):
        deadline = time.time() + timeout
        while not ready():
            if time.time() > deadline:
                raise RuntimeError("SLURM test cluster: no %s after %g s; logs in %s" % (what, timeout, self.dir))
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError("SLURM test cluster: a daemon exited (%s); logs in %s" % (p.args, self.dir))
            time.sleep(0.2)

    def down(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs = []
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def slurm_or_skip(count=2):
    """(hosts, cluster) up, or skip/fail as hosts_or_skip does; a missing
    SLURM tool fails with the command that installs it."""
    import pytest
    missing = missing_tools()
    hosts = hosts_or_skip(count, "a SLURM cluster on SSH test hosts in network namespaces")
    if missing:
        hosts.down()
        pytest.fail("SLURM test cluster: missing %s (install with: %s)" % (", ".join(missing), INSTALL_HINT))
    try:
        return hosts, SlurmCluster(hosts).up()
    except Exception:
        hosts.down()
        raise


__all__ = ["SlurmCluster", "slurm_or_skip", "NetnsHosts"]
