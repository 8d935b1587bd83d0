"""Reliability: a failed rank becomes a prompt error on every other rank, bad
input becomes a clear exception, and long or threaded runs stay correct.

Failure modes run through plain ``mpiexec`` here; the same with hvdrun and a
rank on another host is in test_reliability_multihost.py. docs/reliability.md
lists what the user sees in each case.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

from harness import fake_hosts
from harness.hosts import hvdrun_argv, run_tagged
from harness.checks import require, unavailable
from harness.ranks import TESTS, RankTests, mpiexec, rank_env, run_ranks

FAILURE_LIMIT_S = 10.0
REPO = os.path.dirname(TESTS)
HOST = socket.gethostname()


def launch(script, ranks, args, env=None, timeout=120, hvdrun=False, per_host=None):
    """Runs ``script`` on ``ranks`` ranks (through plain mpiexec, hvdrun, or
    mpiexec on fake hosts of ``per_host`` consecutive ranks: harness.fake_hosts,
    root only) with a unique tag as its first argument; returns
    (CompletedProcess, tag, time the job ended). Fails if any of its processes
    is left."""
    tag = "hvdlrel-" + uuid.uuid4().hex[:10]
    rank_cmd = [sys.executable, os.path.join(TESTS, script), tag, *map(str, args)]
    if per_host is not None:
        why = fake_hosts.unavailable_reason()
        if why:
            unavailable(why)
        cmd, env = fake_hosts.launcher(per_host)(ranks, rank_cmd, env)
    elif hvdrun:
        argv, extra = hvdrun_argv()
        env = dict(env or {}, **extra)
        env.pop("HVDLITE_MPIEXEC", None)
        cmd = argv + ["-np", str(ranks)] + rank_cmd
    else:
        cmd = [mpiexec(), "-n", str(ranks)] + rank_cmd
    proc = run_tagged(cmd, tag, env=rank_env(env), timeout=timeout)
    return proc, tag, time.time()


def parse(stdout):
    ready = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"READY (\d+) (\d+)", stdout)}
    # Ranks' lines can run into each other in mpiexec's output: match numbers only.
    fail_at = [float(x) for x in re.findall(r"FAIL_AT (\d+(?:\.\d+)?)", stdout)]
    survivors = {int(m.group(1)): (float(m.group(2)), m.group(3))
                 for m in re.finditer(r"SURVIVOR (\d+) ERROR_AT (\d+(?:\.\d+)?) ((?:(?!SURVIVOR \d).)*)", stdout)}
    return ready, (fail_at[0] if fail_at else None), survivors


# What every survivor's error must say, per failure mode of rank {v}.
EXPECTED = {
    "raise": ("HvdliteShutdownError", "rank {v} exited with an unhandled exception: "
                                      "ValueError: simulated failure in rank {v}"),
    "raise_pending": ("HvdliteShutdownError", "rank {v} exited with an unhandled exception: "
                                              "ValueError: simulated failure in rank {v}"),
    "exit": ("HvdliteShutdownError", "rank {v} called sys.exit(3) (exit code 3)"),
    "shutdown": ("HvdliteShutdownError", "rank {v} called hvdlite.shutdown()"),
}


@pytest.mark.parametrize("mode,ranks,victim", [
    ("raise", 2, 1), ("raise", 4, 0),        # rank 0 is also the coordinator
    ("raise_pending", 2, 1), ("raise_pending", 4, 3),
    ("exit", 2, 1), ("exit", 4, 2),
    ("shutdown", 2, 0), ("shutdown", 4, 3),
])
def test_failed_rank_named_on_every_rank(mode, ranks, victim):
    proc, _, _ = launch("scripts/reliability_failure.py", ranks, [mode, victim])
    out = proc.stdout + proc.stderr
    ready, fail_at, survivors = parse(proc.stdout)
    assert len(ready) == ranks and fail_at is not None, out[-4000:]
    assert set(survivors) == set(range(ranks)) - {victim}, out[-4000:]
    cls, words = EXPECTED[mode]
    words = words.format(v=victim)
    for r, (at, message) in survivors.items():
        assert message.startswith(cls) and words in message, f"rank {r}: {message}"
        assert at - fail_at < FAILURE_LIMIT_S, f"rank {r} learnt it after {at - fail_at:.1f} s"
    assert proc.returncode != 0
    if mode == "exit":
        assert proc.returncode == 3, proc.returncode  # hydra passes on the largest code
    took = max(at for at, _ in survivors.values()) - fail_at
    print(f"\n{mode} on rank {victim} of {ranks}: every survivor raised within {took:.3f} s")


@pytest.mark.parametrize("ranks", [2, 4])
def test_sigkilled_rank_ends_the_job_under_mpiexec(ranks):
    """Plain mpiexec (hydra) sees the killed rank and kills the others at once.
    Its banner names a PID, not necessarily the killed one: hvdrun names it."""
    victim = ranks - 1
    proc, _, ended = launch("scripts/reliability_failure.py", ranks, ["sigkill", victim])
    out = proc.stdout + proc.stderr
    ready, fail_at, _ = parse(proc.stdout)
    assert proc.returncode != 0, out[-4000:]
    assert "BAD TERMINATION" in out and any(f"PID {pid} " in out for pid in ready.values()), out[-4000:]
    assert ended - fail_at < FAILURE_LIMIT_S
    print(f"\nSIGKILL of rank {victim} of {ranks} (mpiexec): job gone {ended - fail_at:.2f} s later")


# hvdrun's last line, per failure mode of rank {v}: (exit code, words).
HVDRUN_EXPECTED = {
    "raise": (1, r"hvdrun: rank {v} on host {h} failed: ValueError: simulated failure in rank {v}; "
                 r"hvdrun stopped the {o} other ranks? still running"),
    "exit": (3, r"hvdrun: rank {v} on host {h} failed: called sys.exit\(3\) \(exit code 3\); "
                r"hvdrun stopped the {o} other ranks? still running"),
    "sigkill": (137, r"hvdrun: rank {v} on host {h} was killed by SIGKILL; "
                     r"hvdrun stopped the {o} other ranks? still running"),
    # The victim stays alive; the first survivor to fail names it in its reason.
    "shutdown": (1, r"hvdrun: rank \d on host {h} failed: (hvdlite\.exceptions\.)?HvdliteShutdownError: hvdlite has shut "
                    r"down: rank {v} called hvdlite.shutdown\(\)"),
}


@pytest.mark.parametrize("mode,ranks", [("raise", 2), ("exit", 4), ("sigkill", 2), ("sigkill", 4),
                                        ("shutdown", 4)])
def test_failed_rank_named_by_hvdrun(mode, ranks):
    victim = ranks - 1
    proc, _, ended = launch("scripts/reliability_failure.py", ranks, [mode, victim], hvdrun=True)
    out = proc.stdout + proc.stderr
    _, fail_at, _ = parse(proc.stdout)
    code, pattern = HVDRUN_EXPECTED[mode]
    last = proc.stderr.strip().splitlines()[-1]
    assert re.match(pattern.format(v=victim, h=re.escape(HOST), o=ranks - 1), last), out[-4000:]
    assert proc.returncode == code, out[-4000:]
    assert ended - fail_at < FAILURE_LIMIT_S
    print(f"\n{mode} of rank {victim} of {ranks} (hvdrun): job gone {ended - fail_at:.2f} s later: {last}")


@pytest.mark.parametrize("ranks", [2, 4])
def test_hung_rank_times_out(ranks):
    """A rank that stops (SIGSTOP: no launcher can tell it from a slow one):
    with HVDLITE_TIMEOUT_SECONDS the others raise HvdliteTimeoutError and end
    the job with MPI_Abort instead of waiting in MPI_Finalize."""
    victim = 1
    proc, _, ended = launch("scripts/reliability_failure.py", ranks, ["sigstop", victim],
                            env={"HVDLITE_TIMEOUT_SECONDS": "2"})
    out = proc.stdout + proc.stderr
    _, fail_at, survivors = parse(proc.stdout)
    assert proc.returncode != 0, out[-4000:]
    # The first survivor to give up aborts the job, so later ones may not get to print.
    assert survivors, out[-4000:]
    for r, (at, message) in survivors.items():
        assert message.startswith("HvdliteTimeoutError") and "HVDLITE_TIMEOUT_SECONDS=2" in message
        assert at - fail_at < FAILURE_LIMIT_S
    # The abort notice is written at exit; when the launcher tears the job down
    # first (a loaded machine), the non-zero exit above is what proves no hang.
    assert ended - fail_at < FAILURE_LIMIT_S + 5
    print(f"\nSIGSTOP of rank {victim} of {ranks}: first error {min(a for a, _ in survivors.values()) - fail_at:.2f} s, "
          f"job gone {ended - fail_at:.2f} s later")


def test_hung_rank_inside_adasum_times_out():
    """Adasum's exchanges are point-to-point messages under the same wait
    policy: a rank stopped inside one still makes the others raise
    HvdliteTimeoutError instead of hanging."""
    proc, _, ended = launch("scripts/reliability_adasum_hang.py", 4, [],
                            env={"HVDLITE_TIMEOUT_SECONDS": "2"})
    out = proc.stdout + proc.stderr
    _, fail_at, survivors = parse(proc.stdout)
    assert proc.returncode != 0 and fail_at is not None and survivors, out[-4000:]
    for r, (at, message) in survivors.items():
        assert message.startswith("HvdliteTimeoutError") and "HVDLITE_TIMEOUT_SECONDS=2" in message, message
        assert at - fail_at < FAILURE_LIMIT_S
    assert ended - fail_at < FAILURE_LIMIT_S + 5
    waits = sorted(set(re.findall(r"WAITED_IN \d (.+)", proc.stdout)))
    print(f"\nSIGSTOP inside Adasum: first error {min(a for a, _ in survivors.values()) - fail_at:.2f} s; "
          f"timed out in {waits}")


SOCKET_RING = {"HVDLITE_SHM_ALLREDUCE": "0", "HVDLITE_RING_ALLREDUCE": "1", "HVDLITE_RING_WIRE": "socket"}


def test_hung_rank_inside_the_socket_ring_times_out():
    """A rank stopped while every rank's allreduces cross the ring's own
    sockets: its neighbours wait asleep in poll(2), and still raise
    HvdliteTimeoutError after HVDLITE_TIMEOUT_SECONDS; the first to give up
    closes its sockets, so the other may hear of it that way (and print it
    first, before the launcher ends the job), but not before the timeout.
    (The stop may also catch the victim between two allreduces, in
    negotiation, which times out the same way; most of each step is the
    ring's.)"""
    proc, _, ended = launch("scripts/socket_ring_failure.py", 3, ["sigstop", 1],
                            env=dict(SOCKET_RING, HVDLITE_TIMEOUT_SECONDS="2"))
    out = proc.stdout + proc.stderr
    ready, fail_at, survivors = parse(proc.stdout)
    assert len(ready) == 3 and fail_at is not None and survivors, out[-4000:]
    timed_out = "did not complete within HVDLITE_TIMEOUT_SECONDS=2"
    for r, (at, message) in survivors.items():
        assert message.startswith("HvdliteTimeoutError"), message
        assert timed_out in message or "closed its connection" in message, message
        assert 1.5 < at - fail_at < FAILURE_LIMIT_S, at - fail_at
    assert ended - fail_at < FAILURE_LIMIT_S + 5
    print(f"\nSIGSTOP inside the socket ring: first error {min(a for a, _ in survivors.values()) - fail_at:.2f} s")


def closed_socket_ring_survivors(mode, ranks=3, neighbours=(0, 2), per_host=None):
    """Runs socket_ring_failure.py MODE with rank 1 the victim; checks that
    its ring neighbours raised the lost neighbour's error in time, with no
    timeout set. Returns {rank: (time, message)} and the failure's time."""
    proc, _, _ = launch("scripts/socket_ring_failure.py", ranks, [mode, 1], env=SOCKET_RING, per_host=per_host)
    out = proc.stdout + proc.stderr
    ready, fail_at, survivors = parse(proc.stdout)
    assert len(ready) == ranks and fail_at is not None, out[-4000:]
    assert set(neighbours) <= set(survivors), out[-4000:]
    survivors = {r: survivors[r] for r in neighbours}
    for r, (at, message) in survivors.items():
        assert message.startswith("HvdliteTimeoutError"), message
        assert "socket ring: the" in message and "neighbour (ring rank" in message, message
        assert at - fail_at < FAILURE_LIMIT_S, f"rank {r} learnt it after {at - fail_at:.1f} s"
    return survivors, fail_at


def test_closed_socket_ring_fails_the_neighbours_at_once():
    """A rank whose engine goes (abandoned here; a dead process's sockets
    close the same way) fails both neighbours' allreduces at once: they read
    the end of its stream, and the ring's own neighbour-to-neighbour closing
    carries the news around. (A neighbour that had already finished that
    allreduce waits in negotiation and hears of it 2 s later: the next case.)"""
    survivors, fail_at = closed_socket_ring_survivors("abandon")
    print(f"\nabandon inside the socket ring: survivors raised within "
          f"{max(a for a, _ in survivors.values()) - fail_at:.3f} s")


def test_closed_socket_ring_fails_the_neighbours_in_negotiation():
    """A rank whose engine goes between two collectives: its neighbours wait
    in negotiation, on MPI, which does not see it go; their ring sockets do,
    and the wait ends with the lost neighbour's error after its grace (2 s:
    a peer that closed in order had finished the round)."""
    survivors, fail_at = closed_socket_ring_survivors("between")
    for message in (m for _, m in survivors.values()):
        assert "(seen in MPI_" in message and "negotiation" in message, message
    print(f"\nabandon between two collectives on the socket ring: survivors raised within "
          f"{max(a for a, _ in survivors.values()) - fail_at:.3f} s")


def test_closed_socket_ring_between_hosts_fails_the_neighbour_in_negotiation():
    """The same between hosts, hierarchically: 2 fake hosts of 2 ranks whose
    ring between the hosts runs on its own sockets. Rank 1 goes between two
    collectives; rank 3, its neighbour on that ring, waits in negotiation on
    the job's MPI and hears of it through the ring's sockets. (The others have
    no socket to rank 1: the launcher ends the job when rank 3 exits.)"""
    survivors, fail_at = closed_socket_ring_survivors("between", 4, (3,), per_host=2)
    message = survivors[3][1]
    assert "(seen in MPI_" in message and "negotiation" in message, message
    print(f"\nabandon between two collectives on the ring between hosts: rank 3 raised within "
          f"{survivors[3][0] - fail_at:.3f} s")


def test_stall_shutdown_stops_every_rank():
    """A rank that never submits a tensor the others wait for: the stall
    inspector warns naming it, then stops every rank with StallError."""
    proc, _, _ = launch("scripts/reliability_failure.py", 2, ["stall", 1],
                        env={"HVDLITE_STALL_CHECK_TIME_SECONDS": "1",
                             "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3"})
    out = proc.stdout + proc.stderr
    _, start, failed = parse(proc.stdout)
    assert proc.returncode != 0 and set(failed) == {0, 1}, out[-4000:]
    assert "WARNING stall inspector: tensor 'stalled'" in proc.stderr, out[-4000:]
    for r, (at, message) in failed.items():
        assert message.startswith("StallError") and "not by ranks [1]" in message, message
        assert 3 <= at - start < FAILURE_LIMIT_S, at - start


# ---------------------------------------------------------------- bad input

BAD_INPUT = RankTests("scripts/reliability_bad_input.py")
LARGE_CASES = ["test_large_int8_allreduce", "test_large_uint8_broadcast"]


@pytest.mark.parametrize("case", [c for c in BAD_INPUT.cases if c not in LARGE_CASES])
@pytest.mark.parametrize("ranks", [2, 4])
def test_bad_input_catalogue(ranks, case, rank_launch):
    rank_launch(BAD_INPUT, ranks).check(case)


def _mem_available_gb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2 ** 20
    return 0.0


LARGE_MEMORY_GB = 12.0  # 2 ranks at about 5 GB each at the peak, and some room


@pytest.mark.parametrize("case", LARGE_CASES)
def test_large_counts(case, rank_launch):
    """2^31+3 int8 elements on 2 ranks (an allreduce, a broadcast): right at the
    2^30-element chunk borders and in the last partial chunk. It needs
    LARGE_MEMORY_GB of free memory: where that is missing it is skipped, and
    fails under HVDLITE_TEST_REQUIRE_ALL=1 (CI runners have 24 GB)."""
    if _mem_available_gb() < LARGE_MEMORY_GB:
        unavailable(f"2^31+3-element collectives need {LARGE_MEMORY_GB:.0f} GB of free memory "
                    f"(about 5 GB per rank); {_mem_available_gb():.1f} GB available")
    reports = rank_launch(BAD_INPUT, 2, env={"HVDLITE_TEST_LARGE": "1"}, cases=LARGE_CASES,
                          timeout=900).check(case)
    print("\n" + "\n".join(line for r in reports for line in reports[r]["stdout"].splitlines()
                            if "LARGE" in line))


@pytest.mark.parametrize("ranks", [2, 4])
def test_device_path_rank_failure_fails_fast(ranks):
    """A rank dies while the device executor (gloo) has its collectives in
    flight: every survivor's handles fail at once, naming it."""
    require("torch")
    proc, _, _ = launch("scripts/device_faults.py", ranks, ["raise"], env={"HVDLITE_DEVICE_TRANSPORT": "gloo"})
    out = proc.stdout + proc.stderr
    ready, fail_at, survivors = parse(proc.stdout)
    assert len(ready) == ranks and fail_at is not None, out[-4000:]
    assert set(survivors) == set(range(ranks)) - {1}, out[-4000:]
    for r, (at, message) in survivors.items():
        assert message.startswith("HvdliteShutdownError") and "rank 1 exited with an unhandled exception" \
            in message, f"rank {r}: {message}"
        assert at - fail_at < FAILURE_LIMIT_S, f"rank {r} learnt it after {at - fail_at:.1f} s"
    print("\ndevice path, rank 1 of %d raised: survivors failed within %.3f s"
          % (ranks, max(at for at, _ in survivors.values()) - fail_at))


def test_device_path_shutdown_with_jobs_in_flight():
    """shutdown() while 20 device allreduces of 4 MB are queued: each
    completes with the right result or fails with HvdliteShutdownError."""
    require("torch")
    proc, _, _ = launch("scripts/device_faults.py", 2, ["shutdown"], env={"HVDLITE_DEVICE_TRANSPORT": "gloo"})
    done = re.findall(r"DONE (\d+) (\d+) (\d+)", proc.stdout)
    assert proc.returncode == 0 and len(done) == 2, (proc.stdout + proc.stderr)[-4000:]
    for _, completed, failed in done:
        assert int(completed) + int(failed) == 20
    print("\nshutdown with 20 device jobs queued: %s" % ", ".join(
        "rank %s %s completed, %s failed" % d for d in done))


# ---------------------------------------------------------------- long and threaded runs

SHM_FULL = r"""
import numpy as np
import hvdlite as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
for size in (5, 40000, 1 << 20):
    got = hvd.allreduce(np.full(size, r + 1, np.float32), op=hvd.Sum, name="full.%d" % size)
    assert np.array_equal(got, np.full(size, n * (n + 1) / 2, np.float32)), size
stats = hvd.engine_stats()
assert stats["shm_collectives"] == 0, "the shared-memory path ran without its segment: %r" % stats
print("RANK %d OK" % r, flush=True)
"""


def test_full_dev_shm_falls_back_to_mpi(tmp_path):
    """/dev/shm too small for the engine's segment (a container's 64 MB tmpfs,
    here 48 MB against a 512 MB segment): MPI carries the set, no SIGBUS."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        unavailable("needs root and unshare to mount a small /dev/shm in a private mount namespace")
    script = tmp_path / "shm_full.py"
    script.write_text(SHM_FULL)
    inner = "mount -t tmpfs -o size=48m tmpfs /dev/shm && exec %s -n 2 %s %s" % (
        mpiexec(), sys.executable, script)
    # 1024 slots of 2 x 128 KB per rank: a 512 MB segment cannot be allocated.
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
                          env=rank_env({"HVDLITE_SHM_SLOTS": "1024"}), capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.count("OK") == 2, out[-4000:]


THREADS = RankTests("scripts/reliability_threads.py")


@pytest.mark.parametrize("case", THREADS.cases)
def test_concurrent_threads_data_integrity(case, rank_launch):
    reports = rank_launch(THREADS, 2).check(case)
    for report in (reports or {}).values():
        print(report["stdout"], end="")


def test_soak_short(tmp_path):
    """500 steps of bench/soak.py: every result checked, RSS flat after warm-up,
    no descriptor leak."""
    import json
    out = tmp_path / "soak.json"
    run_ranks(os.path.join(REPO, "bench", "soak.py"), 2,
              args=["--steps", 500, "--warmup", 200, "--json", out], timeout=600)
    for r in (0, 1):
        s = json.loads((tmp_path / f"soak.json.{r}").read_text())
        growth = (s["rss_end_kb"] - s["rss_warm_kb"]) / s["rss_warm_kb"]
        assert growth < 0.05, f"rank {r}: RSS {s['rss_warm_kb']} -> {s['rss_end_kb']} kB"
        if s["heap_warm_kb"] > 0:  # what malloc handed out: a leak shows here first
            # less the engine's staging buffers, a high-water mark that timing moves
            grown = (s["heap_end_kb"] - s["heap_warm_kb"]) - (s["buffers_end_kb"] - s["buffers_warm_kb"])
            assert grown < 0.01 * s["heap_warm_kb"] + 64, (
                f"rank {r}: heap {s['heap_warm_kb']} -> {s['heap_end_kb']} kB, engine buffers "
                f"{s['buffers_warm_kb']} -> {s['buffers_end_kb']} kB")
        assert s["fds_end"] == s["fds_warm"], s
        assert s["errors"] == 0 and s["checked"] == s["steps"], s
        print(f"\nrank {r}: RSS {s['rss_warm_kb']} -> {s['rss_end_kb']} kB ({100 * growth:+.2f} %), "
              f"malloc'd {s['heap_warm_kb']} -> {s['heap_end_kb']} kB, fds {s['fds_warm']} -> {s['fds_end']}")
