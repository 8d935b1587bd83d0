"""Build the MPI launcher command line: MPICH's hydra ``mpiexec`` or Open MPI's ``mpirun``.

Both start ``python -S rank_wrapper.py -- CMD ...`` on every slot; what differs is
how hosts, SSH, environment and network interfaces are spelled.
"""

import os
import re

from .mpi_detect import MPICH, OPENMPI

WRAPPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_wrapper.py")

# Variables that describe the launching host or session, or belong to the MPI
# runtime itself: forwarding them to other hosts would be wrong (Open MPI only;
# hydra forwards the environment itself and knows what to leave out).
_NOT_FORWARDED = {"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "DISPLAY", "TERM", "TERMCAP",
                  "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK",
                  "XDG_RUNTIME_DIR", "XDG_SESSION_ID", "LS_COLORS", "PS1"}
_NOT_FORWARDED_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "OPAL_", "BASH_FUNC_")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class LaunchSpec:
    """Everything the command depends on, already validated."""

    def __init__(self, np, command, python, hosts=None, ssh_script=None, interfaces=(),
                 env=None, mpi_args=(), cpu_count=None, is_root=None):
        self.np = np
        self.command = list(command)
        self.python = python                 # interpreter that runs the wrapper on every host
        self.hosts = hosts                   # [Host] or None for "local / the allocation's hosts"
        self.ssh_script = ssh_script         # executable the MPI launcher uses instead of ssh
        self.interfaces = list(interfaces)
        self.env = dict(env or {})           # variables every rank must see
        self.mpi_args = list(mpi_args)
        self.cpu_count = cpu_count or os.cpu_count() or 1
        self.is_root = os.geteuid() == 0 if is_root is None else is_root


def interface_env(interfaces, environ):
    """Variables that make the data path follow --network-interface too.

    The launchers' own flags only steer their control traffic and MPI's TCP
    transport; UCX (MPICH's ch4:ucx), NCCL and Gloo pick devices themselves
    (the engine's ring sockets: engine_env).  A value the user set already wins.
    """
    if not interfaces:
        return {}
    env = {}
    for var in ("UCX_NET_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if var not in environ:
            env[var] = ",".join(interfaces)
    return env


def _rank_argv(spec):
    return [spec.python, "-S", WRAPPER, "--"] + spec.command


def hydra_command(mpiexec, spec):
    argv = [mpiexec, "-n", str(spec.np)]
    if spec.hosts:
        argv += ["-hosts", ",".join("%s:%d" % (h.name, h.slots) for h in spec.hosts)]
        # hydra starts its proxies with "<launcher-exec> -x HOST CMD"; it forks
        # instead for hosts it recognises as local.
        argv += ["-launcher", "ssh", "-launcher-exec", spec.ssh_script]
    if spec.interfaces:
        argv += ["-iface", spec.interfaces[0]]      # hydra takes one interface
    for name, value in sorted(spec.env.items()):
        argv += ["-genv", name, value]
    return argv + spec.mpi_args + _rank_argv(spec), {}


def openmpi_command(mpirun, spec, environ=None):
    environ = os.environ if environ is None else environ
    launcher_env = {}
    # Ranks run a background engine thread: binding each rank to one core
    # (Open MPI's default for np <= 2) would make it fight the compute thread.
    argv = [mpirun, "-np", str(spec.np), "--bind-to", "none"]
    if spec.is_root:
        # Open MPI refuses to run as root unless told twice (flag for 4.x, env for 5.x).
        argv += ["--allow-run-as-root"]
        launcher_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if spec.hosts:
        argv += ["--host", ",".join("%s:%d" % (h.name, h.slots) for h in spec.hosts)]
        # 4.x reads plm_rsh_agent, 5.x (PRRTE) plm_ssh_agent; unknown names are ignored.
        launcher_env.update(OMPI_MCA_plm_rsh_agent=spec.ssh_script,
                            PRTE_MCA_plm_ssh_agent=spec.ssh_script)
    elif spec.np > spec.cpu_count:
        # Without a host list Open MPI counts one slot per core.
        argv += ["--oversubscribe"]
    if spec.interfaces:
        ifs = ",".join(spec.interfaces)
        argv += ["--mca", "btl_tcp_if_include", ifs, "--mca", "oob_tcp_if_include", ifs]
    for name, value in sorted(spec.env.items()):
        argv += ["-x", "%s=%s" % (name, value)]
    # mpirun, unlike hydra, forwards only what it is told to: pass the
    # launching environment on, as hydra (and horovodrun) do.
    for name in sorted(environ):
        if name in spec.env or name in _NOT_FORWARDED or not _NAME.match(name) \
                or name.startswith(_NOT_FORWARDED_PREFIXES):
            continue
        argv += ["-x", name]
    return argv + spec.mpi_args + _rank_argv(spec), launcher_env


def build_command(mpi, spec, environ=None):
    """Return (argv, extra variables for the launcher process itself)."""
    if mpi.flavour == MPICH:
        return hydra_command(mpi.mpiexec, spec)
    if mpi.flavour == OPENMPI:
        return openmpi_command(mpi.mpiexec, spec, environ)
    raise ValueError("unknown MPI flavour %r" % mpi.flavour)
