"""A torch.distributed store for a job that MPI launched (hvdrun, mpiexec).

torch.distributed needs a key-value store shared by all ranks (new groups,
gloo groups beside hvdlite's, barriers on the store). Under MPI the ranks
already know each other, so nothing needs to be configured: rank 0 opens a
TCPStore on a free port and tells the others where through hvdlite's own
broadcast. The torch device executor (device.py) and the c10d backend
(c10d.py) both get their store here.

``hvdlite_torch_plugin.install_env_fallback`` extends torch's ``env://``
rendezvous (the default of ``init_process_group``) with :func:`env_from_mpi`:
in a job MPI launched where RANK,
WORLD_SIZE, MASTER_ADDR or MASTER_PORT is not set, it takes rank and size
from MPI and this store instead of failing on the missing variable. Where
they are all set (torchrun, a script that sets them) torch's own rendezvous
runs unchanged.
"""
import os
import socket
from datetime import timedelta

import torch.distributed as dist

from hvdlite import basics
from hvdlite.objects import broadcast_object


STALL_SHUTDOWN_VAR = "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS"


def start_engine(timeout):
    """Starts hvdlite for torch.distributed, whose default group has
    ``timeout`` (a timedelta, or None)."""
    if not basics.is_initialized() and timeout is not None and STALL_SHUTDOWN_VAR not in os.environ:
        # torch's promise: a collective that waits past the group's timeout
        # fails. DDP's collectives complete through futures, which no wait()
        # bounds; the engine's stall inspector ends such a wait on every rank.
        os.environ[STALL_SHUTDOWN_VAR] = "%g" % max(1.0, timeout.total_seconds())
    basics.init()


def mpi_tcp_store(timeout=timedelta(seconds=60), name="hvdlite.torch.store"):
    """A TCPStore shared by every rank of hvdlite's world (collective:
    hvdlite.init() first). Returns the store; rank 0 holds its server."""
    size = basics.size()
    local_job = basics.local_size() == size
    host = "127.0.0.1" if local_job else socket.gethostbyname(socket.gethostname())
    store = None
    if basics.rank() == 0:
        store = dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False,
                              timeout=timeout)
        address = (host, store.port)
    else:
        address = None
    host, port = broadcast_object(address, root_rank=0, name=name)
    if store is None:
        store = dist.TCPStore(host, port, size, is_master=False, timeout=timeout)
    return store


def _export_layout():
    """What torchrun would have set, for scripts that read it (device
    selection from LOCAL_RANK, logging from RANK); values already set stay."""
    for var, value in (("RANK", basics.rank()), ("WORLD_SIZE", basics.size()),
                       ("LOCAL_RANK", basics.local_rank()),
                       ("LOCAL_WORLD_SIZE", basics.local_size())):
        os.environ.setdefault(var, str(value))


def env_from_mpi(url, timeout=None):
    """env:// in a job MPI launched that lacks some variable it reads
    (hvdlite_torch_plugin.wants_mpi): rank and size from MPI, the store from
    :func:`mpi_tcp_store`."""
    timeout = timeout or timedelta(minutes=30)
    start_engine(timeout)
    store = mpi_tcp_store(timeout, name="hvdlite.torch.env_rendezvous")
    _export_layout()
    yield store, basics.rank(), basics.size()
    raise RuntimeError(f"Unable to perform re-rendezvous using {url} (from MPI)")

