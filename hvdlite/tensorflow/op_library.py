"""Builds, caches and loads hvdlite's TensorFlow op library (hvdlite/tensorflow/ops/).

The library is compiled against the TensorFlow that is installed, so it is
built where that TensorFlow is known:

- at ``pip install`` time when TensorFlow is importable then (setup.py calls
  :func:`build`), into the package;
- otherwise on the first ``import hvdlite.tensorflow``, into the package
  directory when it is writable, else into ``$XDG_CACHE_HOME/hvdlite``
  (``~/.cache/hvdlite``). Ranks that import at the same time build it once,
  under a file lock.

Each build is named after the TensorFlow version and a hash of everything that
goes into it (sources, compiler flags), so a TensorFlow upgrade or a source
change builds a fresh library and never loads a stale one. To rebuild by hand
(run as a script: importing hvdlite.tensorflow would load the library first):

    python "$(python -c 'import hvdlite, os; print(os.path.dirname(hvdlite.__file__))')/tensorflow/op_library.py" --rebuild

``HVDLITE_TF_OPS_DIR`` names another directory to build into and load from;
``CXX`` the compiler (default ``g++``, else ``c++``).

This module is also loaded by setup.py from its path, before hvdlite is
installed, so it imports nothing of hvdlite at module level.
"""
import contextlib
import glob
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.join(HERE, "ops")
SOURCES = ["op_defs.cc", "collective_kernels.cc", "engine_bridge.cc"]
HEADERS = ["engine_bridge.h"]
# csrc/api/c_api.h, the engine's C API, from the source tree or (installed) from
# the copy setup.py puts into hvdlite/include.
C_API_DIRS = [os.path.join(HERE, os.pardir, os.pardir, "csrc", "api"), os.path.join(HERE, os.pardir, "include")]
LIBRARY_PREFIX = "hvdlite_tf_ops"


class BuildError(RuntimeError):
    """The op library could not be compiled."""


def c_api_dir():
    for d in C_API_DIRS:
        if os.path.isfile(os.path.join(d, "c_api.h")):
            return os.path.normpath(d)
    raise BuildError("csrc/api/c_api.h (the engine's C API header) was not found in " +
                     " or ".join(os.path.normpath(d) for d in C_API_DIRS) +
                     "; reinstall hvdlite")


def _tf_flags():
    import tensorflow as tf
    return tf.__version__, list(tf.sysconfig.get_compile_flags()), list(tf.sysconfig.get_link_flags())


def compiler():
    """The compiler command as a list ($CXX may carry arguments, e.g. "ccache g++")."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shlex.split(cxx)
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name)
        if path:
            return [path]
    raise BuildError("no C++ compiler found (looked for $CXX, g++, c++, clang++)")


def library_name(tf_version=None, compile_flags=None, link_flags=None):
    """File name of the library for this TensorFlow and these sources."""
    if tf_version is None:
        tf_version, compile_flags, link_flags = _tf_flags()
    digest = hashlib.sha256()
    digest.update(repr((tf_version, compile_flags, link_flags)).encode())
    for f in SOURCES + HEADERS:
        with open(os.path.join(SOURCE_DIR, f), "rb") as fh:
            digest.update(f.encode() + b"\0" + fh.read())
    with open(os.path.join(c_api_dir(), "c_api.h"), "rb") as fh:
        digest.update(fh.read())
    return f"{LIBRARY_PREFIX}.tf{tf_version}.{digest.hexdigest()[:16]}.so"


def _cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hvdlite")


def candidate_dirs():
    """Where a built library may be, in the order it is looked for."""
    override = os.environ.get("HVDLITE_TF_OPS_DIR")
    if override:
        return [override]
    return [SOURCE_DIR, _cache_dir()]


def _writable(d):
    try:
        os.makedirs(d, exist_ok=True)
    except OSError:
        return False
    return os.access(d, os.W_OK)


@contextlib.contextmanager
def _locked(directory):
    import fcntl
    with open(os.path.join(directory, f".{LIBRARY_PREFIX}.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def compile_library(target):
    """Compiles the sources into ``target`` (written atomically): every source
    into an object at once, then one link. Each includes TensorFlow's headers
    and takes seconds to compile, so one compiler run over all of them kept
    the first import waiting on one core."""
    from concurrent.futures import ThreadPoolExecutor
    tf_version, compile_flags, link_flags = _tf_flags()
    cxx = compiler()
    work = tempfile.mkdtemp(prefix=f".{LIBRARY_PREFIX}.", dir=os.path.dirname(target))
    try:
        objects = [os.path.join(work, f + ".o") for f in SOURCES]
        compiles = [cxx + ["-c", "-fPIC", "-O2", "-Wno-deprecated-declarations"] + compile_flags
                    + ["-I", SOURCE_DIR, "-I", c_api_dir(), os.path.join(SOURCE_DIR, f), "-o", o]
                    for f, o in zip(SOURCES, objects)]
        with ThreadPoolExecutor(max_workers=len(compiles)) as pool:
            for cmd, proc in pool.map(_run_compiler, compiles):
                _check_compiler("compiling", tf_version, cmd, proc)
        tmp = os.path.join(work, "library.so")
        link = cxx + ["-shared", "-fPIC"] + objects + ["-o", tmp] + link_flags
        _check_compiler("linking", tf_version, *_run_compiler(link))
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _run_compiler(cmd):
    try:
        return cmd, subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise BuildError(f"could not run the C++ compiler {cmd[0]!r}: {e}") from None


def _check_compiler(what, tf_version, cmd, proc):
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        errors = [ln for ln in lines if "error" in ln][:12]
        tail = "\n".join(errors or lines[-25:])
        raise BuildError(f"{what} the op library for TensorFlow {tf_version} failed (exit "
                         f"{proc.returncode}):\n$ {' '.join(cmd)}\n{tail}")


def _remove_stale(directory, keep):
    for old in glob.glob(os.path.join(directory, f"{LIBRARY_PREFIX}.*.so")):
        if os.path.basename(old) != keep:
            with contextlib.suppress(OSError):
                os.unlink(old)


def build(directory=None, force=False):
    """Builds the library for the installed TensorFlow (unless present) and
    returns its path. ``directory``: where (default: the first writable of
    :func:`candidate_dirs`)."""
    name = library_name()
    if directory is None:
        directory = next((d for d in candidate_dirs() if _writable(d)), None)
        if directory is None:
            raise BuildError("none of these directories is writable: " + ", ".join(candidate_dirs()) +
                             "; set HVDLITE_TF_OPS_DIR to one that is")
    elif not _writable(directory):
        raise BuildError(f"cannot write to {directory}")
    target = os.path.join(directory, name)
    with _locked(directory):
        if force or not os.path.exists(target):  # another rank may have built it meanwhile
            compile_library(target)
            _remove_stale(directory, name)
    return target


def find():
    """The path of an existing build for this TensorFlow and these sources, or None."""
    name = library_name()
    for d in candidate_dirs():
        path = os.path.join(d, name)
        if os.path.exists(path):
            return path
    return None


def path():
    """The library to load: an existing build, else a new one."""
    return find() or build()


def _fix_hint():
    # The script path, not "-m hvdlite.tensorflow.op_library": importing the
    # package loads the library, which is what fails here.
    return ("To fix: install a C++ compiler (g++ 9 or newer; set CXX to use another), then "
            f"rebuild with '{sys.executable} {os.path.abspath(__file__)} --rebuild', or reinstall "
            "hvdlite with 'pip install --no-build-isolation .' while TensorFlow is installed.")


def load():
    """Loads the library into TensorFlow and connects it to hvdlite's engine;
    returns the module of generated op wrappers. Raises ImportError saying
    what failed and how to fix it."""
    import tensorflow as tf
    try:
        library = path()
    except (BuildError, OSError) as e:
        raise ImportError(f"hvdlite.tensorflow needs its TensorFlow op library, which could not be "
                          f"built: {e}\n{_fix_hint()}") from None
    try:
        module = tf.load_op_library(library)
    except Exception as e:  # tf.errors.NotFoundError on an undefined symbol, ...
        raise ImportError(f"hvdlite.tensorflow could not load its op library {library}: {e}\n"
                          "It was built for a different TensorFlow or is damaged. " + _fix_hint()) from None
    _bind(library)
    return module


def _bind(library):
    """Hands the engine's C API function addresses to the library, so that its
    kernels use the engine of this process (the library does not link it)."""
    import ctypes

    from .._binding import ffi, lib
    so = ctypes.CDLL(library)  # the handle TensorFlow loaded: same path, same instance
    so.hvdlite_tf_api_names.restype = ctypes.c_char_p
    names = [n for n in so.hvdlite_tf_api_names().decode().split(",") if n]
    addresses = (ctypes.c_uint64 * len(names))(
        *[int(ffi.cast("uintptr_t", getattr(lib, n))) for n in names])
    if so.hvdlite_tf_bind(addresses, len(names)) != 0:
        raise ImportError(f"hvdlite.tensorflow: the op library {library} does not match this "
                          "hvdlite build. " + _fix_hint())


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(prog="op_library.py",
                                     description="Build hvdlite's TensorFlow op library.")
    parser.add_argument("--rebuild", action="store_true", help="compile even if a build exists")
    parser.add_argument("--dir", help="directory to build into")
    args = parser.parse_args(argv)
    try:
        print(build(args.dir, force=args.rebuild) if args.rebuild or args.dir else path())
    except BuildError as e:
        print(f"error: {e}\n{_fix_hint()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
