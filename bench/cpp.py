"""Builds the C++ micro-benchmarks of bench/ against the engine's code.

    python bench/cpp.py [program ...]     # builds them (all by default), prints each binary's path

A program is bench/<program>.cc (PROGRAMS). The engine's sources
(build_engine.py's ENGINE_SOURCES, read from the file: importing it writes
hvdlite/_build_info.py), less the C API, are compiled with the engine's flags
by the MPI compiler wrapper the engine was built with, into object files
cached by a hash of the sources, the flags and the compiler under
``cache_dir`` (default ~/.cache/hvdlite-bench); each program is linked
against all of them, so a source that moves or splits needs no change here.
tests/test_bench_smoke.py links each one (``link``) against the tests'
sanitized build of the same sources and runs it tiny.
"""
import ast
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
CSRC = os.path.join(REPO, "csrc")
FLAGS = ["-std=c++17", "-O3"]  # the engine's (build_engine.py), less its warnings
PROGRAMS = ("compressors_bench", "sum_step_bench")


def engine_sources():
    """csrc/-relative paths of the engine's sources, without the C API."""
    tree = ast.parse(open(os.path.join(REPO, "build_engine.py")).read())
    listed = next(ast.literal_eval(node.value) for node in tree.body
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "ENGINE_SOURCES")
    return [s for s in listed if s != "api/c_api.cc"]


def mpicxx():
    exe = os.environ.get("MPICXX")
    if not exe:
        try:
            from hvdlite import _build_info
            exe = _build_info.MPICXX
        except ImportError:
            exe = None
    if not exe or not os.path.exists(exe):
        exe = shutil.which("mpicxx") or os.path.join(sys.prefix, "bin", "mpicxx")
    return exe


def _fingerprint(cxx, sources):
    h = hashlib.sha256(" ".join([cxx] + FLAGS + sources).encode())
    for f in sorted(glob.glob(os.path.join(CSRC, "**", "*.*"), recursive=True)):
        with open(f, "rb") as fh:
            h.update(os.path.relpath(f, CSRC).encode() + b"\0" + fh.read())
    return h.hexdigest()[:16]


def _run(cmd, what):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed:\n%s\n%s" % (what, " ".join(cmd), p.stderr[-3000:]))


def engine_objects(cxx, cache_dir):
    """The engine's object files (compiled once per source tree) and their folder."""
    sources = engine_sources()
    done = os.path.join(cache_dir, _fingerprint(cxx, sources))
    objects = [os.path.join(done, s.replace("/", "_") + ".o") for s in sources]
    if all(os.path.exists(o) for o in objects):
        return objects, done
    os.makedirs(cache_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="staging-", dir=cache_dir)
    try:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            list(pool.map(lambda s: _run([cxx, "-c", *FLAGS, "-I", CSRC, os.path.join(CSRC, s), "-o",
                                          os.path.join(staging, s.replace("/", "_") + ".o")],
                                         "compiling " + s), sources))
        try:
            os.rename(staging, done)
        except OSError:  # another build finished the same objects first
            if not all(os.path.exists(o) for o in objects):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return objects, done


def link(program, objects, flags, exe):
    """bench/<program>.cc compiled with ``flags`` and linked against ``objects`` into ``exe``."""
    _run([mpicxx(), *flags, "-I", CSRC, os.path.join(BENCH, program + ".cc"), *objects, "-o", exe + ".tmp"],
         "building " + program)
    os.replace(exe + ".tmp", exe)
    return exe


def build(program, cache_dir=None):
    """bench/<program>.cc linked against the engine (cached); returns (binary, compiler)."""
    cxx = mpicxx()
    cache_dir = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "hvdlite-bench")
    objects, folder = engine_objects(cxx, cache_dir)
    with open(os.path.join(BENCH, program + ".cc"), "rb") as fh:
        exe = os.path.join(folder, "%s-%s" % (program, hashlib.sha256(fh.read()).hexdigest()[:12]))
    if not os.path.exists(exe):
        link(program, objects, FLAGS, exe)
    return exe, cxx


def main(argv=None):
    for program in (argv if argv is not None else sys.argv[1:]) or PROGRAMS:
        print(build(program)[0], flush=True)


if __name__ == "__main__":
    main()
