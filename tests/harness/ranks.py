"""Runs tests on several real ranks through the installed mpiexec.

Rank-side test modules (tests/scripts/engine_collectives.py and others) are
pytest modules that every rank runs under ``mpiexec -n N python -m pytest``
(tests/harness/rank_plugin.py: fixtures, reports, ranks kept in step); each
of their cases is also one case of the outer pytest run, which launches the
ranks once per (module, ranks, environment)::

    COLLECTIVES = RankTests("scripts/engine_collectives.py")

    @pytest.mark.parametrize("case", COLLECTIVES.cases)
    def test_collectives(case, rank_launch):
        rank_launch(COLLECTIVES, 2).check(case)

The first case to run launches the ranks with every case of that outer test
that this session selected (so ``-k``, ``--lf`` or a single node id launch
only those); the others read the ranks' reports. ``check(case)`` fails with
each failing rank's text, or, for a rank that died or hung, with what it was
doing and the tail of the job's output; a case that a rank skipped is skipped
(failed under HVDLITE_TEST_REQUIRE_ALL=1, like any skip: checks.unavailable).
``RankTests.cases`` ends with ``JOB_EXIT``, whose check is the job's exit
status.

``run_ranks(script, np_)`` runs a plain script that prints ``RANK <r> OK``.
"""
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from harness import rank_plugin
from harness.checks import unavailable

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
JOB_EXIT = "job_exit"
# What a rank raises when a peer's failed case shut hvdlite down (rank_plugin).
PEER_STOPPED = "HvdliteShutdownError: hvdlite has shut down: rank"
TAIL = 6000  # characters of the job's output shown with a failure
PYTEST_FRAME = re.compile(r'File "(.*/(_pytest|pluggy|pytest)/|<frozen runpy>)')


def mpiexec():
    try:
        from hvdlite import _build_info
        if os.path.exists(_build_info.MPIEXEC):
            return _build_info.MPIEXEC
    except ImportError:
        pass
    found = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return found if os.path.exists(found) else shutil.which("mpiexec")


def rank_env(extra=None):
    env = dict(os.environ)
    env.update({
        # Keep MPI on shared memory and off the network; one compute thread
        # per rank so ranks do not fight over the two cores.
        "UCX_TLS": "self,sm",
        "OMPI_MCA_btl": "self,vader,sm",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "KERAS_HOME": os.path.join(TESTS, ".keras-home"),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([TESTS, env.get("PYTHONPATH", "")]),
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    })
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def _mpiexec_or_fail():
    exe = mpiexec()
    if not exe:
        pytest.fail("no mpiexec found: install the mpich wheel (pip install mpich)")
    return exe


def run_ranks(script, np_, args=(), env=None, timeout=300, expect_ok=True):
    """Launches ``script`` (relative to tests/) on ``np_`` ranks; returns the
    CompletedProcess. With expect_ok, asserts exit 0 and one OK line per rank."""
    cmd = [_mpiexec_or_fail(), "-n", str(np_), sys.executable, os.path.join(TESTS, script),
           *map(str, args)]
    proc = subprocess.run(cmd, env=rank_env(env), capture_output=True, text=True, timeout=timeout)
    if expect_ok:
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{script} on {np_} ranks failed (exit {proc.returncode}):\n{out[-8000:]}"
        for r in range(np_):
            assert f"RANK {r} OK" in proc.stdout, f"rank {r} did not finish {script}:\n{out[-8000:]}"
    return proc


# ---------------------------------------------------------------- rank-side test modules

def _pytest_argv(*args):
    # Short tracebacks: several ranks' texts are shown together.
    return [sys.executable, "-m", "pytest", "-q", "--tb=short", "-p", "no:cacheprovider",
            "-o", "addopts=", "--rootdir", ROOT, *args]


class RankTests:
    """A rank-side test module. ``cases``: its case names, then JOB_EXIT.

    The names are read from the module's source when its cases are plain
    top-level test functions (no decorators): importing TensorFlow to collect
    them would cost seconds per module each time the outer module is imported.
    Otherwise pytest collects them, in a subprocess without MPI. A module
    read from its source must not skip itself on import (the outer test
    requires what it needs), or its cases fail as never run."""

    def __init__(self, script):
        self.script = script
        self.path = os.path.join(TESTS, script)
        self.cases = (self._read_source() or self._collect()) + [JOB_EXIT]

    def _read_source(self):
        """The top-level test functions in source order, or None where only
        pytest can tell: decorated ones (parametrize), test classes, test
        functions defined or imported elsewhere than at the top level."""
        with open(self.path) as f:
            tree = ast.parse(f.read(), self.path)
        top = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test")]
        anywhere = [node for node in ast.walk(tree)
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")]
        imported = [alias for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names if (alias.asname or alias.name).startswith("test")]
        classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name.startswith("Test")]
        if len(top) != len(anywhere) or imported or classes or any(node.decorator_list for node in top):
            return None
        return [node.name for node in top]

    def _collect(self):
        proc = subprocess.run(_pytest_argv("--collect-only", self.path), env=rank_env(),
                              capture_output=True, text=True, timeout=300, cwd=TESTS)
        names = [line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line]
        if proc.returncode == 5 or (proc.returncode == 0 and names):
            return names  # 5: nothing collected (the module skipped itself)
        raise RuntimeError(f"collecting the cases of {self.script} failed (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-TAIL:]}")


class RankRun:
    """One launch: every rank's report of every case it ran."""

    def __init__(self, tests, ranks, cases, returncode, output, timed_out, reports):
        self.tests, self.ranks, self.cases = tests, ranks, cases
        self.returncode, self.output, self.timed_out = returncode, output, timed_out
        self.reports = reports  # rank -> list of records

    def _results(self, r):
        return {rec["case"]: rec for rec in self.reports[r] if rec["event"] == "result"}

    def _ended(self):
        if self.timed_out:
            return f"the launch was stopped after {self.timed_out} s (every rank's stack is in the output)"
        return f"the job ended with exit code {self.returncode}"

    def _missing(self, r, case):
        started = [rec["case"] for rec in self.reports[r] if rec["event"] == "start"]
        if not self.reports[r]:
            return f"rank {r} never reported (it did not start pytest); {self._ended()}"
        if case in started:
            return f"rank {r} started {case} and never finished it; {self._ended()}"
        last = started[-1] if started else "none"
        return f"rank {r} did not get to {case} (last case started: {last}); {self._ended()}"

    def _tail(self):
        # Stack dumps without pytest's own frames, which every case shares.
        lines = [line for line in self.output.splitlines() if not PYTEST_FRAME.search(line)]
        return f"\n----- tail of the job's output ({self.tests.script} on {self.ranks} ranks)\n" \
               + "\n".join(lines)[-TAIL:]

    def check(self, case):
        """Passes when ``case`` passed on every rank; returns {rank: report}."""
        if case == JOB_EXIT:
            return self._check_exit()
        failures, skips, reports, abnormal = [], [], {}, False
        for r in range(self.ranks):
            rec = self._results(r).get(case)
            if rec is None:
                failures.append(self._missing(r, case))
                abnormal = True
            elif rec["outcome"] == "failed":
                failures.append(f"===== rank {r}: {case} failed\n{rec['text']}")
            elif rec["outcome"] == "skipped":
                skips.append(f"rank {r}: {rec['text'].strip()}")
            reports[r] = rec
        if failures:
            failures.sort(key=lambda text: PEER_STOPPED in text)  # the first cause first
            pytest.fail("\n".join(failures) + (self._tail() if abnormal else ""), pytrace=False)
        if skips:
            # A case some rank skipped fails in CI like a skip of the outer case.
            unavailable("; ".join(skips))
        return reports

    def _check_exit(self):
        """The job ended by itself, every rank reported every case it was given,
        and the exit code is the one pytest gave (1 when a case failed, which
        that case reports): nothing failed outside the cases (at exit, say)."""
        problems = []
        for r in range(self.ranks):
            ends = [rec for rec in self.reports[r] if rec["event"] == "end"]
            missing = [c for c in self.cases if c not in self._results(r)]
            if missing:
                problems.append(f"rank {r} has no result for {', '.join(missing)}")
            elif not ends:
                problems.append(f"rank {r} did not finish its pytest session")
        if not problems:
            codes = [rec["exitstatus"] for r in range(self.ranks) for rec in self.reports[r]
                     if rec["event"] == "end"]
            if self.returncode != max(codes):
                problems.append(f"every rank's pytest ended with {max(codes)} but the job exited "
                                f"with {self.returncode}")
        if problems or self.timed_out:
            pytest.fail("; ".join(problems) + f"; {self._ended()}" + self._tail(), pytrace=False)


def _read_reports(directory, ranks):
    reports = {}
    for r in range(ranks):
        path = os.path.join(directory, f"rank{r}.jsonl")
        records = []
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        records.append(json.loads(line))
                    except ValueError:
                        pass  # a line cut short by a killed rank
        reports[r] = records
    return reports


def _stop_hung_job(proc, directory, ranks):
    """Dumps every rank's stacks (SIGUSR1, see rank_plugin), then kills the job."""
    pids = [rec["pid"] for recs in _read_reports(directory, ranks).values()
            for rec in recs if rec["event"] == "hello"]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(2)
    for kill in [lambda: os.killpg(proc.pid, signal.SIGKILL)] + [
            (lambda p=p: os.kill(p, signal.SIGKILL)) for p in pids]:
        try:
            kill()
        except ProcessLookupError:
            pass


def launch(tests, ranks, cases, env=None, timeout=600, case_timeout=300, launcher=None):
    """Runs ``cases`` of ``tests`` on ``ranks`` ranks; returns a RankRun.
    ``launcher(ranks, argv) -> (command, environment)`` starts the ranks some
    other way than mpiexec on this host (hvdrun across test hosts); the
    environment it gets is the ranks' (rank_env with ``env``)."""
    directory = tempfile.mkdtemp(prefix="hvdlite-ranks-")
    try:
        selected = [c for c in tests.cases if c != JOB_EXIT]
        targets = [tests.path] if cases == selected else [f"{tests.path}::{c}" for c in cases]
        extra = dict(env or {}, **{rank_plugin.REPORT_DIR_VAR: directory,
                                   rank_plugin.CASE_TIMEOUT_VAR: case_timeout})
        cmd, job_env = [_mpiexec_or_fail(), "-n", str(ranks), *_pytest_argv(*targets)], rank_env(extra)
        if launcher is not None:
            cmd, job_env = launcher(ranks, _pytest_argv(*targets), job_env)
        proc = subprocess.Popen(cmd, env=job_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=TESTS,
                                start_new_session=True)
        timed_out = None
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = timeout
            _stop_hung_job(proc, directory, ranks)
            output, _ = proc.communicate()
        return RankRun(tests, ranks, cases, proc.returncode, output, timed_out,
                       _read_reports(directory, ranks))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def selected_cases(item, tests):
    """The cases of ``tests`` that this session runs through the outer test
    function of ``item`` with the same other parameters."""
    def others(it):
        params = dict(getattr(it, "callspec", None).params) if hasattr(it, "callspec") else {}
        params.pop("case", None)
        return params
    mine = others(item)
    wanted = {it.callspec.params["case"] for it in item.session.items
              if getattr(it, "function", None) is item.function and hasattr(it, "callspec")
              and "case" in it.callspec.params and others(it) == mine}
    return [c for c in tests.cases if c in wanted and c != JOB_EXIT] or \
        [c for c in tests.cases if c != JOB_EXIT]


@pytest.fixture(scope="session")
def _rank_runs():
    return {}


@pytest.fixture
def rank_launch(request, _rank_runs):
    """``rank_launch(tests, ranks, env=None, timeout=600, cases=None)``: the
    RankRun of this configuration, launched on first use. ``cases`` defaults
    to the ones this session selects through the calling test function."""
    def get(tests, ranks, env=None, timeout=600, cases=None, case_timeout=300, launcher=None):
        cases = list(cases) if cases is not None else selected_cases(request.node, tests)
        key = (tests.path, ranks, tuple(sorted((env or {}).items())), tuple(cases), launcher)
        if key not in _rank_runs:
            _rank_runs[key] = launch(tests, ranks, cases, env, timeout, case_timeout, launcher)
        return _rank_runs[key]
    return get
