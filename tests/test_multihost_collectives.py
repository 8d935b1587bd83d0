"""Collectives between hosts: every check of tests/scripts/engine_collectives.py
on ranks spread over network-namespace hosts with their own sshd
(tests/harness/hosts.py), started by hvdrun, MPI over TCP. One rank per host
takes the ring between hosts (over its own sockets, the default, and over
MPI);
two per host take it hierarchically (reduce in the host, ring between hosts)
unless that is turned off. The thresholds are
lowered so that most reductions take the ring, in many chunks. The autotune
cases run here too: between hosts the wire's settings are knobs.

Needs root and network namespaces, as tests/test_launcher_multihost.py.
"""
import os

import pytest

from harness.hosts import hosts_fixture, hvdrun_argv
from harness.ranks import RankTests

COLLECTIVES = RankTests("scripts/engine_collectives.py")
AUTOTUNE = RankTests("scripts/engine_autotune.py")
RING_SMALL = {"HVDLITE_RING_THRESHOLD": "1024", "HVDLITE_RING_CHUNK_BYTES": "4096"}
# 2x2: hierarchical by default, in pieces of 6144 floats, each ring over 2
# chunks per segment; and with it turned off (MPI's allreduce).
LAYOUTS = {"2x1": (2, 1, {}),
           "2x1 MPI ring": (2, 1, {"HVDLITE_RING_WIRE": "mpi"}),
           "2x2 hierarchical": (2, 2, {"HVDLITE_HIERARCHICAL_PIECE_BYTES": "24576"}),
           "2x2 MPI": (2, 2, {"HVDLITE_HIERARCHICAL_ALLREDUCE": "0"})}
_launchers = {}


hosts = hosts_fixture(2)


def launcher_for(hosts, per_host):
    """hvdrun on the first host, `per_host` ranks on each (the same object per
    layout, so rank_launch starts each layout once)."""
    if per_host not in _launchers:
        def launch(ranks, argv, env):
            prefix, extra = hvdrun_argv()
            env = dict(env, **extra)
            env.update(PATH=hosts.bin_dir + os.pathsep + env["PATH"], UCX_TLS="tcp,self")
            env.pop("HVDLITE_MPIEXEC", None)
            spec = ",".join(f"{name}:{per_host}" for name in hosts.names)
            cmd = prefix + ["-np", str(ranks), "-H", spec, "-i", hosts.key] + argv
            return hosts.on_host(1, cmd, cwd=os.path.dirname(os.path.abspath(__file__))), env
        _launchers[per_host] = launch
    return _launchers[per_host]


@pytest.mark.parametrize("case", COLLECTIVES.cases)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_collectives_between_hosts(layout, case, hosts, rank_launch):
    host_count, per_host, env = LAYOUTS[layout]
    rank_launch(COLLECTIVES, host_count * per_host, env=dict(RING_SMALL, **env),
                launcher=launcher_for(hosts, per_host)).check(case)


@pytest.mark.parametrize("case", AUTOTUNE.cases)
@pytest.mark.parametrize("layout", ["2x1", "2x2 hierarchical"])
def test_autotune_between_hosts(layout, case, hosts, rank_launch):
    """The wire's knobs (ring chunk, hierarchical) join the search."""
    host_count, per_host, env = LAYOUTS[layout]
    rank_launch(AUTOTUNE, host_count * per_host, env=dict(RING_SMALL, **env),
                launcher=launcher_for(hosts, per_host)).check(case)
