"""hvdrun across real SSH hosts: two network-namespace hosts with their own hostnames
and sshd (tests/harness/hosts.py), hvdrun started "on" the first one.

Needs root and network namespaces.  Without them the tests skip, unless
HVDLITE_TEST_REQUIRE_ALL=1 (CI), where they fail; a missing tool (sshd, ip, ...)
always fails, with the command that installs it.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from harness.checks import require
from harness.hosts import REPO, hosts_fixture, hvdrun_env, wait_until_gone

SCRIPTS = os.path.join(REPO, "tests", "scripts")
RANK = os.path.join(SCRIPTS, "launcher_rank.py")
MPI4PY = os.path.join(SCRIPTS, "launcher_mpi4py.py")
HVDLITE = os.path.join(SCRIPTS, "launcher_hvdlite.py")
LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>: (.*)$")
# hvdrun's own budget is ~5 s (3 s connect timeout + start-up); the bound
# leaves room for a loaded CI machine, where Python start-up alone can take
# seconds. The measured times are printed with -s.
SSH_CHECK_LIMIT_S = 8.0
FAILURE_LIMIT_S = 10.0


hosts = hosts_fixture(2)


@pytest.fixture
def tag(hosts):
    t = "hvdltag-" + uuid.uuid4().hex[:10]
    yield t
    assert_nothing_left(hosts, t)


def assert_nothing_left(hosts, tag):
    """No rank, wrapper, MPI proxy or SSH session may survive a job, on any host."""
    left = wait_until_gone(tag, timeout=3)
    deadline = time.time() + 3
    per_host = {}
    while time.time() < deadline:
        per_host = {k: _describe(hosts.pids(k)) for k in (1, 2)}
        if not any(per_host.values()):
            break
        time.sleep(0.05)
    for pid in list(left) + [p for k in (1, 2) for p in hosts.pids(k)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left and not any(per_host.values()), \
        "left behind: %s; per host: %s" % (left, per_host)


def _describe(pids):
    out = []
    for pid in pids:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                out.append("%d %s" % (pid, f.read().replace(b"\0", b" ").decode(errors="replace")))
        except OSError:
            pass
    return out


def hvdrun(hosts, args, key=None, timeout=120, extra_env=None):
    """Run hvdrun on host 1; return CompletedProcess with .elapsed and .ended (time)."""
    argv, env = hvdrun_env(hosts, extra_env)
    full = hosts.on_host(1, argv + ["-i", key or hosts.key] + args, cwd=REPO)
    start = time.time()
    p = subprocess.run(full, capture_output=True, text=True, env=env, timeout=timeout)
    p.ended = time.time()
    p.elapsed = p.ended - start
    return p


def two_by_two(hosts):
    return ["-H", "%s:2,%s:2" % tuple(hosts.names)]


def json_lines(stdout):
    out = {}
    for line in stdout.splitlines():
        m = LINE.match(line)
        assert m, "unprefixed line %r" % line
        if m.group(2) == "stdout" and m.group(3).startswith("{"):
            out[int(m.group(1))] = json.loads(m.group(3))
    return out


# ---- jobs that work ------------------------------------------------------------------

def test_mpi_across_hosts_topology_and_traffic(hosts, tag, tmp_path):
    before = sum(hosts.link_bytes(2))
    logs = tmp_path / "logs"
    p = hvdrun(hosts, two_by_two(hosts) + ["--verbose", "--output-filename", str(logs),
                                           "--network-interface", "eth0", "-p", "22",
                                           sys.executable, MPI4PY, tag, "topology", "16"])
    assert p.returncode == 0, p.stderr
    moved = sum(hosts.link_bytes(2)) - before
    ranks = json_lines(p.stdout)
    n1, n2 = hosts.names
    assert {r: (i["host"], i["local_rank"], i["local_size"], i["cross_rank"], i["cross_size"])
            for r, i in ranks.items()} == {0: (n1, 0, 2, 0, 2), 1: (n1, 1, 2, 0, 2),
                                           2: (n2, 0, 2, 1, 2), 3: (n2, 1, 2, 1, 2)}
    assert all(i["allreduce_ok"] and i["size"] == 4 for i in ranks.values())
    # A 16 MB allreduce between the hosts moves at least that much over host 2's link.
    assert moved > 16 * 1024 * 1024, "only %d bytes crossed the test network" % moved
    cmd = [l for l in p.stderr.splitlines() if l.startswith("hvdrun: running: ")][0]
    assert "-hosts %s:2,%s:2 -launcher ssh -launcher-exec " % (n1, n2) in cmd
    assert "-iface eth0 " in cmd and "-genv UCX_NET_DEVICES eth0 " in cmd
    assert "ssh check %s: ok" % n2 in p.stderr and "ssh check %s: local" % n1 in p.stderr
    for r in range(4):
        assert json.loads((logs / ("rank.%d" % r) / "stdout").read_text())["rank"] == r


def test_hostfile_and_output_across_hosts(hosts, tag, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("%s slots=2\n%s:2\n" % tuple(hosts.names))
    p = hvdrun(hosts, ["--hostfile", str(hostfile), "-np", "3", sys.executable, RANK, tag,
                       "spray", "60"])
    assert p.returncode == 0, p.stderr
    per_rank = {}
    for line in p.stdout.splitlines():
        m = LINE.match(line)
        assert m, "unprefixed or mixed line %r" % line[:200]
        body = m.group(3)
        assert set(body.split(":")[-1]) <= {chr(97 + int(m.group(1)))}, "mixed line %r" % line[:200]
        per_rank[int(m.group(1))] = per_rank.get(int(m.group(1)), 0) + 1
    assert sorted(per_rank) == [0, 1, 2]


def test_hvdlite_numpy_allreduce_across_hosts(hosts, tag):
    require("hvdlite._engine")
    p = hvdrun(hosts, two_by_two(hosts) + [sys.executable, HVDLITE, tag, "numpy"])
    assert p.returncode == 0, p.stdout + p.stderr
    ranks = json_lines(p.stdout)
    n1, n2 = hosts.names
    assert {r: (i["host"], i["local_rank"], i["local_size"], i["cross_rank"], i["cross_size"])
            for r, i in ranks.items()} == {0: (n1, 0, 2, 0, 2), 1: (n1, 1, 2, 0, 2),
                                           2: (n2, 0, 2, 1, 2), 3: (n2, 1, 2, 1, 2)}
    assert all(i["sum_ok"] and i["avg_ok"] and i["size"] == 4 for i in ranks.values()), ranks


@pytest.mark.parametrize("how,words", [
    (["--network-interface", "eth0"], None),
    (["--env", "HVDLITE_SOCKET_IFNAME=nosuch0"],
     "HVDLITE_SOCKET_IFNAME=nosuch0: no interface of these names is up with an IPv4 address (up here: "),
    (["--env", "HVDLITE_SOCKET_IFNAME=lo"], "could not connect to 127.0.0.1:"),
], ids=["hvdrun-network-interface", "no-such-interface", "unreachable-interface"])
def test_ring_sockets_take_the_named_interface(hosts, tag, how, words):
    """One rank per host: the ring's sockets offer the addresses of the
    interfaces named (hvdrun --network-interface sets HVDLITE_SOCKET_IFNAME);
    where none works, rank 0 says why and the ring runs over MPI, with the
    same sums."""
    require("hvdlite._engine")
    p = hvdrun(hosts, ["-H", "%s:1,%s:1" % tuple(hosts.names)] + how + [sys.executable, HVDLITE, tag, "numpy"])
    assert p.returncode == 0, p.stdout + p.stderr
    ranks = json_lines(p.stdout)
    assert sorted(ranks) == [0, 1]
    assert all(i["sum_ok"] and i["avg_ok"] and i["ring"] == 2 for i in ranks.values()), ranks
    assert {i["socket_ifname"] for i in ranks.values()} == {how[-1].split("=")[-1]}
    fallback = [l for l in p.stderr.splitlines() if "the ring runs over MPI instead" in l]
    if words is None:
        assert all(i["socket_ring"] == 2 for i in ranks.values()), ranks
        assert not fallback, p.stderr
    else:
        assert all(i["socket_ring"] == 0 for i in ranks.values()), ranks
        assert len(fallback) == 1 and words in fallback[0], p.stderr


def test_torch_distributed_optimizer_across_hosts(hosts, tag):
    require("torch")
    require("hvdlite.torch")
    p = hvdrun(hosts, two_by_two(hosts) + [sys.executable, HVDLITE, tag, "torch"],
               extra_env={"TORCH_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout + p.stderr
    ranks = json_lines(p.stdout)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert {i["host"] for i in ranks.values()} == set(hosts.names)
    assert all(i["max_diff"] < 1e-5 for i in ranks.values()), ranks


# ---- hosts that cannot be used: clear message, fast, nothing started --------------------

def _sshd_stopped(hosts):
    hosts.stop_sshd(2)
    return lambda: hosts.start_sshd(2)


def _link_down(hosts):
    hosts.set_link(2, False)
    return lambda: hosts.set_link(2, True)


def _silent(hosts):
    hosts.set_silent(2, True)
    return lambda: hosts.set_silent(2, False)


@pytest.mark.parametrize("breakage,words", [
    (_sshd_stopped, "connection refused"),
    (_link_down, ("no route to host", "timed out")),
    (_silent, "timed out"),
])
def test_unreachable_host(hosts, tag, breakage, words):
    restore = breakage(hosts)
    try:
        p = hvdrun(hosts, two_by_two(hosts) + [sys.executable, RANK, tag, "info"])
    finally:
        restore()
    _assert_bad_host(p, hosts.names[1], words)


def test_unknown_host_name(hosts, tag):
    p = hvdrun(hosts, ["-H", "%s:2,no-such-host:2" % hosts.names[0], sys.executable, RANK, tag, "info"])
    _assert_bad_host(p, "no-such-host", "unknown host name")


def test_wrong_key(hosts, tag):
    p = hvdrun(hosts, two_by_two(hosts) + [sys.executable, RANK, tag, "info"], key=hosts.wrong_key)
    _assert_bad_host(p, hosts.names[1], "permission denied")


def _assert_bad_host(p, host, words):
    words = (words,) if isinstance(words, str) else words
    lines = p.stderr.strip().splitlines()
    bad = [l for l in lines if l.startswith("hvdrun: cannot use host ")]
    assert len(bad) == 1 and bad[0].startswith("hvdrun: cannot use host %s: " % host), p.stderr
    assert any(w in bad[0] for w in words), bad[0]
    assert lines[-1].startswith("hvdrun: 1 of 2 hosts failed the SSH check in "), p.stderr
    assert p.returncode == 1 and p.stdout == ""
    print("\n%s: %.2f s: %s" % (host, p.elapsed, bad[0]))
    assert p.elapsed <= SSH_CHECK_LIMIT_S, "took %.2f s" % p.elapsed


# ---- ranks that fail, and stopping the job ---------------------------------------------

@pytest.mark.parametrize("mode,code,words", [
    ("exit", 4, "exited with code 4"),
    ("kill", 137, "was killed by SIGKILL"),
])
def test_failing_rank_on_remote_host(hosts, tag, mode, code, words):
    args = [sys.executable, RANK, tag, mode, "3"] + (["4"] if mode == "exit" else [])
    p = hvdrun(hosts, two_by_two(hosts) + args)
    assert p.returncode == code, p.stderr
    assert p.stderr.strip().splitlines()[-1] == \
        "hvdrun: rank 3 on host %s %s; hvdrun stopped the 3 other ranks still running" \
        % (hosts.names[1], words)
    took = p.ended - float(re.search(r"FAIL_AT (\S+)", p.stdout).group(1))
    print("\nrank 3 %s: hvdrun ended %.2f s after the failure" % (mode, took))
    assert took < FAILURE_LIMIT_S


def test_rank_stuck_in_finalize_on_remote_host(hosts, tag):
    p = hvdrun(hosts, two_by_two(hosts) + [sys.executable, MPI4PY, tag, "failing", "2"])
    assert p.returncode == 3, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(
        "hvdrun: rank 2 on host %s failed: ValueError: simulated failure" % hosts.names[1])
    assert p.ended - float(re.search(r"FAIL_AT (\S+)", p.stdout).group(1)) < FAILURE_LIMIT_S


def test_hvdlite_rank_raising_on_remote_host(hosts, tag):
    """The realistic failure: an exception in one rank's training loop.  The engine
    tells the other ranks, they fail too, and the job ends naming a failed rank."""
    require("hvdlite._engine")
    p = hvdrun(hosts, two_by_two(hosts) + [sys.executable, HVDLITE, tag, "raise", "3"])
    assert p.returncode != 0
    assert "[3]<stderr>: ValueError: simulated failure in rank 3" in p.stderr
    assert re.match(r"hvdrun: rank \d on host \S+ (exited with code|failed: )",
                    p.stderr.strip().splitlines()[-1]), p.stderr[-3000:]
    took = p.ended - float(re.search(r"FAIL_AT (\S+)", p.stdout).group(1))
    print("\nhvdlite rank 3 raised: hvdrun ended %.2f s later" % took)
    assert took < FAILURE_LIMIT_S


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_stopping_hvdrun_stops_every_rank_on_every_host(hosts, tag, sig):
    """Ctrl-C stops the job through MPI's launcher; even SIGKILL of hvdrun itself
    leaves nothing behind (the launcher dies with hvdrun, its remote proxies lose
    their connection and kill their ranks).  ``tag`` checks every host afterwards."""
    argv, env = hvdrun_env(hosts)
    proc = subprocess.Popen(hosts.on_host(1, argv + ["-i", hosts.key] + two_by_two(hosts) +
                                          [sys.executable, RANK, tag, "sleep"], cwd=REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        ready = 0
        deadline = time.time() + 60
        while ready < 4:
            line = proc.stdout.readline()
            assert line and time.time() < deadline, "ranks did not start: %s" % proc.stderr.read()
            ready += "READY" in line
        assert hosts.pids(2), "nothing runs on host 2"
        sent = time.time()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
        took = time.time() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        return
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "hvdrun: job stopped by SIGINT; all ranks were stopped"
    print("\nCtrl-C: hvdrun ended %.2f s after SIGINT" % took)
    assert took < 5


def test_hvdlite_started_by_mpiexec_without_hvdrun(hosts, tag, tmp_path):
    """Scripts started by mpiexec itself get the same ranks (hvdlite does not
    depend on anything hvdrun sets)."""
    require("hvdlite._engine")
    from hvdlite import _build_info
    ssh = tmp_path / "ssh"
    ssh.write_text('#!/bin/sh\nexec %s/ssh -i %s "$@"\n' % (hosts.bin_dir, hosts.key))
    ssh.chmod(0o755)
    _, env = hvdrun_env(hosts)
    # Without hvdrun's wrapper nothing keeps lines whole: with unbuffered output
    # print() writes text and newline separately and ranks' lines mix.  Buffered,
    # each rank's single short line leaves in one write at exit.
    env.pop("PYTHONUNBUFFERED")
    cmd = [_build_info.MPIEXEC, "-n", "4", "-hosts", "%s:2,%s:2" % tuple(hosts.names),
           "-launcher", "ssh", "-launcher-exec", str(ssh), sys.executable, HVDLITE, tag, "numpy"]
    p = subprocess.run(hosts.on_host(1, cmd, cwd=REPO), capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    ranks = {i["rank"]: i for i in map(json.loads, p.stdout.split("\n")[:-1])}
    n1, n2 = hosts.names
    assert {r: (i["host"], i["local_rank"], i["cross_rank"]) for r, i in ranks.items()} == \
        {0: (n1, 0, 0), 1: (n1, 1, 0), 2: (n2, 0, 1), 3: (n2, 1, 1)}
    assert all(i["sum_ok"] and i["avg_ok"] for i in ranks.values())
