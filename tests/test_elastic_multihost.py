"""Elastic jobs across real SSH hosts (network namespaces, tests/harness/hosts.py):
torch digits training under ``hvd.elastic.run`` keeps going when a host is
killed or cut off, grows when the discovery script lists a new host, and
gives up cleanly below --min-np.

hvdrun runs on host 1 and the job uses hosts 1-3 (host 4 joins in the growth
test); the lost host is always host 3.  Each test prints what it measured
(run with -s).
"""
import os
import re
import signal
import sys
import time
import uuid
from types import SimpleNamespace

import pytest

from harness.checks import require
from harness.hosts import REPO, hosts_fixture, hvdrun_env, wait_until_gone
from harness.hvdrun_job import HvdrunJob, discovery_script
from test_launcher_multihost import SCRIPTS, _describe

ELASTIC = os.path.join(SCRIPTS, "elastic_digits.py")
COMMIT_EVERY = 4


hosts = hosts_fixture(4, ("torch",))


# framework -> (script argument, extra environment)
FRAMEWORKS = {"torch": ("torch", {}), "keras3": ("keras", {}),
              "tf_keras": ("keras", {"TF_USE_LEGACY_KERAS": "1"})}
_references = {}


def reference(hosts, framework):
    """An uninterrupted elastic run on 3 hosts: its accuracy is the yardstick."""
    if framework not in _references:
        tag = "hvdltag-" + uuid.uuid4().hex[:10]
        job = ElasticJob(hosts, tag, ["--min-np", "2", "-H", hosts_arg(hosts, 3)], framework=framework)
        job.wait()
        _nothing_left(hosts, tag)
        assert job.rc == 0, job.stderr_text()
        done = job.events("done")
        assert len(done) == 3
        _references[framework] = done[0]
    return _references[framework]


@pytest.fixture
def tag(hosts):
    t = "hvdltag-" + uuid.uuid4().hex[:10]
    yield t
    _nothing_left(hosts, t)


def hosts_arg(hosts, count):
    return ",".join(hosts.names[:count])


def _nothing_left(hosts, tag, timeout=20.0):
    """No rank, wrapper, MPI proxy or SSH session of the job is left on any host."""
    deadline = time.time() + timeout
    per_host = {}
    left = []
    while time.time() < deadline:
        left = wait_until_gone(tag, timeout=0.5)
        per_host = {k: _describe(hosts.pids(k)) for k in range(1, hosts.count + 1)}
        if not left and not any(per_host.values()):
            return
        time.sleep(0.2)
    for pid in list(left) + [p for k in range(1, hosts.count + 1) for p in hosts.pids(k)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    raise AssertionError("left behind: %s; per host: %s" % (left, per_host))


class ElasticJob(HvdrunJob):
    """hvdrun --min-np ... on host 1, its output read as it comes."""
    poll_s = 0.2

    def __init__(self, hosts, tag, hvdrun_args, script_args=(), framework="torch", timeout=240):
        script, extra_env = FRAMEWORKS[framework]
        if framework != "torch":
            require("tensorflow")
        argv, env = hvdrun_env(hosts, dict(extra_env, TF_CPP_MIN_LOG_LEVEL="3"))
        env.setdefault("HVDLITE_TIMEOUT_SECONDS", "3")
        # These cases are the restart mode's (in-place recovery: test_inplace_multihost.py).
        full = hosts.on_host(1, argv + ["-i", hosts.key, "--ssh-connect-timeout", "1", "--recovery", "restart"] +
                             hvdrun_args +
                             [sys.executable, ELASTIC, tag, script, "--events",
                              "--commit-every", str(COMMIT_EVERY)] + list(script_args), cwd=REPO)
        super().__init__(full, env, timeout)

    def events(self, kind=None, rank=None):
        return [ev for ev in self.json_events(kind) if rank is None or ev["rank"] == rank]

    def failure_text(self):
        return self.stderr_text()

    def step_at(self, step):
        """Waits until rank 0 of the first generation reports ``step``."""
        return self.wait_for(lambda: [e for e in self.events("step", 0) if e["step"] >= step], "step %d" % step)


def _ranks_on(job, host, generation=1):
    return [e for e in job.events("start") if e["host"] == host and e["generation"] == generation]


def _check_resumed(job, lost_at, generation=2):
    """The next generation resumed from the newest commit made before the
    loss, redid at most the batches since, and finished with identical
    parameters everywhere.  Returns (seconds from the loss to the next step,
    batches redone)."""
    commits = [e for e in job.events("commit", 0) if e["t"] <= lost_at]
    begins = [e for e in job.events("begin") if e["t"] > lost_at]
    assert begins, job.stderr_text()
    resumed = begins[0]["step"]
    assert resumed >= commits[-1]["step"], (resumed, commits[-1])
    # Steps in flight when the host went may still have completed.
    last = max(e["step"] for e in job.events("step", 0) if e["t"] < begins[0]["t"])
    redone = last - resumed
    assert 0 <= redone < COMMIT_EVERY, (redone, last, resumed)
    assert len({e["params_sha256"] for e in begins}) == 1, "ranks began the generation apart"
    first = min(e["t"] for e in job.events("step", 0) if e["t"] > begins[0]["t"])
    return first - lost_at, redone


def _check_done(job, reference, ranks):
    done = job.events("done")
    assert len(done) == ranks, job.stderr_text()
    assert len({e["params_sha256"] for e in done}) == 1, "parameters differ between ranks at the end"
    assert abs(done[0]["accuracy"] - reference["accuracy"]) <= 1.0, (done[0]["accuracy"], reference)
    return done[0]


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_rank_killed_training_continues_on_the_others(hosts, tag, framework):
    lost = hosts.names[2]
    ref = reference(hosts, framework)
    job = ElasticJob(hosts, tag, ["--min-np", "2", "-H", hosts_arg(hosts, 3)], framework=framework)
    job.step_at(42)
    victims = _ranks_on(job, lost)
    assert victims, "no rank started on %s" % lost
    killed_at = time.time()
    for e in victims:
        os.kill(e["pid"], signal.SIGKILL)
    job.wait()
    assert job.rc == 0, job.stderr_text()
    err = job.stderr_text()
    assert re.search(r"hvdrun: elastic: host %s lost rank 2 \(was killed by SIGKILL\)" % lost, err), err
    assert re.search(r"generation 2 on %s:1,%s:1 \(2 ranks\)" % tuple(hosts.names[:2]), err), err
    took, redone = _check_resumed(job, killed_at)
    done = _check_done(job, ref, 2)
    started = min(e["t"] for e in job.events("start") if e["generation"] == 2)
    began = min(e["t"] for e in job.events("begin") if e["t"] > killed_at)
    print("\n%s: kill -> next step %.2f s (ranks of generation 2 running after %.2f s, resumed after "
          "%.2f s), %d batches redone, accuracy %.2f %% (uninterrupted %.2f %%)"
          % (framework, took, started - killed_at, began - killed_at, redone, done["accuracy"],
             ref["accuracy"]))


def test_host_link_down_training_continues_on_the_others(hosts, tag):
    lost = hosts.names[2]
    job = ElasticJob(hosts, tag, ["--min-np", "2", "-H", hosts_arg(hosts, 3)])
    job.step_at(42)
    cut_at = time.time()
    hosts.set_link(3, False)
    try:
        job.wait()
    finally:
        hosts.set_link(3, True)
    assert job.rc == 0, job.stderr_text()
    err = job.stderr_text()
    assert re.search(r"hvdrun: elastic: host %s stopped answering" % lost, err), err
    took, redone = _check_resumed(job, cut_at)
    done = _check_done(job, reference(hosts, "torch"), 2)
    print("\nlink down -> next step %.2f s (HVDLITE_TIMEOUT_SECONDS=3), %d batches redone, "
          "accuracy %.2f %%" % (took, redone, done["accuracy"]))


def _discovered_host_joins(hosts, tmp_path, at_step, start):
    """The discovered-host case of either recovery mode: ``start(hvdrun's discovery
    arguments)`` starts the job with hosts 1-3 listed; host 4 is listed too once rank 0
    reported ``at_step``. Checks that hvdrun ended well, that the 4 ranks began the
    generation after the listing with identical parameters and ended with identical
    parameters. Returns, for the test's own checks: job, started (the start events before
    the listing), begins (the begin events after it), before (rank 0's steps on 3 ranks)
    and took (seconds from the listing to rank 0's beginning on 4 ranks)."""
    script, listing = discovery_script(tmp_path, hosts.names[:3])
    job = start(["--host-discovery-script", str(script)])
    job.step_at(at_step)
    started = job.events("start")
    listed_at = time.time()
    listing.write_text("\n".join(hosts.names[:4]) + "\n")
    job.wait()
    assert job.rc == 0, job.stderr_text()
    begins = [e for e in job.events("begin") if e["t"] > listed_at]
    assert len(begins) == 4 and {e["size"] for e in begins} == {4}, job.stderr_text()
    assert len({e["params_sha256"] for e in begins}) == 1, "the new rank began apart from the others"
    done = job.events("done")
    assert len(done) == 4 and len({e["params_sha256"] for e in done}) == 1
    grown = min(e["t"] for e in begins if e["rank"] == 0)
    return SimpleNamespace(job=job, started=started, begins=begins, took=grown - listed_at,
                           before=[e for e in job.events("step", 0) if e["size"] == 3])


def test_discovered_host_joins_at_the_next_commit(hosts, tag, tmp_path):
    grew = _discovered_host_joins(hosts, tmp_path, 20, lambda discovery: ElasticJob(
        hosts, tag, ["--min-np", "2"] + discovery, ["--step-sleep", "0.02", "--hold-until-size", "4"]))
    begins = grew.begins
    newcomer = [e for e in grew.job.events("start") if e["host"] == hosts.names[3]]
    assert newcomer and newcomer[0]["generation"] == 2
    # The commit that noticed the new host is the one resumed from: nothing is redone.
    # Commits come every COMMIT_EVERY steps and at each epoch's end; the one that raised
    # HostsUpdatedInterrupt saved its state but printed no "commit" event.
    last = grew.before[-1]
    at_commit = last["step"] % COMMIT_EVERY == 0 or begins[0]["epoch"] != last["epoch"]
    assert begins[0]["step"] == last["step"] and at_commit, (begins[0], grew.before[-3:])
    print("\nlisted -> begun on 4 ranks %.2f s, resumed at step %d" % (grew.took, begins[0]["step"]))


def test_below_min_np_gives_up_naming_the_lost_host(hosts, tag):
    lost = hosts.names[2]
    job = ElasticJob(hosts, tag, ["--min-np", "3", "--elastic-timeout", "2", "-H", hosts_arg(hosts, 3)])
    job.step_at(10)
    victims = _ranks_on(job, lost)
    killed_at = time.time()
    for e in victims:
        os.kill(e["pid"], signal.SIGKILL)
    job.wait()
    took = time.time() - killed_at
    assert job.rc != 0
    last = job.stderr_text().strip().splitlines()[-1]
    assert re.match(r"hvdrun: elastic: fewer than --min-np 3 slots for 2 s \(--elastic-timeout\); "
                    r"hosts lost: %s \(lost rank 2 \(was killed by SIGKILL\)\)" % lost, last), last
    print("\nbelow --min-np: hvdrun gave up %.1f s after the kill" % took)
