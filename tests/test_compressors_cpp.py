"""Builds and runs the C++ checks of the compressors (tests/cpp/test_compressors.cc).

The compressors are engine code with no Python surface of their own, so their
exactness (half rounding, vectorised == scalar, the MPI sum op, top-k against a
full sort, error feedback conserving the gradient) is checked in C++; this test
compiles that program with the venv's MPI compiler wrapper and runs it.
"""
import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")


def find_mpicxx():
    candidates = [
        os.environ.get("MPICXX"),
        os.path.join(sys.prefix, "bin", "mpicxx"),
        os.path.join(ROOT, ".venv", "bin", "mpicxx"),
        shutil.which("mpicxx"),
    ]
    for c in candidates:
        if c and os.path.isfile(c):
            return c
    return None


def test_compressors_cpp(tmp_path):
    mpicxx = find_mpicxx()
    if mpicxx is None:
        pytest.skip("no mpicxx (pip install mpich)")
    sources = ([os.path.join(ROOT, "tests", "cpp", "test_compressors.cc")]
               + sorted(glob.glob(os.path.join(CSRC, "compressors", "*.cc")))
               + [os.path.join(CSRC, "common.cc"), os.path.join(CSRC, "message.cc")])
    exe = str(tmp_path / "test_compressors")
    build = subprocess.run(
        [mpicxx, "-std=c++17", "-O2", "-Wall", "-I", CSRC, *sources, "-o", exe],
        capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, f"build failed:\n{build.stdout}\n{build.stderr}"

    # MPI_Init inside: runs as a singleton, no launcher needed.
    run = subprocess.run([exe], capture_output=True, text=True, timeout=900, cwd=str(tmp_path))
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"compressor checks failed:\n{output}"
    assert " 0 failed" in run.stdout, output
