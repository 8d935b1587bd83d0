"""hvdlite_torch_plugin: what ``import torch`` runs of hvdlite. torch loads the
entry points of group "torch.backends" when it is imported (setup.py names
:func:`autoload` there), so a DDP script can say
``init_process_group(backend="hvdlite")`` with no ``import hvdlite.torch``.

A package of its own, outside ``hvdlite``: importing ``hvdlite`` loads the
engine's binding, which every ``import torch`` should not pay.

This module must stay cheap and must never fail: it runs inside every
``import torch`` of the environment (torch turns an exception here into a
failed import; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns the loading off).
It imports nothing of hvdlite; the engine and ``hvdlite.torch`` load when a
group of the backend is made, or when ``env://`` needs MPI's world.
"""
import os

BACKEND = "hvdlite"

# What MPI launchers (MPICH's hydra, Open MPI, PMIx) set in every rank;
# hvdrun starts its ranks through one of them.
LAUNCHER_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
# What torch's env:// rendezvous reads.
ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_by_mpi(env=None):
    env = os.environ if env is None else env
    return any(env.get(var, "").isdigit() for var in LAUNCHER_RANK_VARS)


def wants_mpi(url):
    """env:// without some variable it needs, in a job MPI launched (a URL
    that gives rank or world_size itself is torch's own business)."""
    if not launched_by_mpi() or "?" in url:
        return False
    return any(not os.environ.get(var) for var in ENV_VARS)


def _create_process_group(backend_options, pg_options=None):
    from hvdlite.torch import c10d   # the engine loads here, with the first group
    c10d.register()
    return c10d.create_process_group(backend_options, pg_options)


def _env_handler(torch_env):
    """torch's env:// handler that, in a job MPI launched with some variable
    missing, hands over to hvdlite's (hvdlite/torch/rendezvous.py)."""
    def handler(url, timeout=None, **kwargs):
        if wants_mpi(url):
            from hvdlite.torch import rendezvous
            yield from rendezvous.env_from_mpi(url, timeout)
            return
        if timeout is not None:
            kwargs["timeout"] = timeout
        yield from torch_env(url, **kwargs)
    handler.hvdlite_mpi_fallback = True
    handler.hvdlite_torch_env = torch_env
    return handler


def install_env_fallback():
    """Makes ``env://`` take what it lacks from MPI in a job MPI launched
    (torch has no public way to extend a registered scheme: its table of
    handlers is replaced in place, once); returns whether it could."""
    import importlib
    # (torch.distributed.rendezvous the attribute is a function of that module)
    module = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(module, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict) or "env" not in handlers:
        return False  # another torch: its own env:// stays, RANK etc. must be set
    if not getattr(handlers["env"], "hvdlite_mpi_fallback", False):
        handlers["env"] = _env_handler(handlers["env"])
    return True


def register_backend():
    """Registers the "hvdlite" backend with torch.distributed (once) and lets
    ``env://`` take what it lacks from MPI (``import hvdlite.torch`` calls it)."""
    import torch.distributed as dist
    if not dist.is_available():
        return
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create_process_group, extended_api=True,
                                      devices=["cpu", "cuda"])
    install_env_fallback()


def autoload():
    """torch's entry point: :func:`register_backend`, never failing."""
    try:
        register_backend()
    except Exception:  # noqa: BLE001 - an exception here would fail `import torch`
        pass
