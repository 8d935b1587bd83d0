"""Runs test scripts on several real ranks through the installed mpiexec.

A pytest test calls ``run_ranks("scripts/engine_collectives.py", 2)``; the
script asserts on every rank and prints ``RANK <r> OK`` at the end. Many
checks go into one launch because starting ranks costs about a second.
"""
import os
import shutil
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
REQUIRE_ALL = os.environ.get("HVDLITE_TEST_REQUIRE_ALL") == "1"


def require(module_name):
    """Imports an optional dependency; in CI (HVDLITE_TEST_REQUIRE_ALL=1) a
    missing one fails the test instead of skipping it."""
    try:
        return __import__(module_name)
    except ImportError as e:
        if REQUIRE_ALL:
            pytest.fail(f"{module_name} is required in CI but cannot be imported: {e}")
        pytest.skip(f"{module_name} not installed")


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


def run_ranks(script, np_, args=(), env=None, timeout=300, expect_ok=True):
    """Launches ``script`` (relative to tests/) on ``np_`` ranks; returns the
    CompletedProcess. With expect_ok, asserts exit 0 and one OK line per rank."""
    exe = mpiexec()
    if not exe:
        pytest.fail("no mpiexec found: install the mpich wheel (pip install mpich)")
    cmd = [exe, "-n", str(np_), sys.executable, os.path.join(TESTS, script), *map(str, args)]
    proc = subprocess.run(cmd, env=rank_env(env), capture_output=True, text=True, timeout=timeout)
    if expect_ok:
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{script} on {np_} ranks failed (exit {proc.returncode}):\n{out[-8000:]}"
        for r in range(np_):
            assert f"RANK {r} OK" in proc.stdout, f"rank {r} did not finish {script}:\n{out[-8000:]}"
    return proc
