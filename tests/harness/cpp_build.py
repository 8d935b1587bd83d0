"""Builds and runs the C++ test programs of tests/cpp/ against the engine's code.

The engine's sources (build_engine.ENGINE_SOURCES, read from the file, since
importing build_engine.py writes hvdlite/_build_info.py), less the C API, are
compiled in parallel with the MPI compiler wrapper into object files, cached
by a hash of csrc/, the flags and the compiler under $HVDLITE_CPP_TEST_CACHE
(default <tmp>/hvdlite-cpp-tests); a test program is linked against all of
them, so a source file moving or splitting needs no change here. A program
prints "<n> checks, <m> failed" (tests/cpp/check.h) and exits non-zero when a
check failed or a sanitizer found an error.
"""
import ast
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.checks import unavailable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(ROOT, "csrc")
CPP_TESTS = os.path.join(ROOT, "tests", "cpp")
# Under AddressSanitizer and UndefinedBehaviorSanitizer: an overread, a leak
# or undefined behaviour fails the program like a failed check.
FLAGS = ["-std=c++17", "-O2", "-Wall", "-Wno-unused-function", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


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


def engine_sources():
    """csrc/-relative paths of the engine's sources, without the C API."""
    tree = ast.parse(open(os.path.join(ROOT, "build_engine.py")).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "ENGINE_SOURCES":
            return [s for s in ast.literal_eval(node.value) if s != "api/c_api.cc"]
    raise RuntimeError("build_engine.py has no ENGINE_SOURCES list")


def _fingerprint(mpicxx, sources):
    h = hashlib.sha256(" ".join(FLAGS + sources).encode())
    h.update(subprocess.run([mpicxx, "--version"], capture_output=True).stdout)
    for dirpath, dirnames, files in sorted(os.walk(CSRC)):
        dirnames.sort()
        for f in sorted(files):
            with open(os.path.join(dirpath, f), "rb") as fh:
                h.update(f.encode() + fh.read())
    return h.hexdigest()[:16]


def _compile(mpicxx, src, obj):
    p = subprocess.run([mpicxx, "-c", *FLAGS, "-I", CSRC, src, "-o", obj],
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        pytest.fail(f"compiling {src} failed:\n{p.stdout}{p.stderr}", pytrace=False)
    return obj


def engine_objects(mpicxx):
    """Object files of the engine's sources, compiled once per source tree."""
    sources = engine_sources()
    cache = os.environ.get("HVDLITE_CPP_TEST_CACHE",
                           os.path.join(tempfile.gettempdir(), "hvdlite-cpp-tests"))
    done = os.path.join(cache, _fingerprint(mpicxx, sources))
    objects = [os.path.join(done, s.replace("/", "_") + ".o") for s in sources]
    if all(os.path.exists(o) for o in objects):
        return objects
    os.makedirs(cache, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="staging-", dir=cache)
    try:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            list(pool.map(lambda s: _compile(mpicxx, os.path.join(CSRC, s),
                                             os.path.join(staging, s.replace("/", "_") + ".o")),
                          sources))
        try:
            os.rename(staging, done)
        except OSError:  # another run finished the same objects first
            if not all(os.path.exists(o) for o in objects):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return objects


def build_and_run(program, out_dir, timeout=900):
    """Builds tests/cpp/<program>.cc against the engine and runs it in
    ``out_dir``; fails the calling test with the output when a check failed."""
    mpicxx = find_mpicxx()
    if mpicxx is None:
        unavailable("no mpicxx found: install the mpich wheel (pip install mpich)")
    exe = os.path.join(str(out_dir), program)
    objects = engine_objects(mpicxx)
    build = subprocess.run([mpicxx, *FLAGS, "-I", CSRC, os.path.join(CPP_TESTS, program + ".cc"),
                            *objects, "-o", exe], capture_output=True, text=True, timeout=timeout)
    assert build.returncode == 0, f"building {program} failed:\n{build.stdout}\n{build.stderr}"
    # A program that calls MPI_Init runs as a singleton: no launcher needed.
    run = subprocess.run([exe], capture_output=True, text=True, timeout=timeout, cwd=str(out_dir))
    output = run.stdout + run.stderr
    assert run.returncode == 0 and " 0 failed" in run.stdout, f"{program} failed:\n{output}"
    return run.stdout
