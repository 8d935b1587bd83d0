"""A torch.distributed store for a job that MPI launched (hvdrun, mpiexec).

torch.distributed needs a key-value store shared by all ranks (new groups,
gloo groups beside hvdlite's, barriers on the store). Under MPI the ranks
already know each other, so nothing needs to be configured: rank 0 opens a
TCPStore on a free port and tells the others where through hvdlite's own
broadcast. The torch device executor (device.py) and the c10d backend
(c10d.py) both get their store here.

:func:`install_env_fallback` extends torch's ``env://`` rendezvous (the
default of ``init_process_group``): in a job MPI launched where RANK,
WORLD_SIZE, MASTER_ADDR or MASTER_PORT is not set, it takes rank and size
from MPI and this store instead of failing on the missing variable. Where
they are all set (torchrun, a script that sets them) torch's own rendezvous
runs unchanged.
"""
import importlib
import os
import socket
from datetime import timedelta

import torch.distributed as dist

from hvdlite import basics
from hvdlite.objects import broadcast_object

# What MPI launchers (MPICH's hydra, Open MPI, PMIx) set in every rank;
# hvdrun starts its ranks through one of them.
LAUNCHER_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_by_mpi(env=None):
    env = os.environ if env is None else env
    return any(env.get(var, "").isdigit() for var in LAUNCHER_RANK_VARS)


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


def _wants_mpi(url):
    """env:// without some variable it needs, in a job MPI launched (a URL
    that gives rank or world_size itself is torch's own business)."""
    if not launched_by_mpi() or "?" in url:
        return False
    return any(not os.environ.get(var) for var in ENV_VARS)


def _export_layout():
    """What torchrun would have set, for scripts that read it (device
    selection from LOCAL_RANK, logging from RANK); values already set stay."""
    for var, value in (("RANK", basics.rank()), ("WORLD_SIZE", basics.size()),
                       ("LOCAL_RANK", basics.local_rank()),
                       ("LOCAL_WORLD_SIZE", basics.local_size())):
        os.environ.setdefault(var, str(value))


def _with_mpi_fallback(env_handler):
    def handler(url, timeout=timedelta(minutes=30), **kwargs):
        if not _wants_mpi(url):
            yield from env_handler(url, timeout=timeout, **kwargs)
            return
        basics.init()
        store = mpi_tcp_store(timeout, name="hvdlite.torch.env_rendezvous")
        _export_layout()
        yield store, basics.rank(), basics.size()
        raise RuntimeError("Unable to perform re-rendezvous using env:// (from MPI)")
    handler.hvdlite_mpi_fallback = True
    return handler


def install_env_fallback():
    """Makes ``env://`` take what it lacks from MPI in a job MPI launched
    (torch has no public way to extend a registered scheme: its table of
    handlers is replaced in place, once)."""
    # (torch.distributed.rendezvous the attribute is a function of that module)
    module = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(module, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict) or "env" not in handlers:
        return False  # another torch: its own env:// stays, RANK etc. must be set
    if not getattr(handlers["env"], "hvdlite_mpi_fallback", False):
        handlers["env"] = _with_mpi_fallback(handlers["env"])
    return True
