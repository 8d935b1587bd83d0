"""Several hosts on one machine as the engine sees them, for rank-side test
modules: mpiexec starts every rank in a UTS namespace of its own
(``unshare --uts``) whose hostname names its host (``fakehost<rank // per
host>``). The engine's topology reads MPI_Get_processor_name, which is that
hostname, so it takes the paths between hosts (the ring, the hierarchical
allreduce, allgather and reducescatter); MPI itself still knows the ranks
share the machine and runs on shared memory. Root only.

Lighter than harness.hosts (network namespaces, sshd, hvdrun): for paths of
the engine between hosts, not for the launcher or the network. Nothing that
resolves the hostname works (the torch executor's store on several hosts)::

    @pytest.mark.parametrize("case", TESTS.cases)
    def test_between_hosts(case, rank_launch):
        rank_launch(TESTS, 6, launcher=fake_hosts.launcher(2)).check(case)

``python fake_hosts.py PER_HOST COMMAND...`` (what each rank runs): sets this
rank's hostname, then runs COMMAND in its place.
"""
import functools
import os
import shutil
import socket
import subprocess
import sys

_launchers = {}


def _rank():
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    raise RuntimeError("no rank in the environment: run under mpiexec")


def hostname(rank, per_host):
    return f"fakehost{rank // per_host}"


@functools.lru_cache(maxsize=None)
def unavailable_reason():
    """Why ranks cannot get hostnames of their own here, or None."""
    if os.geteuid() != 0:
        return "fake hosts need root (a UTS namespace per rank)"
    if shutil.which("unshare") is None:
        return "fake hosts need unshare (util-linux)"
    probe = subprocess.run(["unshare", "--uts", "hostname", "fakehost-probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --uts fails here: {probe.stderr.strip()}"
    return None


def launcher(per_host):
    """A launcher for harness.ranks.launch: ``per_host`` consecutive ranks per
    host. The same object per layout, so rank_launch starts each once."""
    if per_host not in _launchers:
        from harness.ranks import _mpiexec_or_fail

        def launch(ranks, argv, env):
            cmd = [_mpiexec_or_fail(), "-n", str(ranks), "unshare", "--uts", "--",
                   sys.executable, os.path.abspath(__file__), str(per_host), *argv]
            return cmd, env
        _launchers[per_host] = launch
    return _launchers[per_host]


if __name__ == "__main__":
    socket.sethostname(hostname(_rank(), int(sys.argv[1])))
    os.execv(sys.argv[2], sys.argv[2:])
