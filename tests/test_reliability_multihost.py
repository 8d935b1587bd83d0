"""A rank on another host fails, hangs or stalls while every rank uses hvdlite: the
job ends within 10 s, hvdrun names the rank, and nothing is left on any host.

Uses the two SSH test hosts of tests/harness/hosts.py (root and network
namespaces; see test_launcher_multihost.py, whose helpers these tests share).
"""
import os
import re
import sys

import pytest

from harness.checks import require
# The fixtures (hosts: module-scoped SSH hosts; tag: checks every host for
# leftovers after each test) and helpers of the launcher's multi-host tests.
from test_launcher_multihost import (FAILURE_LIMIT_S, SCRIPTS, hosts, hvdrun,  # noqa: F401
                                     tag, two_by_two)

FAILURE = os.path.join(SCRIPTS, "reliability_failure.py")


def _fail_at(stdout):
    return float(re.search(r"FAIL_AT (\S+)", stdout).group(1))


@pytest.mark.parametrize("mode,code,words", [
    ("sigkill", 137, "was killed by SIGKILL"),
    ("exit", 3, r"failed: called sys.exit\(3\) \(exit code 3\)"),
])
def test_rank_on_remote_host_fails(hosts, tag, mode, code, words):
    require("hvdlite._engine")
    p = hvdrun(hosts, two_by_two(hosts) + [sys.executable, FAILURE, tag, mode, "3"])
    last = p.stderr.strip().splitlines()[-1]
    assert re.match(r"hvdrun: rank 3 on host %s %s; hvdrun stopped the 3 other ranks still running"
                    % (re.escape(hosts.names[1]), words), last), p.stderr[-3000:]
    assert p.returncode == code, p.stderr[-3000:]
    took = p.ended - _fail_at(p.stdout)
    print("\nrank 3 on %s, %s: hvdrun ended %.2f s later" % (hosts.names[1], mode, took))
    assert took < FAILURE_LIMIT_S


def test_hung_rank_on_remote_host_times_out(hosts, tag):
    """SIGSTOP: nothing outside the process can tell a hung rank from a slow
    one; HVDLITE_TIMEOUT_SECONDS makes the others give up and name the cause."""
    require("hvdlite._engine")
    p = hvdrun(hosts, two_by_two(hosts) + [sys.executable, FAILURE, tag, "sigstop", "3"],
               extra_env={"HVDLITE_TIMEOUT_SECONDS": "2"})
    last = p.stderr.strip().splitlines()[-1]
    assert re.match(r"hvdrun: rank [012] on host \S+ failed: (hvdlite\.exceptions\.)?HvdliteTimeoutError: "
                    r".*HVDLITE_TIMEOUT_SECONDS=2 s", last), p.stderr[-3000:]
    assert p.returncode != 0
    took = p.ended - _fail_at(p.stdout)
    print("\nrank 3 stopped: hvdrun ended %.2f s later" % took)
    assert took < FAILURE_LIMIT_S


def test_stall_inspector_across_hosts(hosts, tag):
    """Rank 3, on the other host, skips a tensor: the warning names it, and the
    stall shutdown stops every rank on both hosts."""
    require("hvdlite._engine")
    p = hvdrun(hosts, two_by_two(hosts) + ["--stall-check-warning-time-seconds", "1",
                                           "--stall-check-shutdown-time-seconds", "3",
                                           sys.executable, FAILURE, tag, "stall", "3"])
    assert "WARNING stall inspector: tensor 'stalled'" in p.stderr, p.stderr[-3000:]
    assert "but not by ranks [3]" in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert re.match(r"hvdrun: rank \d on host \S+ failed: (hvdlite\.exceptions\.)?StallError: stall "
                    r"inspector stopped hvdlite .*not by ranks \[3\]", last), p.stderr[-3000:]
    assert p.returncode != 0
    took = p.ended - _fail_at(p.stdout)
    print("\nstall of rank 3: job ended %.2f s after the tensor was skipped" % took)
    assert took < FAILURE_LIMIT_S
