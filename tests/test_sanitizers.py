"""The multi-rank engine tests under AddressSanitizer + UndefinedBehaviorSanitizer
(always) and ThreadSanitizer (opt-in: HVDLITE_TEST_TSAN=1, about 3x slower).

The engine is built with the sanitizer into a private copy of the package
(tests/harness/sanitizer_build.py), never into the shared editable install. Python is
not instrumented, so the sanitizer runtime is preloaded into every rank
(``mpiexec -genv LD_PRELOAD ...``, not into mpiexec itself). Suppressions live
in tests/sanitizers/, each entry explained there. A run passes when every rank
finishes and no sanitizer report appears. docs/reliability.md has the commands
to do the same by hand.
"""
import os
import re
import subprocess
import sys

import pytest

from harness.hosts import hosts_or_skip, hvdrun_argv
from harness.ranks import TESTS, mpiexec, rank_env
from harness.sanitizer_build import build, runtime_library

SUPP = os.path.join(TESTS, "sanitizers")
REPORT = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|"
                    r"WARNING: ThreadSanitizer|SUMMARY: \w+Sanitizer")

# What runs under the sanitizers: (python's arguments, ranks). Rank-side test
# modules (tests/harness/rank_plugin.py) run under pytest, the other scripts directly.
# Without pytest's faulthandler plugin: its fatal-signal handlers make
# LeakSanitizer's tracer crash at exit in ranks that ran Python threads
# (reliability_threads.py), and the sanitizers report crashes themselves.
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:faulthandler", "-o", "addopts="]
ENGINE_RUNS = [
    (PYTEST + ["{tests}/scripts/engine_collectives.py"], 2),
    (PYTEST + ["{tests}/scripts/engine_fusion_cache.py", "{tests}/scripts/engine_compression.py",
               "{tests}/scripts/engine_timeline.py",
               "-k", "fusion_matches_unfused or test_cache or fp16 or topk or test_timeline"], 2),
    (PYTEST + ["{tests}/scripts/reliability_bad_input.py"], 2),
    (PYTEST + ["{tests}/scripts/reliability_threads.py"], 2),
    (PYTEST + ["{tests}/scripts/engine_adasum.py", "-k", "not non_power_of_two"], 2),
    (PYTEST + ["{tests}/scripts/engine_autotune.py"], 2),
]

# Engines started and replaced, process sets added and removed, with no other
# MPI traffic in between: every communicator the engine creates must be freed,
# so this run uses no MPI leak suppression (see lsan-engine.supp).
LIFECYCLE = r"""
import numpy as np
import hvdlite as hvd
for i in range(3):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    ps = hvd.add_process_set([0])
    if r == 0:
        hvd.allreduce(np.ones(3), process_set=ps)
    hvd.remove_process_set(ps)
    hvd.allreduce(np.ones(1000, np.float32), compression=hvd.Compression.topk(0.1))
    hvd.shutdown()
hvd.init()
print("RANK %d OK" % hvd.rank(), flush=True)
"""


def sanitizer_env(kind, root, leak_supp="lsan.supp"):
    env = rank_env({
        "PYTHONPATH": os.pathsep.join([root, TESTS]),
        # Leak check at exit; the default fast unwinder stops at MPI's frames.
        "ASAN_OPTIONS": "detect_leaks=1:fast_unwind_on_malloc=0:print_suppressions=0",
        "LSAN_OPTIONS": "suppressions=%s:print_suppressions=0" % os.path.join(SUPP, leak_supp),
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=0",
        "TSAN_OPTIONS": "suppressions=%s:halt_on_error=0:second_deadlock_stack=1"
                        % os.path.join(SUPP, "tsan.supp"),
        # UCX's memory hooks (libucm) intercept madvise in every new thread and
        # crash inside TSan's interceptors; MPI over shared memory needs none.
        "UCX_MEM_EVENTS": "no",
        # Sanitized ranks are slower: a rank-side case gets the launch's time.
        "HVDLITE_TEST_CASE_TIMEOUT": "900",
        "HVDLITE_TEST_THREAD_STEPS": "60",
        # Instrumented code costs several times the CPU: checks of CPU shares are off.
        "HVDLITE_TEST_SANITIZED": "1",
    })
    return env


def launch_sanitized(kind, root, argv, ranks, env, cwd, timeout=900):
    """Runs ``python argv...`` on ``ranks`` ranks from ``cwd``, which must not
    hold an hvdlite/ that would shadow ``root`` (``-m`` puts it first)."""
    from hvdlite import _build_info
    preload = runtime_library(kind)
    if _build_info.MPI_FLAVOUR == "openmpi":
        pass_env = ["-x", "LD_PRELOAD=" + preload]
    else:
        pass_env = ["-genv", "LD_PRELOAD", preload]
    cmd = [mpiexec(), *pass_env, "-n", str(ranks), sys.executable, *map(str, argv)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def check_clean(proc, ranks, what, expect_ok=True):
    out = proc.stdout + proc.stderr
    reports = [line for line in out.splitlines() if REPORT.search(line)]
    assert not reports, f"{what}: sanitizer reports:\n{out[-20000:]}"
    if expect_ok:
        assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{out[-8000:]}"
        for r in range(ranks):
            assert f"RANK {r} OK" in proc.stdout, f"{what}: rank {r} did not finish:\n{out[-8000:]}"


def assert_instrumented(kind, root, env):
    """The ranks really load the sanitized engine, with the runtime mapped."""
    probe = ("import hvdlite, hvdlite._engine as e, hvdlite._build_info as b; "
             "maps = open('/proc/self/maps').read(); "
             "print(e.__file__, b.SANITIZE, %r in maps)" % os.path.basename(runtime_library(kind)).split(".")[0])
    # Not from the checkout's directory: "-c" puts the cwd (and its hvdlite/) first.
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root,
                       env=dict(env, LD_PRELOAD=runtime_library(kind)), timeout=120)
    assert p.returncode == 0, p.stderr
    path, built_for, mapped = p.stdout.split()
    assert path.startswith(root) and built_for == kind and mapped == "True", p.stdout


def run_engine_suite(kind, tmp_path):
    root = build(kind)
    env = sanitizer_env(kind, root)
    assert_instrumented(kind, root, env)
    for argv, ranks in ENGINE_RUNS:
        argv = [str(a).format(tmp=tmp_path, tests=TESTS) for a in argv]
        proc = launch_sanitized(kind, root, argv, ranks, env, tmp_path)
        check_clean(proc, ranks, f"{kind}: {' '.join(argv)}")
    # A rank failing with pending handles: the shutdown paths, checked too.
    proc = launch_sanitized(kind, root, [os.path.join(TESTS, "scripts/reliability_failure.py"),
                                         "tag", "raise_pending", 1], 2, env, tmp_path)
    check_clean(proc, 2, f"{kind}: reliability_failure.py raise_pending", expect_ok=False)
    assert "SURVIVOR 0 ERROR_AT" in proc.stdout, proc.stdout + proc.stderr[-4000:]
    script = tmp_path / "lifecycle.py"
    script.write_text(LIFECYCLE)
    proc = launch_sanitized(kind, root, [script], 2,
                            sanitizer_env(kind, root, leak_supp="lsan-engine.supp"), tmp_path)
    check_clean(proc, 2, f"{kind}: engine lifecycle")
    runs = len(ENGINE_RUNS) + 2
    print(f"\n{kind}: {runs} multi-rank runs on 2 ranks, 0 sanitizer reports")


def test_engine_under_asan_ubsan(tmp_path):
    run_engine_suite("address,undefined", tmp_path)


def test_engine_between_hosts_under_asan_ubsan(tmp_path):
    """engine_collectives.py on 2 network-namespace hosts x 2 ranks (MPI over
    TCP, started by hvdrun) with the ring threshold lowered, so the ring, the
    hierarchical allreduce, allgather and reducescatter and compression between
    hosts all run sanitized. hvdrun itself is not: the preload and the
    sanitized package reach only the ranks (-genv)."""
    kind = "address,undefined"
    root = build(kind)
    hosts = hosts_or_skip(2)
    try:
        env = sanitizer_env(kind, root)
        env.pop("PYTHONPATH")
        prefix, extra = hvdrun_argv()
        env.update(extra, PATH=hosts.bin_dir + os.pathsep + env["PATH"], UCX_TLS="tcp,self",
                   HVDLITE_RING_THRESHOLD="1024", HVDLITE_RING_CHUNK_BYTES="4096",
                   HVDLITE_HIERARCHICAL_PIECE_BYTES="24576")
        env.pop("HVDLITE_MPIEXEC", None)
        ranks_env = "-genv LD_PRELOAD %s -genv PYTHONPATH %s" % (runtime_library(kind),
                                                                os.pathsep.join([root, TESTS]))
        cmd = prefix + ["-np", "4", "-H", ",".join("%s:2" % n for n in hosts.names), "-i", hosts.key,
                        "--mpi-args", ranks_env, sys.executable, *PYTEST,
                        os.path.join(TESTS, "scripts/engine_collectives.py")]
        proc = subprocess.run(hosts.on_host(1, cmd, cwd=str(tmp_path)), env=env, capture_output=True,
                              text=True, timeout=900)
    finally:
        hosts.down()
    check_clean(proc, 4, f"{kind}: engine_collectives.py on 2 hosts x 2 ranks")


if os.environ.get("HVDLITE_TEST_TSAN") == "1":
    # Opt-in (about 3x slower): defined only when asked for, so CI has no skip.
    def test_engine_under_tsan(tmp_path):
        run_engine_suite("thread", tmp_path)
