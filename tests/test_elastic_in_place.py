"""In-place recovery across real SSH hosts (network namespaces,
tests/harness/hosts.py): under ``hvdrun --recovery in-place`` the surviving
ranks of the torch digits example keep their processes when a rank is
killed, stopped or cut off, restore their last commit from memory, form the
next generation among themselves and go on; a listed host joins at the next
commit; below --min-np the job ends cleanly.

hvdrun runs on host 1 and the job uses hosts 1-3 (host 4 joins in the growth
test); the lost rank is always on host 3. The state is committed every step,
so at most the failed step is redone. Each test prints what it measured (run
with -s); the times are checked by bench/, not here.
"""
import os
import re
import signal
import time

import pytest

from test_elastic_multihost import (ElasticJob, _check_done, _nothing_left, hosts,  # noqa: F401 (fixtures)
                                    _discovered_host_joins, hosts_arg, reference, tag)

IN_PLACE = ["--recovery", "in-place"]
EVERY_STEP = ["--commit-every", "1"]


def _first_ranks(job):
    """{host: [start events]} of the ranks hvdrun started first."""
    out = {}
    for e in job.events("start"):
        out.setdefault(e["host"], []).append(e)
    return out


def _check_in_place(job, lost_at, lost_pids):
    """The survivors went on in their own processes from their last commit:
    returns (seconds from the loss to the next completed step, batches redone)."""
    begins = [e for e in job.events("begin") if e["t"] > lost_at]
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


def test_in_place_rank_killed_survivors_go_on(hosts, tag):
    lost = hosts.names[2]
    ref = reference(hosts, "torch")
    job = _in_place_job(hosts, tag, ["-H", hosts_arg(hosts, 3)])
    job.step_at(42)
    victims = _first_ranks(job)[lost]
    killed_at = time.time()
    for e in victims:
        os.kill(e["pid"], signal.SIGKILL)
    job.wait()
    assert job.rc == 0, job.stderr_text()
    assert re.search(r"hvdrun: elastic: .*in-place", job.stderr_text()), job.stderr_text()
    took, redone = _check_in_place(job, killed_at, [e["pid"] for e in victims])
    done = _check_done(job, ref, 2)
    print("\nin place, SIGKILL -> next step %.3f s, %d batches redone, accuracy %.2f %% (uninterrupted %.2f %%)"
          % (took, redone, done["accuracy"], ref["accuracy"]))


def test_in_place_three_failures_in_a_row(hosts, tag):
    """Four hosts, --min-np 1: ranks on hosts 4, 3 and 2 are killed one after
    the other; rank 0's process trains on alone to the end."""
    ref = reference(hosts, "torch")
    job = ElasticJob(hosts, tag, ["--min-np", "1", "-H", hosts_arg(hosts, 4)] + IN_PLACE, EVERY_STEP)
    lost_pids, times = [], []
    for k, at in ((3, 20), (2, 35), (1, 50)):
        job.step_at(at)
        victims = _first_ranks(job)[hosts.names[k]]
        killed_at = time.time()
        for e in victims:
            os.kill(e["pid"], signal.SIGKILL)
        lost_pids += [e["pid"] for e in victims]
        size = 3 - len(times)
        job.wait_for(lambda: [e for e in job.events("step", 0) if e["t"] > killed_at and e["size"] == size],
                     "a step on %d ranks after kill %d" % (size, len(times) + 1))
        times.append(min(e["t"] for e in job.events("step", 0) if e["t"] > killed_at and e["size"] == size)
                     - killed_at)
    job.wait()
    assert job.rc == 0, job.stderr_text()
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
    # Slow steps: the new rank's process (ssh, Python, torch) must be up before training ends.
    grew = _discovered_host_joins(hosts, tmp_path, 10, lambda discovery: _in_place_job(
        hosts, tag, discovery, ["--step-sleep", "0.06"]))
    begins = grew.begins
    assert {e["pid"] for e in grew.started} <= {e["pid"] for e in begins}, "a first rank was started again"
    assert begins[0]["step"] == grew.before[-1]["step"], (begins[0], grew.before[-3:])
    print("\nin place, listed -> first step on 4 ranks %.2f s, resumed at step %d"
          % (grew.took, begins[0]["step"]))


def test_in_place_below_min_np_ends_naming_the_lost_host(hosts, tag):
    lost = hosts.names[2]
    job = ElasticJob(hosts, tag, ["--min-np", "3", "--elastic-timeout", "4", "-H", hosts_arg(hosts, 3)]
                     + IN_PLACE, EVERY_STEP)
    job.step_at(10)
    victims = _first_ranks(job)[lost]
    for e in victims:
        os.kill(e["pid"], signal.SIGKILL)
    job.wait()
    assert job.rc != 0
    err = job.stderr_text()
    assert re.search(r"hvdrun: elastic: fewer than --min-np 3 slots for 4 s \(--elastic-timeout\); "
                     r"hosts lost: %s \(lost rank 2 \(was killed by SIGKILL\)\)" % lost, err), err
    assert "Traceback" not in err, err


@pytest.mark.parametrize("fault", ["commit", "broadcast", "allgather", "process_set"])
def test_in_place_rank_lost_inside_an_operation(hosts, tag, fault):
    """The job's last rank SIGKILLs itself inside a commit, a broadcast, an
    allgather or an allreduce on a process set of ranks 1.. (4 hosts: the set
    is added again, over 3 ranks, in the next generation) at step 30."""
    count = 4 if fault == "process_set" else 3
    ref = reference(hosts, "torch")
    job = _in_place_job(hosts, tag, ["-H", hosts_arg(hosts, count)], ["--fault", "%s:30" % fault])
    job.wait()
    assert job.rc == 0, job.stderr_text()
    faults = job.events("fault")
    assert [e["what"] for e in faults] == [fault], job.stderr_text()
    took, redone = _check_in_place(job, faults[0]["t"], [faults[0]["pid"]])
    done = _check_done(job, ref, count - 1)
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
