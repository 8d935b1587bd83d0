"""What every rank loads when it runs a rank-side test module: tests/scripts/
conftest.py takes its fixtures and hooks, so from the repository root

    mpiexec -n 2 python -m pytest tests/scripts/engine_collectives.py

runs that module's cases on 2 ranks (the outer side, which reports each case
as a case of the suite, is harness.ranks.RankTests).

The cases get the fixtures ``rank`` and ``size`` (hvdlite initialised). Under
a launcher, each rank also writes one JSON line per case to
``$HVDLITE_RANK_REPORT/rank<r>.jsonl`` when that is set (a "start" line
before the case, its outcome and text after, so a rank that dies still shows
which case it was in), prints ``RANK <r> OK`` when every case passed, and
keeps the ranks in step:

- After each case the ranks agree (an MPI allreduce on COMM_WORLD) whether
  it failed anywhere. A rank whose case failed first shuts hvdlite down, so
  ranks still waiting in a collective for it raise instead of hanging; then,
  if any rank failed, every rank shuts hvdlite down and the next case starts
  with a fresh engine (``rank``/``size`` initialise it again).
- A case that runs longer than $HVDLITE_TEST_CASE_TIMEOUT seconds (default
  300) dumps every thread's stack and ends the rank, which ends the job; a
  SIGUSR1 dumps the stacks without ending it (the outer side sends one when
  its own time limit is reached).
"""
import faulthandler
import json
import os
import signal
import sys
import time

import pytest

REPORT_DIR_VAR = "HVDLITE_RANK_REPORT"
CASE_TIMEOUT_VAR = "HVDLITE_TEST_CASE_TIMEOUT"
LAUNCHER_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
TEXT_LIMIT = 20000  # characters of failure text and output kept per case


def world_rank():
    """This process's rank, from the launcher's variables (MPI may not be started yet)."""
    for var in LAUNCHER_RANK_VARS:
        if var in os.environ:
            return int(os.environ[var])
    return 0


def case_name(item):
    return item.nodeid.split("::", 1)[1]


def _hvdlite():
    """hvdlite, if the module under test imported it (this plugin never does)."""
    return sys.modules.get("hvdlite")


def _mpi():
    """mpi4py's MPI when MPI is running, else None. Imported only after the
    module under test, which may have set mpi4py.rc.initialize = False."""
    if "mpi4py" not in sys.modules:
        return None
    from mpi4py import MPI
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return None
    return MPI


@pytest.fixture
def rank():
    """This rank; hvdlite is initialised."""
    import hvdlite
    hvdlite.init()
    return hvdlite.rank()


@pytest.fixture
def size(rank):
    """The number of ranks; hvdlite is initialised."""
    import hvdlite
    return hvdlite.size()


class RankReporter:
    def __init__(self):
        self.rank = world_rank()
        directory = os.environ.get(REPORT_DIR_VAR)
        self.out = open(os.path.join(directory, f"rank{self.rank}.jsonl"), "a") if directory else None
        self.case_timeout = float(os.environ.get(CASE_TIMEOUT_VAR, "300"))
        # pytest captures fd 2 during a case; stack dumps go to the real stderr.
        self.stderr = os.fdopen(os.dup(2), "w")
        faulthandler.register(signal.SIGUSR1, file=self.stderr, all_threads=True)
        self.phases = []
        self.write(event="hello", pid=os.getpid())

    def write(self, **record):
        if self.out:
            self.out.write(json.dumps(record) + "\n")
            self.out.flush()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        name = case_name(item)
        self.phases = []
        self.write(event="start", case=name)
        faulthandler.dump_traceback_later(self.case_timeout, exit=True, file=self.stderr)
        start = time.monotonic()
        yield
        failed = any(p.failed for p in self.phases)
        skipped = not failed and any(p.skipped for p in self.phases)
        self.write(event="result", case=name,
                   outcome="failed" if failed else "skipped" if skipped else "passed",
                   text=self._text(failed, skipped), stdout=self._stdout(),
                   seconds=round(time.monotonic() - start, 3))
        self._agree(failed)
        faulthandler.cancel_dump_traceback_later()

    def pytest_runtest_logreport(self, report):
        self.phases.append(report)

    def _text(self, failed, skipped):
        parts = []
        for p in self.phases:
            if p.failed or (skipped and p.skipped):
                text = p.longreprtext
                if skipped and isinstance(p.longrepr, tuple):
                    text = p.longrepr[2]  # (file, line, reason): the reason
                parts.append(f"[{p.when}] {text}")
                for title, content in p.sections:
                    parts.append(f"----- {title}\n{content}")
        return "\n".join(parts)[-TEXT_LIMIT:]

    def _stdout(self):
        return "".join(p.capstdout for p in self.phases)[-TEXT_LIMIT:]

    def _agree(self, failed):
        hvd = _hvdlite()
        if failed and hvd is not None:
            hvd.shutdown()  # peers waiting for this rank in a collective raise now
        MPI = _mpi()
        anywhere = failed if MPI is None else MPI.COMM_WORLD.allreduce(int(failed), op=MPI.MAX)
        if anywhere and hvd is not None:
            hvd.shutdown()

    def pytest_sessionfinish(self, session, exitstatus):
        self.write(event="end", exitstatus=int(exitstatus))
        if exitstatus == 0:
            print(f"\nRANK {self.rank} OK", flush=True)


def pytest_configure(config):
    # Only on ranks: this conftest is also imported by the outer run, which
    # collects tests/ (and must not get a watchdog that ends it).
    if REPORT_DIR_VAR in os.environ or any(v in os.environ for v in LAUNCHER_RANK_VARS):
        config.pluginmanager.register(RankReporter(), "hvdlite_rank_reporter")

