"""hvdrun on this machine through the real MPI launcher: output, exit codes, failures,
signals, environment.  Needs MPI (the mpich wheel) but not root."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import uuid

import pytest

from harness.hosts import REPO, hvdrun_argv, tagged_processes, wait_until_gone

SCRIPTS = os.path.join(REPO, "tests", "scripts")
RANK = os.path.join(SCRIPTS, "launcher_rank.py")
MPI4PY = os.path.join(SCRIPTS, "launcher_mpi4py.py")
LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>: (.*)$")


def env(**extra):
    e = dict(os.environ)
    e.update(UCX_TLS="self,sm", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    e.pop("HVDLITE_MPIEXEC", None)
    e.update(extra)
    return e


def hvdrun(args, extra_env=None, timeout=60, **kw):
    argv, extra = hvdrun_argv()
    e = env(**extra)
    e.update(extra_env or {})
    start = time.time()
    p = subprocess.run(argv + args, capture_output=True, text=True, env=e, timeout=timeout,
                       cwd=REPO, **kw)
    p.elapsed = time.time() - start
    return p


def start_hvdrun(args, **extra_env):
    argv, extra = hvdrun_argv()
    e = env(**extra)
    e.update(extra_env)
    return subprocess.Popen(argv + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=e, cwd=REPO)


def rank_lines(text, stream="stdout"):
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        assert m, "unprefixed line %r" % line
        if m.group(2) == stream:
            out.setdefault(int(m.group(1)), []).append(m.group(3))
    return out


@pytest.fixture
def tag():
    """A unique word in every rank's command line, to find leftovers afterwards."""
    t = "hvdltag-" + uuid.uuid4().hex[:10]
    yield t
    left = wait_until_gone(t, timeout=3)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "processes left behind: %s" % left


def wait_for_lines(proc, pattern, count, timeout=60):
    """Read proc's stdout until ``count`` lines match ``pattern``; return the lines read."""
    seen, lines = 0, []
    deadline = time.time() + timeout
    while seen < count:
        assert time.time() < deadline, "timed out waiting for %r: %s" % (pattern, lines)
        line = proc.stdout.readline()
        assert line, "hvdrun ended early: %s %s" % (lines, proc.stderr.read())
        lines.append(line)
        seen += bool(re.search(pattern, line))
    return lines


def test_output_is_prefixed_and_never_mixed_mid_line(tag, tmp_path):
    logs = tmp_path / "logs"
    p = hvdrun(["-np", "4", "--output-filename", str(logs), sys.executable, RANK, tag, "spray", "150"])
    assert p.returncode == 0, p.stderr
    per_rank = rank_lines(p.stdout)
    assert sorted(per_rank) == [0, 1, 2, 3]
    for r, bodies in per_rank.items():
        # Long lines come as several records; joined in order they give back the
        # rank's exact text, and every record holds only this rank's characters.
        joined = "".join(bodies)
        expected = "".join(b.decode() for b in _spray_lines(r, 150))
        assert joined == expected, "rank %d output damaged" % r
        with open(logs / ("rank.%d" % r) / "stdout") as f:
            assert f.read().replace("\n", "") == expected
        with open(logs / ("rank.%d" % r) / "stderr") as f:
            assert f.read() == "stderr line from rank %d\n" % r
    assert rank_lines(p.stderr, "stderr") == {r: ["stderr line from rank %d" % r] for r in range(4)}


def _spray_lines(rank, n):
    """What launcher_rank.py's spray mode prints (same generator, same seed)."""
    import random
    rnd = random.Random(rank)
    lines = []
    for i in range(n):
        body = b"%d:%d:" % (rank, i) + bytes([97 + rank % 26]) * rnd.choice([0, 10, 100, 1000, 3000, 5000, 9000])
        line = body + b"\n"
        pos = 0
        while pos < len(line):      # consume the generator exactly as the script does
            pos += rnd.randint(1, 3000)
        lines.append(body)
    return lines


def test_environment_and_settings_reach_every_rank(tag):
    p = hvdrun(["-np", "2", "--verbose", "--env", "TEST_A=1", "--env", "TEST_B",
                "--fusion-threshold-mb", "8", "--cycle-time-ms", "3", "--no-stall-check",
                "--network-interface", "lo", sys.executable, RANK, tag, "info"],
               extra_env={"TEST_B": "from-hvdrun", "TEST_C": "inherited"})
    assert p.returncode == 0, p.stderr
    infos = [json.loads(v[0]) for v in rank_lines(p.stdout).values()]
    assert sorted(i["rank"] for i in infos) == [0, 1]
    for i in infos:
        assert i["size"] == 2 and i["cwd"] == REPO
        assert {k: i["env"].get(k) for k in ("TEST_A", "TEST_B", "TEST_C", "HVDLITE_FUSION_THRESHOLD",
                                              "HVDLITE_CYCLE_TIME", "HVDLITE_STALL_CHECK_DISABLE",
                                              "UCX_NET_DEVICES", "HVDLITE_RANK_REPORTS")} == \
            {"TEST_A": "1", "TEST_B": "from-hvdrun", "TEST_C": "inherited",
             "HVDLITE_FUSION_THRESHOLD": str(8 << 20), "HVDLITE_CYCLE_TIME": "3.0",
             "HVDLITE_STALL_CHECK_DISABLE": "1", "UCX_NET_DEVICES": "lo",
             "HVDLITE_RANK_REPORTS": "1"}
    running = [l for l in p.stderr.splitlines() if l.startswith("hvdrun: running: ")]
    assert len(running) == 1
    assert "-genv HVDLITE_CYCLE_TIME 3.0" in running[0] and "-iface lo" in running[0]


def test_mpi4py_ranks(tag):
    p = hvdrun(["-np", "2", sys.executable, MPI4PY, tag, "topology", "1"])
    assert p.returncode == 0, p.stderr
    infos = [json.loads(v[0]) for v in rank_lines(p.stdout).values()]
    assert all(i["size"] == 2 and i["local_size"] == 2 and i["cross_size"] == 1 and i["allreduce_ok"]
               for i in infos)


@pytest.mark.parametrize("mode,code,words", [
    ("exit", 3, "exited with code 3"),
    ("kill", 137, "was killed by SIGKILL"),
])
def test_failing_rank_stops_the_job(tag, mode, code, words):
    """hydra alone would wait for the sleeping ranks (120 s); hvdrun stops them."""
    args = ["-np", "3", sys.executable, RANK, tag, mode, "1"] + (["3"] if mode == "exit" else [])
    p = hvdrun(args)
    end = time.time()
    fail_at = float(re.search(r"FAIL_AT (\S+)", p.stdout).group(1))
    assert p.returncode == code, p.stderr
    summary = p.stderr.strip().splitlines()[-1]
    assert re.match(r"hvdrun: rank 1 on host \S+ %s; hvdrun stopped the 2 other ranks still running$"
                    % words, summary), summary
    assert "BAD TERMINATION" not in p.stderr          # hydra's banner about our own stop
    assert end - fail_at < 10, "took %.1f s after the failure" % (end - fail_at)


def test_rank_announcing_failure_while_stuck_in_finalize(tag):
    """A rank that exits after using MPI waits in MPI_Finalize for the others, which
    wait for it: its announcement (hvdlite's exit hook writes one) ends the job."""
    p = hvdrun(["-np", "3", sys.executable, MPI4PY, tag, "failing", "1"])
    end = time.time()
    assert p.returncode == 3, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(
        "hvdrun: rank 1 on host ") and "failed: ValueError: simulated failure" in p.stderr
    fail_at = float(re.search(r"FAIL_AT (\S+)", p.stdout).group(1))
    assert end - fail_at < 10


def test_rank_vanishing_without_finalize_gets_no_launcher_banner(tag):
    """A rank that ends without MPI_Finalize or a report (os._exit: a crash in
    native code looks the same) makes hydra clean up the others and print its
    BAD TERMINATION banner, whose exit string says "Segmentation fault" for any
    code; hvdrun names the rank and its real exit code instead."""
    p = hvdrun(["-np", "3", sys.executable, MPI4PY, tag, "vanish", "1"])
    assert p.returncode == 3, p.stderr
    assert re.match(r"hvdrun: rank 1 on host \S+ exited with code 3; ",
                    p.stderr.strip().splitlines()[-1]), p.stderr
    for words in ("BAD TERMINATION", "Segmentation fault", "EXIT STRING"):
        assert words not in p.stdout + p.stderr, p.stdout + p.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_every_rank(tag, sig):
    proc = start_hvdrun(["-np", "3", sys.executable, RANK, tag, "sleep"])
    try:
        wait_for_lines(proc, r"READY", 3)
        assert len(tagged_processes(tag)) >= 6         # 3 wrappers + 3 ranks
        sent = time.time()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=15)
        took = time.time() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert "hvdrun: job stopped by %s; all ranks were stopped" % sig.name in err
    assert took < 5, "stopping took %.1f s" % took


def test_missing_command(tag):
    p = hvdrun(["-np", "2", "no-such-program-%s" % tag])
    assert p.returncode == 127
    assert "cannot run 'no-such-program-%s'" % tag in p.stderr
    assert re.search(r"hvdrun: rank \d on host \S+ exited with code 127", p.stderr)


def test_launcher_that_never_starts_ranks(tmp_path, tag):
    """--start-timeout: a launcher that hangs (here a fake mpiexec that ignores
    SIGTERM) is reported and killed."""
    bindir = tmp_path / tag                     # the tag is in the fake's command line
    bindir.mkdir()
    fake = bindir / "mpiexec"
    fake.write_text("#!%s\nimport signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    "signal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(120)\n" % sys.executable)
    (bindir / "mpichversion").write_text("#!/bin/sh\necho 'MPICH Version: 0'\n")
    for f in (fake, bindir / "mpichversion"):
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    p = hvdrun(["-np", "2", "--start-timeout", "1", sys.executable, RANK, tag, "sleep"],
               extra_env={"HVDLITE_MPIEXEC": str(fake)})
    assert p.returncode == 1
    assert "2 of 2 ranks did not start within 1 s (--start-timeout): ranks 0, 1" in p.stderr
    assert p.elapsed < 10


@pytest.mark.parametrize("mode", ["plain", "elastic"])
def test_elastic_script_runs_as_a_plain_job_and_under_elastic_hvdrun(tag, mode):
    """The same elastic training script: one plain run, or an elastic job
    (one generation, no host changes) that leaves no commit behind."""
    from harness.checks import require
    require("torch")
    hosts = ["-np", "2"] if mode == "plain" else ["--recovery", "restart", "--min-np", "2", "-H", "localhost:2"]
    p = hvdrun(hosts + [sys.executable, os.path.join(SCRIPTS, "elastic_digits.py"), tag, "torch",
                        "--events", "--epochs", "2"], timeout=120)
    assert p.returncode == 0, p.stderr
    done = [json.loads(line) for lines in rank_lines(p.stdout).values() for line in lines
            if '"ev": "done"' in line]
    assert len(done) == 2 and len({d["params_sha256"] for d in done}) == 1
    assert ("elastic: generation 1 on localhost:2" in p.stderr) == (mode == "elastic")
    assert not [d for d in os.listdir("/dev/shm") if d.startswith("hvdlite-elastic-")]
