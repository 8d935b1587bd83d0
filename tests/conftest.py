import os
import sys

import pytest

# tests/ on sys.path: the harness package (tests/harness/) and rank-side helpers.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness.ranks import _rank_runs, rank_launch  # noqa: E402,F401  (fixtures)


@pytest.fixture(autouse=True, scope="session")
def _flight_reports(tmp_path_factory):
    """A failed hvdrun job without --output-filename writes its flight recorder
    report in a new /tmp/hvdrun-flight-* folder (for users, by design); the
    failure tests make about 25 such jobs, so their reports go under pytest's
    own temporary folder, which pytest prunes. A value set beforehand wins."""
    if "HVDLITE_FLIGHT_RECORDER_DIR" not in os.environ:
        os.environ["HVDLITE_FLIGHT_RECORDER_DIR"] = str(tmp_path_factory.mktemp("flight-recorder"))


def pytest_terminal_summary(terminalreporter):
    """One line naming the files whose tests were skipped for want of root, and
    the command that runs them (tests/harness/hosts.py: needs_root)."""
    files = []
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else ""
        if reason.startswith("Skipped: needs root"):
            path = report.nodeid.split("::")[0]
            if path not in files:
                files.append(path)
    if files:
        terminalreporter.write_line(
            "%d test file(s) skipped tests that need root (network namespaces, mounts); "
            "to run them, as root: bash scripts/test.sh %s" % (len(files), " ".join(files)))
