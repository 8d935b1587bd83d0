"""Start-up, shutdown and the rank/size queries (Horovod's ``hvd.basics``)."""
import atexit
import json
import os
import sys
import threading
import time
import traceback

from . import exceptions
from ._binding import NO_MPI_HELP, PEER_LOST_KINDS, check, ffi, last_error, lib
from .process_sets import forget_registered_sets, global_process_set, register_at_init

_state_lock = threading.Lock()
_init_comm = None          # the mpi4py communicator init() was given
_atexit_registered = False
_exit_reason = None        # set when the process dies of an unhandled exception or sys.exit
_exit_code = None          # the code given to sys.exit, when it was called
_peer_lost = False         # the engine stopped because a peer stopped answering
_reported = False          # a "failing" line went to hvdrun
_homogeneous = None        # every host runs the same number of ranks (set by init)


_mpi_started_here = False  # init() called MPI_Init_thread, so exit must finalise


def _mpi():
    # mpi4py initialises MPI with MPI_THREAD_MULTIPLE, which the engine needs,
    # unless the script set mpi4py.rc.initialize = False (as Horovod scripts
    # that start MPI late do): then MPI is started here, as Horovod does.
    try:
        from mpi4py import MPI
    except ImportError as e:   # mpi4py itself is missing
        raise ImportError(f"hvdlite.init() needs mpi4py ({e}): pip install mpi4py (with your "
                          "own MPI: built for it, as docs/install.md shows)") from None
    except RuntimeError as e:  # mpi4py's wheel found no MPI library to load
        raise ImportError(f"hvdlite.init(): mpi4py cannot load an MPI library "
                          f"({str(e).splitlines()[0]}). {NO_MPI_HELP}.") from None
    global _mpi_started_here
    if not MPI.Is_initialized() and not MPI.Is_finalized():
        provided = MPI.Init_thread(MPI.THREAD_MULTIPLE)
        _mpi_started_here = True
        if provided < MPI.THREAD_MULTIPLE:
            raise exceptions.InvalidArgumentError(
                "this MPI library does not provide MPI_THREAD_MULTIPLE, which hvdlite's engine "
                "needs; use an MPI built with thread support (the mpich wheel has it)")
    return MPI


def _resolve_comm(comm):
    MPI = _mpi()
    if comm is None:
        from . import rendezvous
        if rendezvous.in_place():
            # hvdrun's in-place recovery: each rank is its own MPI job, and the
            # job's communicator forms at hvdrun's rendezvous.
            return rendezvous.join()[1]
        return MPI.COMM_WORLD
    if isinstance(comm, (list, tuple)):
        ranks = [int(r) for r in comm]
        world = MPI.COMM_WORLD
        if world.Get_rank() not in ranks:
            raise exceptions.InvalidArgumentError(
                f"init(comm={ranks}): this process is COMM_WORLD rank {world.Get_rank()}, which is "
                "not in the list; only the listed ranks may call init() with it")
        if len(set(ranks)) != len(ranks) or any(r < 0 or r >= world.Get_size() for r in ranks):
            raise exceptions.InvalidArgumentError(
                f"init(comm={ranks}): ranks must be distinct and in [0, {world.Get_size()})")
        group = world.Get_group().Incl(ranks)
        sub = world.Create_group(group)
        group.Free()
        return sub
    if not hasattr(comm, "py2f"):
        raise exceptions.InvalidArgumentError(
            f"init(comm=...) takes an mpi4py communicator or a list of ranks, not {type(comm).__name__}")
    return comm


def init(comm=None, process_sets=None):
    """Starts hvdlite's engine on this process (collective over ``comm``).

    ``comm`` is an mpi4py communicator or a list of COMM_WORLD ranks; default
    COMM_WORLD. ``process_sets`` is an optional list of :class:`ProcessSet` to
    register at once; Horovod's ``"dynamic"`` is accepted (process sets can be
    added and removed at any time anyway). Calling init() again with the same
    communicator does nothing.
    """
    if isinstance(process_sets, str):
        if process_sets != "dynamic":
            raise exceptions.InvalidArgumentError(
                f"init(process_sets={process_sets!r}): pass a list of ProcessSet or \"dynamic\"")
        process_sets = None
    with _state_lock:
        if lib.hvd_is_initialized():
            if comm is not None and _init_comm is not None and not _same_comm(comm, _init_comm):
                raise exceptions.InvalidArgumentError(
                    "hvdlite is already initialised with a different communicator; call "
                    "hvdlite.shutdown() before init() with another one")
        else:
            _start(comm)
    if process_sets:
        # Also on a repeated init(): its sets are registered (or found) and
        # bound, so a script can retry after a rejected list, as in Horovod.
        register_at_init(process_sets, _init_comm)


# Functions a framework adapter runs after every start of the engine (on
# every rank: they may be collective) and after every stop: the torch
# adapter's device executor lives and dies with the engine. After abandon()
# the abandon hook runs instead of the stop hook: a peer is gone, so it must
# not wait for anything that waits for one.
_start_hooks = []
_stop_hooks = []
_abandon_hooks = []


# Starts of the engine in this process: a handle belongs to the start it was
# issued in (handle ids start again with each start).
_engine_starts = 0


def engine_starts():
    """How many times this process has started the engine."""
    return _engine_starts


def add_engine_hooks(on_start, on_stop, on_abandon=None):
    if on_start not in _start_hooks:
        _start_hooks.append(on_start)
        _stop_hooks.append(on_stop)
        _abandon_hooks.append(on_abandon or on_stop)


def _start(comm):
    global _init_comm, _atexit_registered, _homogeneous, _engine_starts
    resolved = _resolve_comm(comm)
    check(lib.hvd_init(resolved.py2f()))
    _engine_starts += 1
    _init_comm = resolved
    global_process_set.mpi_comm = comm if hasattr(comm, "py2f") else None  # as Horovod: the one given
    _homogeneous = len(set(resolved.allgather(local_size()))) == 1
    if not _atexit_registered:
        # Registered after mpi4py's own exit hook, so it runs first: the
        # engine stops before MPI is finalised.
        atexit.register(_shutdown_at_exit)
        _install_excepthook()
        _install_exit_hook()
        _atexit_registered = True
    for hook in _start_hooks:
        hook()


def _same_comm(comm, current):
    MPI = _mpi()
    if isinstance(comm, (list, tuple)):
        # init(comm=[ranks]) built ``current`` from such a list: compare the
        # COMM_WORLD ranks, in order, without creating a communicator.
        world = current.Get_group().Translate_ranks(list(range(current.Get_size())),
                                                    MPI.COMM_WORLD.Get_group())
        return [int(r) for r in comm] == list(world)
    if not hasattr(comm, "py2f"):
        return False
    return MPI.Comm.Compare(comm, current) in (MPI.IDENT, MPI.CONGRUENT)


def _stop(reason):
    global _peer_lost
    kind = lib.hvd_shutdown(reason)
    if kind in PEER_LOST_KINDS:
        _peer_lost = True
    for hook in _stop_hooks:
        hook()


def shutdown():
    """Stops the engine on this rank; the other ranks' engines stop too, and
    their pending and future collectives fail with an error naming this rank."""
    _stop(b"called hvdlite.shutdown()")


def abandon(reason, grace_s=1.0):
    """Stops the engine on this rank alone, when a peer is lost and the
    survivors go on without it (docs/reliability.md, "Going on without a lost
    rank"). No other rank hears of it, and nothing here waits for one.

    Every pending collective, and every later one until the next
    :func:`init`, raises :class:`HvdliteShutdownError` whose message holds
    ``reason``. Safe from any thread (a watcher's, while the training thread
    waits in ``synchronize()``) and more than once (the first reason stays).
    Afterwards :func:`init` with the survivors' communicator starts a new
    engine; process sets added before must be added again (their
    :class:`ProcessSet` objects are unregistered here).

    Raises :class:`HvdliteTimeoutError` when the engine thread does not stop
    within ``grace_s`` seconds: it is stuck in an MPI call that waits for the
    lost peer, and this process must be restarted (``init()`` refuses; at
    exit the job ends with MPI_Abort instead of waiting in MPI_Finalize).
    """
    global _init_comm, _homogeneous, _peer_lost
    text = str(reason).encode(errors="replace")
    rc = lib.hvd_abandon(text, float(grace_s))
    error = last_error() if rc < 0 else None
    # What belonged to the old engine, reset, stuck or not: no call reaches
    # that engine again. An init() stuck in MPI may hold the lock for ever.
    locked = _state_lock.acquire(timeout=min(max(float(grace_s), 0.0), 1e7))
    try:
        _init_comm = None
        _homogeneous = None
        global_process_set.mpi_comm = None
        forget_registered_sets()
    finally:
        if locked:
            _state_lock.release()
    if error is not None:
        _peer_lost = True  # MPI_Finalize would wait for the stuck thread's peer
    for hook in _abandon_hooks:
        hook()
    if error is not None:
        raise error


def is_initialized():
    return bool(lib.hvd_is_initialized())


def _query(fn, what):
    value = fn()
    if value < 0:
        raise last_error()
    return value


def rank():
    """This process's rank among all ranks of the job."""
    return _query(lib.hvd_rank, "rank")


def size():
    return _query(lib.hvd_size, "size")


def local_rank():
    """Rank among the processes on this host."""
    return _query(lib.hvd_local_rank, "local_rank")


def local_size():
    return _query(lib.hvd_local_size, "local_size")


def cross_rank():
    """Index of this host among the hosts (ranks with the same local rank)."""
    return _query(lib.hvd_cross_rank, "cross_rank")


def cross_size():
    return _query(lib.hvd_cross_size, "cross_size")


def is_homogeneous():
    """True when every host runs the same number of ranks (Horovod's query)."""
    if not lib.hvd_is_initialized():
        raise exceptions.NotInitializedError(
            "is_homogeneous(): hvdlite is not initialised; call hvdlite.init() first")
    return bool(_homogeneous)


def mpi_threads_supported():
    return bool(lib.hvd_mpi_threads_supported())


def mpi_library_version():
    buf = ffi.new("char[]", 8192)
    lib.hvd_mpi_library_version(buf, 8192)
    return ffi.string(buf).decode(errors="replace").strip()


def _install_excepthook():
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        global _exit_reason, _exit_code
        _exit_code = None  # the process now exits with 1, whatever sys.exit saw before
        text = "".join(traceback.format_exception_only(exc_type, exc)).strip()
        _exit_reason = f"exited with an unhandled exception: {text}"
        # Traceback first: hvdrun stops the job once this rank's report is in,
        # so a report ahead of the traceback could cut the traceback off.
        previous(exc_type, exc, tb)
        try:
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        _report_failing(1, text)

    sys.excepthook = hook


def _report_failing(code, reason):
    """Tells hvdrun (when it started this rank) that this rank is failing."""
    global _reported
    if os.environ.get("HVDLITE_RANK_REPORTS") == "1":
        # hvdrun's rank wrapper reads this line to name the failing rank
        # even while MPI_Finalize keeps the process alive.
        line = json.dumps({"event": "failing", "code": code, "reason": reason})
        os.write(2, f"@hvdlite-ctl@ {line}\n".encode())
        _reported = True


def _install_exit_hook():
    """Wraps sys.exit so the other ranks learn this rank's exit code.

    A code passed to sys.exit is invisible to atexit handlers; raising
    SystemExit directly is not seen (the reason then says only "exited")."""
    original = sys.exit
    if getattr(original, "_hvdlite_wrapped", False):
        return

    def exit(status=None):
        global _exit_reason, _exit_code
        code = 0 if status is None else status if isinstance(status, int) else 1
        _exit_code = code
        _exit_reason = f"called sys.exit({status!r}) (exit code {code})"
        original(status)

    exit._hvdlite_wrapped = True
    exit.__doc__ = original.__doc__
    sys.exit = exit


def _shutdown_at_exit():
    reason = _exit_reason or "exited (its Python process ended)"
    if _exit_code:
        _report_failing(_exit_code, reason)
    _stop(reason.encode(errors="replace"))
    if _peer_lost:
        # A peer that stopped answering would keep MPI_Finalize (mpi4py's exit
        # hook, after this one) waiting forever: end the whole job instead.
        os.write(2, b"[hvdlite] a peer rank stopped answering; ending the job with MPI_Abort "
                    b"instead of waiting for it in MPI_Finalize\n")
        if os.environ.get("HVDLITE_RANK_REPORTS") == "1":
            # Under hvdrun, let the report reach it first: MPI_Abort kills the
            # rank wrappers that forward it. hvdrun stops the job on the report.
            if not _reported:
                _report_failing(_exit_code or 1, "lost contact with a peer rank (hvdlite timeout)")
            time.sleep(5)
        else:
            # MPI_Abort also ends the launcher's processes that forward this
            # rank's output; what it printed last (the error the user needs)
            # is lost if they have not read it yet, which a loaded host makes likely.
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError, AttributeError):
                    pass
            time.sleep(1.0)
        _mpi().COMM_WORLD.Abort(_exit_code or 1)
    if _mpi_started_here:
        from mpi4py import MPI
        if not MPI.Is_finalized():
            MPI.Finalize()
