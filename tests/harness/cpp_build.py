"""Builds and runs the C++ test programs of tests/cpp/ against the engine's code.

A program is compiled with the MPI compiler wrapper under AddressSanitizer and
UndefinedBehaviorSanitizer and linked against the engine's objects (its sources,
build_engine.ENGINE_SOURCES, read from the file, since importing build_engine.py
writes hvdlite/_build_info.py; less the C API) from the sanitized build of
tests/harness/sanitizer_build.py, which the multi-rank sanitizer tests load too:
the engine is compiled with the sanitizers once per source tree, so a source
file moving or splitting needs no change here. A program prints
"<n> checks, <m> failed" (tests/cpp/check.h) and exits non-zero when a check
failed or a sanitizer found an error.
"""
import ast
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from harness import sanitizer_build
from harness.checks import unavailable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(ROOT, "csrc")
CPP_TESTS = os.path.join(ROOT, "tests", "cpp")
# Under AddressSanitizer and UndefinedBehaviorSanitizer: an overread, a leak
# or undefined behaviour fails the program like a failed check. (The engine's
# objects come from a build that lets UBSan go on after a report: its
# "runtime error:" lines fail the program's test too.) -O1, as the engine's
# objects: the sanitizers' advice, and a third less compile time than -O2.
FLAGS = ["-std=c++17", "-O1", "-Wall", "-Wno-unused-function", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
SANITIZERS = "address,undefined"


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


def engine_objects():
    """Object files of the engine's sources, from the sanitized build."""
    return sanitizer_build.engine_objects(SANITIZERS, engine_sources())


def build(programs, out_dir, timeout=900):
    """Builds tests/cpp/<program>.cc of each of ``programs`` against the engine
    into ``out_dir``, as many at once as there are cores: each program is one
    translation unit, so built one at a time they left all cores but one idle
    (the engine's C++ tests spent half their time compiling on one of two
    cores). Returns {program: (path of the program, or None where its build
    failed, the compiler's output)}."""
    mpicxx = find_mpicxx()
    if mpicxx is None:
        unavailable("no mpicxx found: install the mpich wheel (pip install mpich)")
    objects = engine_objects()

    def one(program):
        exe = os.path.join(str(out_dir), program)
        p = subprocess.run([mpicxx, *FLAGS, "-I", CSRC, os.path.join(CPP_TESTS, program + ".cc"),
                            *objects, "-o", exe], capture_output=True, text=True, timeout=timeout)
        return program, (exe if p.returncode == 0 else None, p.stdout + p.stderr)

    with ThreadPoolExecutor(max_workers=max(1, min(len(programs), os.cpu_count() or 1))) as pool:
        return dict(pool.map(one, programs))


def run(program, built, out_dir, timeout=900):
    """Runs a program that ``build`` returned in ``out_dir``; fails the calling
    test with the output when its build or a check failed."""
    exe, build_output = built
    assert exe is not None, f"building {program} failed:\n{build_output}"
    # A program that calls MPI_Init runs as a singleton: no launcher needed.
    result = subprocess.run([exe], capture_output=True, text=True, timeout=timeout, cwd=str(out_dir))
    assert_ran_clean(result, program)
    assert " 0 failed" in result.stdout, f"{program} failed:\n{result.stdout + result.stderr}"
    return result.stdout


def build_and_run(program, out_dir, timeout=900):
    """Builds tests/cpp/<program>.cc against the engine and runs it in
    ``out_dir``; fails the calling test with the output when a check failed."""
    return run(program, build([program], out_dir, timeout)[program], out_dir, timeout)


def assert_ran_clean(run, program):
    """A program linked against the sanitized engine exited 0 with no sanitizer report."""
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"{program} failed:\n{output}"
    assert "runtime error:" not in output, f"{program}: undefined behaviour:\n{output}"
