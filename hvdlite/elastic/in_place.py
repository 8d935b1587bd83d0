"""``hvd.elastic.run`` under hvdrun's in-place recovery: survivors keep their process.

Every rank is its own MPI job; the job's communicator forms at hvdrun's
rendezvous (:mod:`hvdlite.rendezvous`), generation after generation. When a
member is lost, hvdrun's notice reaches every survivor's watch thread, which
abandons the rank's engine (:func:`hvdlite.abandon`: local, no
communication), so the training thread's collective raises
HvdliteShutdownError at once, wherever the dead rank was. ``run`` then does
what Horovod's elastic loop does after a reset, without a new process:
restore the last commit from this process's memory, join the next
generation, start an engine on its communicator, run the reset callbacks,
sync the state from the new rank 0 (a member of the previous generation:
hvdrun lists them first) and call the training function again.

Ranks that hvdrun starts for new hosts wait at the rendezvous. Survivors
learn of them from hvdrun's push, raise HostsUpdatedInterrupt at the same
commit, and join the next generation with them; the newcomers get the state
from the sync. Nothing goes through a disk.
"""
import sys
import threading
import time

from .. import basics, rendezvous
from . import worker
from .state import HostsUpdatedInterrupt

# How long the engine thread may take to stop after a notice. Longer means
# it is stuck inside MPI (a transfer to the dead peer that never returns):
# only a new process can go on then.
ABANDON_GRACE_S = 1.0

_notices_lock = threading.Lock()
_notices_installed = False


def _on_notice(reason):
    """The watch thread's callback: stop this rank's collectives now."""
    try:
        basics.abandon(reason, grace_s=ABANDON_GRACE_S)
    except Exception as e:  # noqa: BLE001 - any failure to stop leaves a restart as the way out
        worker.leave("the engine did not stop after the notice (%s)" % e)
        return
    rendezvous.watch().say_stopped()


def _install_notices():
    global _notices_installed
    with _notices_lock:
        if not _notices_installed:
            rendezvous.watch().on_notice = _on_notice
            _notices_installed = True


def rebuild(why):
    """Leaves the current generation and starts an engine on the next one;
    returns the seconds it took."""
    started = time.monotonic()
    if basics.is_initialized():
        try:
            basics.abandon(why, grace_s=ABANDON_GRACE_S)
        except Exception as e:  # noqa: BLE001
            worker.leave("the engine did not stop (%s)" % e)
    try:
        generation, comm = rendezvous.join()
    except (rendezvous.JobOverError, rendezvous.LeftOutError) as e:
        # hvdrun has decided (below --min-np, or this rank was left out): nothing to go on with.
        raise SystemExit("hvdlite elastic: %s" % e) from None
    basics.init(comm=comm)
    worker.start_generation(generation, rendezvous.current().hosts_version)
    took = time.monotonic() - started
    if basics.rank() == 0:
        sys.stderr.write("hvdlite elastic: generation %d, %d ranks, formed in place in %.3f s (%s)\n"
                         % (generation, basics.size(), took, why))
        sys.stderr.flush()
    return took


def _check_no_process_group():
    """A torch.distributed process group on the "hvdlite" backend belongs to
    the engine a rebuild abandons, and torch cannot re-create it under a
    running script: such scripts recover by restart."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        from ..exceptions import InvalidArgumentError
        raise InvalidArgumentError(
            "hvd.elastic.run under in-place recovery cannot rebuild torch.distributed's process "
            "group (backend %r); run this script with hvdrun --recovery restart"
            % dist.get_backend())


def run(func, state, ctx, peer_lost, args, kwargs):
    """Horovod's elastic loop: sync, train; rebuild in place; on a lost peer
    restore the last commit (on new hosts keep the state); reset; again."""
    _check_no_process_group()
    _install_notices()
    generation = rendezvous.current()
    if generation is not None:
        worker.start_generation(generation.number, generation.hosts_version)
    skip_sync = False
    while True:
        try:
            if not skip_sync:
                state.sync()
            result = func(state, *args, **kwargs)
            worker.finish(ctx)
            return result
        except HostsUpdatedInterrupt as e:
            skip_sync = e.skip_sync
            why, lost = "the hosts changed", False
        except Exception as e:  # noqa: BLE001 - re-raised unless a peer was lost
            why, lost = peer_lost(e), True
            if why is None:
                raise
            skip_sync = False
        rebuild(why)
        # After the rebuild: restoring re-splits the data for the new size.
        if lost:
            state.restore()
        state.on_reset()
