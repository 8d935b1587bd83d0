"""In-place recovery across real SSH hosts (network namespaces,
tests/harness/hosts.py): under ``hvdrun --recovery in-place`` the surviving
ranks of the torch digits example keep their processes when a rank is
killed, stopped or cut off, restore their last commit from memory, form the
next generation among themselves and go on; a listed host joins at the next
commit; below --min-np the job ends cleanly.

hvdrun runs on host 1 and most jobs use hosts 1-3 (host 4 joins in the growth
test), the lost rank on host 3; the jobs that lose ranks in turn use hosts 1-4
or 1-5, and each case reads its own loss from the job that its fixture ran
once. A stopped rank and a cut link keep a job each: in one job that lost
both, CI saw a fifth rank started (a replacement) by the time the checks ran,
and the survivor checks of both losses counted it. The state is
committed every step, so at most the failed step is redone. Each test prints
what it measured (run with -s); the times are checked by bench/, not here.
"""
import os
import re
import signal
import time
import uuid
from types import SimpleNamespace

import pytest

from harness.hosts import hosts_fixture
from test_elastic_multihost import (ElasticJob, _check_done, _nothing_left, _discovered_host_joins,  # noqa: F401
                                    hosts_arg, reference, tag)  # (tag: a fixture)


hosts = hosts_fixture(5, ("torch",), "5 hosts: the job of the faults inside operations uses them all.")


IN_PLACE = ["--recovery", "in-place"]
EVERY_STEP = ["--commit-every", "1"]


def _first_ranks(job):
    """{host: [start events]} of the ranks hvdrun started first."""
    out = {}
    for e in job.events("start"):
        out.setdefault(e["host"], []).append(e)
    return out


def _check_in_place(job, lost_at, lost_pids, until=None):
    """The survivors went on in their own processes from their last commit:
    returns (seconds from the loss to the next completed step, batches redone).
    ``lost_pids``: every rank lost by then; ``until``: when the next loss came
    (a job that loses ranks in turn)."""
    begins = [e for e in job.events("begin") if e["t"] > lost_at and (until is None or e["t"] < until)]
    assert begins, job.stderr_text()
    first_pids = {e["pid"] for e in job.events("start")}
    survivors = first_pids - set(lost_pids)
    assert {e["pid"] for e in begins} == survivors, (begins, survivors)
    assert len(job.events("start")) == len(first_pids), "a rank was started again"
    assert len({e["params_sha256"] for e in begins}) == 1, "survivors began the generation apart"
    resumed = begins[0]["step"]
    last = max(e["step"] for e in job.events("step", 0) if e["t"] < begins[0]["t"])
    redone = last - resumed
    assert 0 <= redone <= 1, (redone, last, resumed)
    first = min(e["t"] for e in job.events("step", 0) if e["t"] > begins[0]["t"])
    return first - lost_at, redone


def _in_place_job(hosts, tag, hvdrun_args, script_args=()):
    job = ElasticJob(hosts, tag, ["--min-np", "2"] + hvdrun_args + IN_PLACE,
                     EVERY_STEP + list(script_args))
    return job


@pytest.fixture(scope="module")
def kills_job(hosts):
    """Four hosts, --min-np 1: the ranks on hosts 4, 3 and 2 are SIGKILLed one
    after the other, each once the survivors of the one before trained on; rank
    0's process trains on alone to the end."""
    tag = "hvdltag-" + uuid.uuid4().hex[:10]
    job = ElasticJob(hosts, tag, ["--min-np", "1", "-H", hosts_arg(hosts, 4)] + IN_PLACE, EVERY_STEP)
    kills = []      # (time of the kill, pids killed)
    try:
        for k, at in ((3, 20), (2, 35), (1, 50)):
            job.step_at(at)
            victims = _first_ranks(job)[hosts.names[k]]
            killed_at = time.time()
            for e in victims:
                os.kill(e["pid"], signal.SIGKILL)
            kills.append((killed_at, [e["pid"] for e in victims]))
            size = 4 - len(kills)
            job.wait_for(lambda: [e for e in job.events("step", 0) if e["t"] > killed_at and e["size"] == size],
                         "a step on %d ranks after kill %d" % (size, len(kills)))
        job.wait()
    finally:
        _nothing_left(hosts, tag)
    return SimpleNamespace(job=job, kills=kills)


def test_in_place_rank_killed_survivors_go_on(hosts, kills_job):
    """The first kill of kills_job: the rank on host 4 of 4."""
    ref = reference(hosts, "torch")
    job = kills_job.job
    assert job.rc == 0, job.stderr_text()
    assert re.search(r"hvdrun: elastic: .*in-place", job.stderr_text()), job.stderr_text()
    (killed_at, victims), (next_at, _) = kills_job.kills[:2]
    took, redone = _check_in_place(job, killed_at, victims, until=next_at)
    done = _check_done(job, ref, 1)
    print("\nin place, SIGKILL -> next step %.3f s, %d batches redone, accuracy %.2f %% (uninterrupted %.2f %%)"
          % (took, redone, done["accuracy"], ref["accuracy"]))


def test_in_place_three_failures_in_a_row(hosts, kills_job):
    """All three kills of kills_job: each time the survivors go on in place,
    and rank 0's process ends the job alone."""
    ref = reference(hosts, "torch")
    job = kills_job.job
    assert job.rc == 0, job.stderr_text()
    lost_pids, times = [], []
    for i, (killed_at, victims) in enumerate(kills_job.kills):
        lost_pids += victims
        size = 3 - i
        times.append(min(e["t"] for e in job.events("step", 0) if e["t"] > killed_at and e["size"] == size)
                     - killed_at)
    first_pids = {e["pid"] for e in job.events("start")}
    assert len(job.events("start")) == 4 and {e["pid"] for e in job.events("done")} == first_pids - set(lost_pids)
    done = _check_done(job, ref, 1)
    print("\nin place, three kills in a row: next step %s s after each; accuracy %.2f %% (uninterrupted %.2f %%)"
          % (", ".join("%.2f" % t for t in times), done["accuracy"], ref["accuracy"]))


def test_in_place_rank_stopped_is_left_out(hosts, tag):
    job = _in_place_job(hosts, tag, ["-H", hosts_arg(hosts, 3)])
    job.step_at(30)
    victims = _first_ranks(job)[hosts.names[2]]
    stopped_at = time.time()
    for e in victims:
        os.kill(e["pid"], signal.SIGSTOP)
    try:
        job.wait()
    finally:
        for e in victims:
            try:
                os.kill(e["pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert job.rc == 0, job.stderr_text()
    took, redone = _check_in_place(job, stopped_at, [e["pid"] for e in victims])
    _check_done(job, reference(hosts, "torch"), 2)
    print("\nin place, SIGSTOP -> next step %.2f s (HVDLITE_TIMEOUT_SECONDS=3), %d batches redone"
          % (took, redone))


def test_in_place_host_link_down(hosts, tag):
    job = _in_place_job(hosts, tag, ["-H", hosts_arg(hosts, 3)])
    job.step_at(30)
    victims = _first_ranks(job)[hosts.names[2]]
    cut_at = time.time()
    hosts.set_link(3, False)
    try:
        job.wait()
    finally:
        hosts.set_link(3, True)
    assert job.rc == 0, job.stderr_text()
    took, redone = _check_in_place(job, cut_at, [e["pid"] for e in victims])
    _check_done(job, reference(hosts, "torch"), 2)
    print("\nin place, link down -> next step %.2f s (HVDLITE_TIMEOUT_SECONDS=3), %d batches redone"
          % (took, redone))


def test_in_place_discovered_host_joins_at_the_next_commit(hosts, tag, tmp_path):
    # Training ends only once the new rank (ssh, Python, torch) joined.
    grew = _discovered_host_joins(hosts, tmp_path, 10, lambda discovery: _in_place_job(
        hosts, tag, discovery, ["--step-sleep", "0.02", "--hold-until-size", "4"]))
    begins = grew.begins
    assert {e["pid"] for e in grew.started} <= {e["pid"] for e in begins}, "a first rank was started again"
    assert begins[0]["step"] == grew.before[-1]["step"], (begins[0], grew.before[-3:])
    print("\nin place, listed -> begun on 4 ranks %.2f s, resumed at step %d"
          % (grew.took, begins[0]["step"]))


def test_in_place_below_min_np_ends_naming_the_lost_host(hosts, tag):
    lost = hosts.names[2]
    job = ElasticJob(hosts, tag, ["--min-np", "3", "--elastic-timeout", "2", "-H", hosts_arg(hosts, 3)]
                     + IN_PLACE, EVERY_STEP)
    job.step_at(10)
    victims = _first_ranks(job)[lost]
    for e in victims:
        os.kill(e["pid"], signal.SIGKILL)
    job.wait()
    assert job.rc != 0
    err = job.stderr_text()
    assert re.search(r"hvdrun: elastic: fewer than --min-np 3 slots for 2 s \(--elastic-timeout\); "
                     r"hosts lost: %s \(lost rank 2 \(was killed by SIGKILL\)\)" % lost, err), err
    assert "Traceback" not in err, err


# One job loses a rank inside each operation in turn (fault_job); the process
# set's is second, at 4 ranks, so its set of ranks 1-3 is added again over 3.
FAULTS = [("commit", 20), ("process_set", 35), ("broadcast", 50), ("allgather", 65)]


@pytest.fixture(scope="module")
def fault_job(hosts):
    """5 hosts, --min-np 1: the job's last rank SIGKILLs itself inside a commit,
    an allreduce on a process set of ranks 1.., a broadcast and an allgather,
    one after the other (tests/scripts/elastic_digits.py --fault); rank 0 trains
    on alone to the end."""
    tag = "hvdltag-" + uuid.uuid4().hex[:10]
    faults = [arg for kind, at in FAULTS for arg in ("--fault", "%s:%d" % (kind, at))]
    # Four hosts answer hvdrun's first SSH check at once: more time for them on a loaded machine.
    job = ElasticJob(hosts, tag, ["--min-np", "1", "--ssh-connect-timeout", "3", "-H", hosts_arg(hosts, 5)]
                     + IN_PLACE, EVERY_STEP + faults, timeout=420)
    try:
        job.wait()
    finally:
        _nothing_left(hosts, tag)
    return job


@pytest.mark.parametrize("fault", [kind for kind, _ in FAULTS])
def test_in_place_rank_lost_inside_an_operation(hosts, fault_job, fault):
    """The job's last rank SIGKILLs itself inside a commit, an allreduce on a
    process set of ranks 1.. (at 4 ranks: the set is added again, over 3 ranks,
    in the next generation), a broadcast or an allgather: the survivors go on
    in place from their last commit."""
    job = fault_job
    ref = reference(hosts, "torch")
    assert job.rc == 0, job.stderr_text()
    faults = job.events("fault")
    assert [e["what"] for e in faults] == [kind for kind, _ in FAULTS], job.stderr_text()
    k = [kind for kind, _ in FAULTS].index(fault)
    assert faults[k]["size"] == 5 - k, faults[k]
    until = faults[k + 1]["t"] if k + 1 < len(faults) else None
    took, redone = _check_in_place(job, faults[k]["t"], [e["pid"] for e in faults[:k + 1]], until)
    done = _check_done(job, ref, 1)
    if fault == "process_set":
        # Added again over the survivors' ranks 1.. and used in the next generation.
        sets = job.events("process_set")
        assert [(e["size"], e["ranks"]) for e in sets] == [(4, [1, 2, 3]), (3, [1, 2])], sets
    print("\nin place, killed inside %s -> next step %.3f s, %d batches redone, accuracy %.2f %% "
          "(uninterrupted %.2f %%)" % (fault, took, redone, done["accuracy"], ref["accuracy"]))


@pytest.mark.parametrize("framework", ["keras3", "tf_keras"])
def test_in_place_keras_rank_killed_survivors_go_on(hosts, tag, framework):
    ref = reference(hosts, framework)
    job = ElasticJob(hosts, tag, ["--min-np", "2", "-H", hosts_arg(hosts, 3)] + IN_PLACE, EVERY_STEP,
                     framework=framework)
    job.step_at(30)
    victims = _first_ranks(job)[hosts.names[2]]
    killed_at = time.time()
    for e in victims:
        os.kill(e["pid"], signal.SIGKILL)
    job.wait()
    assert job.rc == 0, job.stderr_text()
    took, redone = _check_in_place(job, killed_at, [e["pid"] for e in victims])
    done = _check_done(job, ref, 2)
    print("\nin place, %s, SIGKILL -> next step %.3f s, %d batches redone, accuracy %.2f %% (uninterrupted %.2f %%)"
          % (framework, took, redone, done["accuracy"], ref["accuracy"]))
