"""The engine's flight recorder (docs/reliability.md, "Flight recorder") on real
ranks: what hvdlite.flight_recorder() returns, its size setting, the dumps a
killed rank's survivors write and hvdrun's merged report, and a dump on
SIGUSR1 that leaves the job running. The ring itself: tests/cpp/test_flight_recorder.cc.
"""
import json
import os
import re
import socket
import sys
import uuid

from harness.hosts import run_tagged
from harness.ranks import TESTS, mpiexec, rank_env

REPO = os.path.dirname(TESTS)
sys.path.insert(0, REPO)
from launcher.flight_report import FlightDumps, parse_flight_line  # noqa: E402  (this checkout's)
SCRIPT = os.path.join(TESTS, "scripts", "flight_recorder.py")
HOST = socket.gethostname()


def run(mode, ranks, hvdrun_dir=None, env=None, timeout=60):
    """Runs the rank script under mpiexec, or under this checkout's hvdrun
    with --output-filename ``hvdrun_dir``; fails if a process is left."""
    tag = "hvdlfr-" + uuid.uuid4().hex[:10]
    rank_cmd = [sys.executable, SCRIPT, tag, mode]
    env = dict(env or {}, PYTHONPATH=os.pathsep.join([TESTS, REPO]))
    if hvdrun_dir is not None:
        # This checkout's launcher (launcher/), whatever hvdlite.launcher is installed.
        cmd = [sys.executable, "-m", "launcher", "-np", str(ranks), "--output-filename", str(hvdrun_dir)] + rank_cmd
    else:
        cmd = [mpiexec(), "-n", str(ranks)] + rank_cmd
    proc = run_tagged(cmd, tag, env=rank_env(env), timeout=timeout, cwd=REPO)
    return proc


def report(directory):
    """(summary lines, events) of hvdrun's flight recorder report."""
    with open(os.path.join(directory, "flight-recorder-report.txt")) as f:
        lines = f.read().splitlines()
    return ([ln[2:] for ln in lines if ln.startswith("# ")],
            [json.loads(ln) for ln in lines if ln and not ln.startswith("#")])


def test_getter_size_and_off():
    """In order, with the expected kinds; a size of 8 keeps the last 8 of 100
    allreduces; 0 records nothing (tests/scripts/flight_recorder.py, getter)."""
    proc = run("getter", 2)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and sorted(re.findall(r"CHECKED (\d)", proc.stdout)) == ["0", "1"], out[-4000:]
    assert "flight recorder, rank" not in proc.stderr, "a normal end dumped: " + out[-2000:]


def test_killed_rank_named_by_every_survivor(tmp_path):
    """A rank SIGKILLed while the others wait for it in an allreduce: each
    survivor's dump names it and the tensor it waits in; hvdrun writes one
    report whose summary says the same, and still ends with its usual line."""
    ranks, victim = 3, 2
    proc = run("kill", ranks, hvdrun_dir=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 137, out[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert re.match(r"hvdrun: rank %d on host %s was killed by SIGKILL; hvdrun stopped the 2 other ranks" %
                    (victim, re.escape(HOST)), last), out[-4000:]
    assert "hvdrun: flight recorder report: %s" % os.path.join(str(tmp_path), "flight-recorder-report.txt") in out
    summary, events = report(tmp_path)
    lost = [ln for ln in summary if ln.startswith("lost rank %d," % victim)]
    assert lost and "declared by hvdrun: was killed by SIGKILL" in lost[0], summary
    for r in range(ranks - 1):
        # The survivor itself found the process gone, and says where it waits.
        assert "rank %d: its process" % r in lost[0] and "is gone" in lost[0], summary
        line = next(ln for ln in summary if ln.startswith("rank %d (host" % r))
        assert re.search(r"(waiting in negotiation for|in) allreduce of 'step\.\d+'", line), line
        mine = [e for e in events if e["rank"] == r]
        assert any(e["kind"] == "peer_lost" and e["peer"] == victim for e in mine), mine[-5:]
        assert any(e["kind"] == "dump" and e.get("detail") == "SIGUSR1" for e in mine), mine[-5:]
        # Its own log (stderr, one line) says it as well.
        assert re.search(r"\[%d\]<stderr>: \[hvdlite\] flight recorder, rank %d \(SIGUSR1\): .*allreduce of 'step\.\d+'"
                         r".*lost rank %d: its process \d+ is gone" % (r, r, victim), proc.stderr), out[-4000:]
    walls = [e["wall_ns"] for e in events]
    assert walls == sorted(walls) and {e["rank"] for e in events} == {0, 1}
    assert "@hvdlite-flight@" not in proc.stdout + proc.stderr, "dump lines leaked into the job's output"


def test_sigusr1_dumps_and_the_job_goes_on(tmp_path):
    """SIGUSR1 to a rank blocked on an allreduce its peer has not submitted:
    it dumps, and the job then finishes normally."""
    proc = run("usr1", 2, hvdrun_dir=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and sorted(re.findall(r"DONE (\d)", proc.stdout)) == ["0", "1"], out[-4000:]
    assert re.search(r"\[0\]<stderr>: \[hvdlite\] flight recorder, rank 0 \(SIGUSR1\): "
                     r"waiting in negotiation for allreduce of 'late'", proc.stderr), out[-4000:]
    summary, events = report(tmp_path)
    assert any(ln.startswith("rank 0 (host") and "'late'" in ln for ln in summary), summary
    assert "no rank was declared lost" in summary, summary
    assert [e["name"] for e in events if e["kind"] == "enqueued"][-1] == "late"


def test_report_merges_ranks_by_wall_time(tmp_path):
    """hvdrun's side without ranks: dump lines as the rank wrapper relays them,
    two ranks whose steady clocks differ, merged by wall time."""
    def line(rank, obj):
        return ("[%d]<stderr>: @hvdlite-flight@ " % rank).encode() + json.dumps(obj).encode()

    dumps = FlightDumps()
    assert parse_flight_line(b"[0]<stderr>: ordinary output") is None
    for rank, mono in ((0, 1000), (1, 50000)):     # the same wall time, other steady clocks
        header = {"flight_recorder": "header", "rank": rank, "host": "h", "reason": "SIGUSR1", "events": 2,
                  "mono_ns": mono + 100, "wall_ns": 10 ** 18, "lost": [{"rank": 2, "why": "gone"}],
                  "in": {"phase": "negotiation", "op": "allreduce", "tensor": "x", "tensors": 1},
                  "last_decisions": ["w (cache)"]}
        dumps.add(*parse_flight_line(line(rank, header)))
        assert not dumps.complete([rank])
        for seq, dt in ((1, 10 + rank), (2, 30 - rank)):
            dumps.add(*parse_flight_line(line(rank, {"seq": seq, "t_ns": mono + dt, "kind": "enqueued"})))
    assert dumps.complete([0, 1])
    path, summary = dumps.write(str(tmp_path), declared=[(2, "was killed by SIGKILL")])
    assert summary[0] == "lost rank 2, declared by hvdrun: was killed by SIGKILL; rank 0: gone; rank 1: gone"
    assert summary[1] == "rank 0 (host h, dump: SIGUSR1): waiting in negotiation for allreduce of 'x'; last decided: w (cache)"
    _, events = report(tmp_path)
    assert [(e["rank"], e["seq"]) for e in events] == [(0, 1), (1, 1), (1, 2), (0, 2)]
