"""A pytest plugin that logs each test's start and end and, once a second, the
share of the machine's cores that were idle (/proc/stat), into
$SUITE_PROFILE_DIR (default: the current directory): tests.log and cpu.log.

    PYTHONPATH=bench/results/2026-12-07-suite-time python -m pytest -p suite_profile tests
    python bench/results/2026-12-07-suite-time/suite_profile.py DIR   # the table per file
"""
import collections
import os
import sys
import threading
import time

OUT = os.environ.get("SUITE_PROFILE_DIR", ".")


def _idle_and_total():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)   # idle + iowait, all


def _sample():
    with open(os.path.join(OUT, "cpu.log"), "w", buffering=1) as out:
        idle0, total0 = _idle_and_total()
        while True:
            time.sleep(1)
            idle1, total1 = _idle_and_total()
            out.write("%.2f %.3f\n" % (time.time(), (idle1 - idle0) / max(1, total1 - total0)))
            idle0, total0 = idle1, total1


def pytest_configure(config):
    global _tests
    _tests = open(os.path.join(OUT, "tests.log"), "w", buffering=1)
    threading.Thread(target=_sample, daemon=True).start()


def pytest_runtest_logstart(nodeid, location):
    _tests.write("S %.2f %s\n" % (time.time(), nodeid))


def pytest_runtest_logfinish(nodeid, location):
    _tests.write("E %.2f %s\n" % (time.time(), nodeid))


def table(directory):
    """Per test file: seconds, and the mean share of the cores busy while it ran."""
    samples = [tuple(map(float, line.split())) for line in open(os.path.join(directory, "cpu.log"))]
    start, rows = {}, collections.defaultdict(lambda: [0.0, []])
    for line in open(os.path.join(directory, "tests.log")):
        kind, t, node = line.split(" ", 2)
        node = node.strip()
        if kind == "S":
            start[node] = float(t)
            continue
        began = start.pop(node)
        row = rows[node.split("::")[0]]
        row[0] += float(t) - began
        row[1] += [1 - idle for when, idle in samples if began < when <= float(t)]
    busy = 1 - sum(idle for _, idle in samples) / len(samples)
    print("%.0f s, cores %.0f %% busy" % (samples[-1][0] - samples[0][0], 100 * busy))
    print("| file | seconds | cores busy |\n| --- | ---: | ---: |")
    for name, (seconds, used) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        if seconds >= 10:
            print("| %s | %.0f | %.0f %% |" % (name, seconds, 100 * sum(used) / max(1, len(used))))


if __name__ == "__main__":
    table(sys.argv[1] if len(sys.argv) > 1 else ".")
