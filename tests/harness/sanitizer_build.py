"""Builds the engine with a sanitizer into a private copy of the hvdlite package.

The shared editable install (hvdlite/_engine.abi3.so) is never touched: the
sources and the Python package are copied to a cache directory, build_engine.py
runs there with HVDLITE_SANITIZE set (so it writes that copy's _build_info.py),
and the objects are compiled in parallel at -O1 (what the sanitizers'
documentation recommends; cffi's own build would compile one file at a time at
-O3). Put the returned directory first on PYTHONPATH and preload the runtime.

    python tests/harness/sanitizer_build.py address,undefined     # prints the directory
    python tests/harness/sanitizer_build.py thread

Builds are cached by a hash of csrc/, build_engine.py and the compiler (the
Python files are copied from the checkout on every use), under $HVDLITE_SANITIZER_CACHE (default: <tmp>/hvdlite-sanitizer-builds).
The object files stay beside the engine: the C++ test programs of tests/cpp/
link the address,undefined build's (engine_objects), so the engine is compiled
with the sanitizers once per source tree, not twice.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KINDS = {"address,undefined": "libasan.so", "thread": "libtsan.so"}

# Runs inside the staging directory, in a fresh interpreter with HVDLITE_SANITIZE set.
_BUILD = r"""
import os, subprocess, sys, sysconfig
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, os.getcwd())
import build_engine as be                      # writes ./hvdlite/_build_info.py
san_compile, san_link = be.sanitizer_flags()
os.makedirs("obj", exist_ok=True)
be.ffibuilder.emit_c_code("obj/_engine_cffi.cpp")
sources = [os.path.join("csrc", f) for f in be.ENGINE_SOURCES] + ["obj/_engine_cffi.cpp"]
includes = ["-I" + d for d in [be.CSRC] + be.include_dirs + [sysconfig.get_paths()["include"]]]
cxx = os.environ.get("CXX", "c++")
def compile_one(src):
    obj = os.path.join("obj", src.replace("/", "_") + ".o")
    cmd = [cxx, "-c", "-fPIC", "-std=c++17", "-O1", "-Wall", "-Wno-unused-function",
           *be.compile_args, *san_compile, *includes, src, "-o", obj]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("compile failed: %s\n%s" % (" ".join(cmd), p.stderr))
    return obj
with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
    objects = list(pool.map(compile_one, sources))
rpaths = ["-Wl,-rpath," + d for d in be.library_dirs]
libs = ["-L" + d for d in be.library_dirs] + ["-l" + l for l in (be.libraries or ["mpi"])]
cmd = [cxx, "-shared", "-o", "hvdlite/_engine.abi3.so", *objects, *san_link, *be.link_args,
       *rpaths, *libs]
p = subprocess.run(cmd, capture_output=True, text=True)
if p.returncode != 0:
    raise SystemExit("link failed: %s\n%s" % (" ".join(cmd), p.stderr))
"""


def runtime_library(kind):
    """Path of the sanitizer runtime to LD_PRELOAD for ``kind``."""
    out = subprocess.run([os.environ.get("CC", "gcc"), "-print-file-name=" + KINDS[kind]],
                         capture_output=True, text=True, check=True).stdout.strip()
    if not os.path.isabs(out) or not os.path.exists(out):
        raise RuntimeError("the %s runtime (%s) is not installed: apt-get install gcc (libasan, "
                           "libubsan, libtsan come with it)" % (kind, KINDS[kind]))
    return os.path.realpath(out)


def _fingerprint(kind):
    """What the compiled engine depends on (the Python files are synced on every use):
    the compiler, the sources and the environment whose MPI it links."""
    h = hashlib.sha256(kind.encode())
    # The engine is linked with an rpath into this environment's MPI: a build
    # made from another venv (another checkout, since deleted) must not be reused.
    h.update(sys.prefix.encode())
    h.update(subprocess.run([os.environ.get("CXX", "c++"), "--version"], capture_output=True).stdout)
    for dirpath, dirnames, files in sorted(os.walk(os.path.join(REPO, "csrc"))):
        dirnames.sort()
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            h.update(os.path.relpath(path, REPO).encode())
            with open(path, "rb") as fh:
                h.update(fh.read())
    with open(os.path.join(REPO, "build_engine.py"), "rb") as fh:
        h.update(fh.read())
    return h.hexdigest()[:16]


_PY_IGNORE = shutil.ignore_patterns("__pycache__", "_engine*.so", "_engine.c*", "_build_info.py")


def _sync_python(root):
    # The Python package is the checkout's, as it is now; only the engine and
    # its _build_info.py belong to the sanitizer build.
    shutil.copytree(os.path.join(REPO, "hvdlite"), os.path.join(root, "hvdlite"),
                    ignore=_PY_IGNORE, dirs_exist_ok=True)


def _complete(root):
    # The engine, and its objects for the C++ test programs (engine_objects).
    return os.path.exists(os.path.join(root, "hvdlite", "_engine.abi3.so")) and os.path.isdir(
        os.path.join(root, "obj"))


def engine_objects(kind, sources):
    """The object files of ``sources`` (csrc/-relative) from the ``kind``
    build, which the C++ test programs link (tests/harness/cpp_build.py): one
    sanitized compile of the engine serves both."""
    root = build(kind)
    return [os.path.join(root, "obj", ("csrc/" + s).replace("/", "_") + ".o") for s in sources]


def build(kind):
    """Returns a directory whose ``hvdlite`` package has an engine built with
    ``-fsanitize=kind``; builds it unless a build of the same sources exists."""
    if kind not in KINDS:
        raise ValueError("kind must be one of %s" % ", ".join(KINDS))
    cache = os.environ.get("HVDLITE_SANITIZER_CACHE",
                           os.path.join(tempfile.gettempdir(), "hvdlite-sanitizer-builds"))
    root = os.path.join(cache, "%s-%s" % (kind.replace(",", "+"), _fingerprint(kind)))
    if _complete(root):
        _sync_python(root)
        return root
    os.makedirs(cache, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="staging-", dir=cache)
    try:
        shutil.copytree(os.path.join(REPO, "csrc"), os.path.join(staging, "csrc"))
        shutil.copy(os.path.join(REPO, "build_engine.py"), staging)
        _sync_python(staging)
        env = dict(os.environ, HVDLITE_SANITIZE=kind)
        p = subprocess.run([sys.executable, "-c", _BUILD], cwd=staging, env=env,
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError("sanitizer build (%s) failed:\n%s%s" % (kind, p.stdout, p.stderr))
        if os.path.exists(root) and not _complete(root):
            shutil.rmtree(root)  # an older layout's build of the same sources: without its objects
        try:
            os.rename(staging, root)
        except OSError:  # another run finished the same build first
            if not _complete(root):
                raise
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)
    return root


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "address,undefined"))
