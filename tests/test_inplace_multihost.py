"""Elastic hvdrun with in-place recovery across real SSH hosts (network
namespaces, tests/harness/hosts.py; root): the survivors of a rank killed on
host 3 keep their processes and go on, and a host the discovery script lists
later joins at the next generation. hvdrun runs on host 1; each rank is its
own ``mpiexec -n 1`` (through hydra's proxy over ssh for hosts 2-4), on MPICH's
ofi netmod with the tcp provider. Each test prints what it measured (-s)."""

import re
import time
import uuid

import pytest

from harness.hosts import REPO, hosts_fixture, hvdrun_env
from harness.hvdrun_job import discovery_script
from harness.inplace_job import InPlaceJob, end_jobs, script_argv
from test_elastic_multihost import _nothing_left

# Kill -> the survivors' next allreduce; the prototype measured 89-114 ms
# between two of these hosts. The bound leaves room for a loaded machine.
RECOVERY_LIMIT_S = 1.0


hosts = hosts_fixture(4)


_jobs = []


@pytest.fixture
def tag(hosts):
    t = "hvdltag-" + uuid.uuid4().hex[:10]
    yield t
    left = end_jobs(_jobs)
    assert not left, "processes of hvdrun left behind: %s" % left
    _nothing_left(hosts, t)


def start(hosts, tag, hvdrun_args, *script_args):
    argv, env = hvdrun_env(hosts)
    full = hosts.on_host(1, argv + ["-i", hosts.key, "--ssh-connect-timeout", "1"] + hvdrun_args +
                         script_argv(tag, *script_args), cwd=REPO)
    _jobs.append(InPlaceJob(full, env, timeout=240))
    return _jobs[-1]


def test_rank_killed_on_a_host_the_others_go_on_in_place(hosts, tag):
    names = hosts.names
    job = start(hosts, tag, ["--min-np", "2", "-H", ",".join(names[:3])], "--steps", 150, "--pause", "2:30")
    gen0 = {e["uid"]: e for e in job.wait_for(lambda: len(job.events("gen", generation=0)) == 3 and
                                              job.events("gen", generation=0), "generation 0")}
    killed_at = job.kill(2)
    took = job.recovery_s(killed_at, 1)
    assert job.wait() == 0, job.text()
    err = job.stderr()
    assert "hvdrun: elastic: recovery in place" in err, err
    assert "hvdrun: elastic: host %s lost rank 2 (was killed by SIGKILL)" % names[2] in err, err
    assert re.search(r"generation 1 on %s:1,%s:1 \(2 ranks: uids 0,1\)" % tuple(names[:2]), err), err
    after = {e["uid"]: e["pid"] for e in job.events("gen", generation=1)}
    assert after == {u: gen0[u]["pid"] for u in (0, 1)}, "the survivors were restarted"
    assert {e["uid"]: e["step"] for e in job.events("done")} == {0: 150, 1: 150}
    print("\nthree hosts, SIGKILL of the rank on host 3 -> the survivors' next allreduce: %.3f s" % took)
    assert took < RECOVERY_LIMIT_S


def test_host_cut_off_the_others_go_on_in_place(hosts, tag):
    """Host 3's link goes down: nothing ends, so no notice comes. The others'
    wait times out (2 s here, the engine's HVDLITE_TIMEOUT_SECONDS), they join
    the next generation, and the rank on host 3 is left out by the join
    deadline and stopped."""
    names = hosts.names
    job = start(hosts, tag, ["--min-np", "2", "-H", ",".join(names[:3])], "--steps", 150, "--timeout", 2)
    job.wait_step(30)
    cut_at = time.time()
    hosts.set_link(3, False)
    try:
        took = job.recovery_s(cut_at, 1)
        assert job.wait() == 0, job.text()
    finally:
        hosts.set_link(3, True)
    err = job.stderr()
    assert re.search(r"elastic: rank 2 on %s did not join generation 1 within 0.5 s of the first "
                     r"survivor; hvdrun stops it" % names[2], err), err
    assert re.search(r"generation 1 on %s:1,%s:1 \(2 ranks: uids 0,1\)" % tuple(names[:2]), err), err
    assert {e["uid"]: e["step"] for e in job.events("done")} == {0: 150, 1: 150}
    print("\nthree hosts, host 3's link down -> the survivors' next allreduce: %.2f s (their wait "
          "times out after 2 s)" % took)
    assert took < 2.0 + RECOVERY_LIMIT_S


def test_survivor_left_out_on_a_healthy_host_is_replaced(hosts, tag):
    """The rank on host 2 never joins after the rank on host 3 was killed (as
    one stuck inside MPI): the join deadline leaves it out, hvdrun stops it,
    host 2 still answers SSH, so a new rank starts there and joins the others
    at their next check."""
    names = hosts.names
    # Slow steps: the new rank's process (ssh, Python) must be up before the 300 steps are done.
    job = start(hosts, tag, ["--min-np", "2", "-H", "%s:2,%s,%s" % tuple(names[:3])], "--steps", 300,
                "--step-sleep", 0.03, "--pause", "3:30", "--withhold", 2)
    took = job.recovery_s(job.kill(3), 1)
    job.wait_for(lambda: job.events("gen", 4), "the new rank's first generation")
    assert job.wait() == 0, job.text()
    err = job.stderr()
    assert re.search(r"elastic: rank 2 on %s did not join generation 1 within 0.5 s" % names[1], err), err
    assert "elastic: starting 1 rank on %s:1; they join at the next generation" % names[1] in err, err
    assert re.search(r"generation 1 on %s:2 \(2 ranks: uids 0,1\)" % names[0], err), err
    assert re.search(r"generation 2 on %s:2,%s:1 \(3 ranks: uids 0,1,4\)" % tuple(names[:2]), err), err
    assert "host %s" % names[1] not in " ".join(l for l in err.splitlines() if "lost rank" in l), err
    assert {e["uid"]: e["step"] for e in job.events("done")} == {0: 300, 1: 300, 4: 300}
    print("\nthree hosts, SIGKILL on host 3 with the survivor on host 2 stuck: next allreduce %.2f s "
          "after the kill, a new rank on host 2 from generation 2" % took)


def test_discovered_host_joins_at_the_next_generation(hosts, tag, tmp_path):
    names = hosts.names
    script, listing = discovery_script(tmp_path, names[:3])
    job = start(hosts, tag, ["--min-np", "2", "--host-discovery-script", str(script)], "--steps", 300)
    job.wait_step(20)
    listed_at = time.time()
    listing.write_text("\n".join(names[:4]) + "\n")
    first = job.wait_for(lambda: job.events("step", 3), "a step of the new rank")[0]
    assert job.wait() == 0, job.text()
    err = job.stderr()
    assert "elastic: starting 1 rank on %s:1" % names[3] in err, err
    assert re.search(r"generation 1 on %s:1,%s:1,%s:1,%s:1 \(4 ranks: uids 0,1,2,3\)" % tuple(names), err), err
    gen1 = job.events("gen", generation=1)
    assert sorted((e["uid"], e["rank"], e["size"]) for e in gen1) == [(u, u, 4) for u in range(4)]
    before = {e["uid"]: e["pid"] for e in job.events("gen", generation=0)}
    assert {e["uid"]: e["pid"] for e in gen1 if e["uid"] < 3} == before, "the old ranks were restarted"
    assert {e["uid"]: e["step"] for e in job.events("done")} == {u: 300 for u in range(4)}
    print("\nthree hosts + a discovered fourth: listed -> its first allreduce %.2f s (its process "
          "started, joined the rendezvous, the others joined at their next check)"
          % (first["t"] - listed_at))
