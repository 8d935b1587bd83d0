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
    """CUDA torch tensors run on torch.distributed's NCCL (docs/gpu.md): ask
    torch (this imports it, the one framework import here: only torch knows
    whether it has CUDA and NCCL)."""
    if hvd is None or _dist_version(("torch",)) is None:
        return "no", "no torch"
    try:
        import torch
        import torch.distributed as dist
        if not torch.cuda.is_available():
            return "no", "torch %s has no CUDA device here; CUDA tensors would be staged through the host" \
                % torch.__version__
        if not (dist.is_available() and dist.is_nccl_available()):
            return "no", "torch has no NCCL; CUDA tensors are staged through the host"
        return "yes", "torch.distributed, %d GPUs" % torch.cuda.device_count()
    except Exception as e:
        return "unknown", str(e)


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
    from .hosts import scheduler_description
    scheduler = scheduler_description()
    lines += ["", "Scheduler:", "    %s %s" % (_box(scheduler), scheduler or
                                             "none seen (hosts come from -H, --hostfile, or this machine)")]
    gpu, why = _gpu_support(hvd)
    lines += ["", "GPU support:", "    %s NCCL for CUDA torch tensors (%s)" % (_box(gpu == "yes"), why)]
    lines += ["", "Compressors:", "    " + ", ".join(COMPRESSORS)]
    return "\n".join(lines)
