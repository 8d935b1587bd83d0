"""``hvdrun --check-build``: what this hvdlite install can do, without starting a job.

Frameworks are looked up in the installed package metadata rather than imported:
importing torch or TensorFlow takes seconds and is not needed to name a version.
"""

from importlib import metadata

from . import __version__ as launcher_version
from .mpi_detect import MpiNotFound, detect_mpi

COMPRESSORS = ("none", "fp16", "topk")

_FRAMEWORKS = (
    ("PyTorch", ("torch",)),
    ("TensorFlow", ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly")),
)


def _dist_version(names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _hvdlite():
    """(version, hvdlite module or None); the launcher's own version if hvdlite is not importable."""
    try:
        import hvdlite
    except Exception:       # not built yet; any import-time failure is worth showing as "not built"
        return launcher_version, None
    return getattr(hvdlite, "__version__", launcher_version), hvdlite


def _gpu_support(hvd):
    fn = getattr(hvd, "nccl_built", None) if hvd is not None else None
    if fn is None:
        return "no"
    try:
        return "yes" if fn() else "no"
    except Exception as e:
        return "unknown (%s)" % e


def _box(found):
    return "[X]" if found else "[ ]"


def check_build():
    version, hvd = _hvdlite()
    lines = ["hvdlite v%s%s:" % (version, "" if hvd is not None else " (engine not importable)"), ""]
    lines.append("Available frameworks:")
    for label, dists in _FRAMEWORKS:
        v = _dist_version(dists)
        lines.append("    %s %s%s" % (_box(v), label, (" " + v) if v else ""))
    lines += ["", "MPI:"]
    try:
        mpi = detect_mpi(with_version=True)
        lines.append("    [X] %s (%s, launcher %s)" % (mpi.version or mpi.flavour, mpi.flavour, mpi.mpiexec))
    except MpiNotFound as e:
        lines.append("    [ ] none found: %s" % e)
    gpu = _gpu_support(hvd)
    lines += ["", "GPU support:", "    %s NCCL%s" % (_box(gpu == "yes"), "" if gpu in ("yes", "no") else " " + gpu)]
    lines += ["", "Compressors:", "    " + ", ".join(COMPRESSORS)]
    return "\n".join(lines)
