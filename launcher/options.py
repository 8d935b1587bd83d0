"""hvdrun's command line.  Flags keep horovodrun's names where horovodrun has them."""

import argparse
import os
import shlex
import sys

from . import __version__
from .engine_env import engine_env, user_env
from .hosts import (HostsError, describe, parse_hostfile, parse_hosts_arg, scheduler_hostfile, slurm_np,
                    total_slots)

EPILOG = """\
examples:
  hvdrun -np 2 python train.py                      # two ranks on this machine
  hvdrun -np 8 -H node1:4,node2:4 python train.py   # two hosts over SSH
  hvdrun --hostfile hosts.txt python train.py       # lines 'node1 slots=4'
  hvdrun --check-build                              # what this install supports
see docs/launcher.md for SLURM, Kubernetes and troubleshooting"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One clear line instead of the full usage block, which buries the message.
        self.exit(2, "hvdrun: error: %s\n(see hvdrun --help)\n" % message)


def build_parser():
    p = _Parser(
        prog="hvdrun", allow_abbrev=False, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Launch an hvdlite (Horovod-style) training script on one or more hosts "
                    "through the installed MPI's launcher.")
    p.add_argument("-v", "--version", action="store_true",
                   help="print hvdrun's version and exit")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="show frameworks, MPI, GPU support and compressors of this install, and exit")
    p.add_argument("-np", "--num-proc", dest="np", type=int, metavar="N",
                   help="number of ranks (default: all slots of -H/--hostfile, or $SLURM_NTASKS)")

    g = p.add_argument_group("hosts")
    g.add_argument("-H", "--hosts", dest="hosts_text", metavar="HOST[:SLOTS],...",
                   help="hosts and their slots, e.g. node1:4,node2:4 (slots default to 1); "
                        "without -H/--hostfile ranks run on this machine")
    g.add_argument("-hostfile", "--hostfile", metavar="FILE",
                   help="file with one host per line: 'host slots=N' or 'host:N'")
    g.add_argument("-p", "--ssh-port", type=int, metavar="PORT", help="SSH port of every host")
    g.add_argument("-i", "--ssh-identity-file", metavar="FILE", help="SSH private key to use")
    g.add_argument("--ssh-connect-timeout", type=float, default=3.0, metavar="SECONDS",
                   help="give up on a host that does not answer within this time (default 3)")
    g.add_argument("--start-timeout", type=float, metavar="SECONDS",
                   default=float(os.environ.get("HOROVOD_START_TIMEOUT", 30)),
                   help="stop if not every rank has started within this time (default 30)")
    g.add_argument("--network-interface", "--network-interfaces", dest="network_interface",
                   metavar="NIC[,NIC]", help="network interface(s) for MPI and its launcher, e.g. eth0")

    g = p.add_argument_group("elastic jobs (docs/elastic.md): keep training while hosts fail, leave or join")
    g.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, metavar="N",
                   help="elastic: the fewest ranks to train with (default: -np, or 1)")
    g.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, metavar="N",
                   help="elastic: the most ranks to use when more slots are available (default: all)")
    g.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int, metavar="N",
                   help="elastic: slots of a discovered host that the script lists without ':SLOTS' "
                        "(default 1)")
    g.add_argument("--host-discovery-script", metavar="SCRIPT",
                   help="elastic: a command printing the usable hosts, one HOST[:SLOTS] per line; "
                        "hvdrun runs it every second")
    g.add_argument("--elastic-timeout", type=float, metavar="SECONDS",
                   default=float(os.environ.get("HOROVOD_ELASTIC_TIMEOUT", 600)),
                   help="elastic: give up when fewer than --min-np slots are usable this long "
                        "(default 600)")
    g.add_argument("--reset-limit", type=int, metavar="N",
                   help="elastic: give up after N restarts (default: no limit)")
    g.add_argument("--blacklist-cooldown-range", type=float, nargs=2, metavar=("MIN", "MAX"),
                   help="elastic: a failed host may return after MIN seconds, doubling with each "
                        "failure up to MAX (default: a failed host never returns)")
    g.add_argument("--recovery", choices=["auto", "in-place", "restart"],
                   help="elastic: after a lost rank, in-place: the survivors keep their processes "
                        "and form a new communicator; restart: every rank starts again; auto (the "
                        "default): in-place where the MPI is MPICH with the ofi netmod, else restart")

    g = p.add_argument_group("ranks' environment and output")
    g.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="set NAME in every rank (VALUE defaults to hvdrun's own); repeatable")
    g.add_argument("--output-filename", metavar="DIR",
                   help="also write each rank's output to DIR/rank.N/stdout and stderr")
    g.add_argument("--verbose", action="store_true",
                   help="print the SSH checks and the MPI command hvdrun runs")
    g.add_argument("--mpi-args", default="", metavar='"ARGS"',
                   help="extra arguments for mpiexec/mpirun, as one quoted string")

    g = p.add_argument_group("engine settings (become HVDLITE_* variables in every rank)")
    g.add_argument("--fusion-threshold-mb", type=float, metavar="MB",
                   help="fuse tensors into buffers up to this size (HVDLITE_FUSION_THRESHOLD)")
    g.add_argument("--cycle-time-ms", type=float, metavar="MS",
                   help="engine cycle time (HVDLITE_CYCLE_TIME)")
    g.add_argument("--hierarchical-allreduce", dest="hierarchical_allreduce", action="store_true",
                   default=None, help="between hosts with several ranks each: reduce inside each host, "
                                      "ring between hosts (the default there; HVDLITE_HIERARCHICAL_ALLREDUCE)")
    g.add_argument("--no-hierarchical-allreduce", dest="hierarchical_allreduce", action="store_false",
                   help="one MPI allreduce through every rank instead (HVDLITE_HIERARCHICAL_ALLREDUCE=0)")
    g.add_argument("--hierarchical-allgather", dest="hierarchical_allgather", action="store_true",
                   default=None, help="where the allreduce is hierarchical: gather across hosts by local "
                                      "rank, then inside each host (the default there; "
                                      "HVDLITE_HIERARCHICAL_ALLGATHER)")
    g.add_argument("--no-hierarchical-allgather", dest="hierarchical_allgather", action="store_false",
                   help="one MPI allgather through every rank instead (HVDLITE_HIERARCHICAL_ALLGATHER=0)")
    g.add_argument("--autotune", action="store_true", default=None,
                   help="tune the fusion threshold and cycle time during the first steps and keep the "
                        "fastest (HVDLITE_AUTOTUNE=1; docs/engine.md#autotune)")
    g.add_argument("--autotune-log-file", metavar="FILE",
                   help="rank 0 writes every autotune sample here, as CSV (HVDLITE_AUTOTUNE_LOG)")
    g.add_argument("--autotune-warmup-samples", type=int, metavar="N",
                   help="samples discarded before tuning starts (HVDLITE_AUTOTUNE_WARMUP_SAMPLES, default 3)")
    g.add_argument("--autotune-steps-per-sample", type=int, metavar="N",
                   help="training steps per sample (HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE, default 10)")
    g.add_argument("--autotune-samples-per-setting", type=int, metavar="N",
                   help="scored samples per candidate setting (HVDLITE_AUTOTUNE_SAMPLES_PER_SETTING, default 2)")
    g.add_argument("--cache-capacity", type=int, metavar="N",
                   help="response cache entries (HVDLITE_CACHE_CAPACITY)")
    g.add_argument("--engine-priority", choices=["auto", "normal", "batch", "idle"],
                   help="scheduling of each rank's engine thread; auto (the default): idle where the "
                        "job runs on one host whose cores its compute threads fill, else normal "
                        "(HVDLITE_ENGINE_PRIORITY)")
    g.add_argument("--engine-affinity", choices=["auto", "follow", "none"],
                   help="cores of each rank's engine thread; follow: the core of the thread waiting "
                        "for its results; auto (the default): follow where the engine runs at idle "
                        "priority and the steps measure faster so (HVDLITE_ENGINE_AFFINITY)")
    g.add_argument("--timeline-filename", metavar="FILE",
                   help="write a Chrome trace timeline; %%r becomes the rank (HVDLITE_TIMELINE)")
    g.add_argument("--timeline-mark-cycles", dest="timeline_mark_cycles", action="store_true",
                   default=None, help="mark engine cycles in the timeline "
                                      "(HVDLITE_TIMELINE_MARK_CYCLES=1)")
    g.add_argument("--no-timeline-mark-cycles", dest="timeline_mark_cycles",
                   action="store_false", help=argparse.SUPPRESS)
    g.add_argument("--no-stall-check", action="store_true",
                   help="disable the stall check (HVDLITE_STALL_CHECK_DISABLE=1)")
    g.add_argument("--stall-check", dest="no_stall_check", action="store_false",
                   help=argparse.SUPPRESS)  # horovodrun's explicit "on" (the default)
    g.add_argument("--stall-check-warning-time-seconds", type=int, metavar="S",
                   help="warn about ranks that stall longer (HVDLITE_STALL_CHECK_TIME_SECONDS)")
    g.add_argument("--stall-check-shutdown-time-seconds", type=int, metavar="S",
                   help="stop the job after a stall this long (HVDLITE_STALL_SHUTDOWN_TIME_SECONDS)")

    g = p.add_argument_group("horovodrun flags accepted for command-line compatibility")
    g.add_argument("--disable-cache", action="store_true",
                   help="accepted; hvdrun keeps no cache of its start-up checks")
    g.add_argument("--mpi", action="store_true", help="accepted; hvdrun always runs on MPI")
    g.add_argument("--autotune-bayes-opt-max-samples", type=int, metavar="N",
                   help="accepted; hvdlite's autotune searches one setting at a time, without "
                        "Bayesian optimisation (see --autotune-samples-per-setting)")
    g.add_argument("--autotune-gaussian-process-noise", type=float, metavar="X",
                   help="accepted; see --autotune-bayes-opt-max-samples")
    g.add_argument("--gloo", action="store_true", help=argparse.SUPPRESS)

    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                   help="the program every rank runs, e.g. python train.py --epochs 3")
    return p


def parse_args(argv=None):
    """Parse and validate; on a user error print a clear message and exit with 2."""
    parser = build_parser()
    opts = parser.parse_args(argv)
    if opts.version or opts.check_build:
        return opts
    if opts.command and opts.command[0] == "--":
        opts.command = opts.command[1:]
    if not opts.command:
        parser.error("no command given (e.g. hvdrun -np 2 python train.py)")

    return _validate(parser, opts)


def _validate(parser, opts):
    if opts.gloo:
        parser.error("--gloo: hvdlite runs on MPI only (MPICH or Open MPI); drop the flag")
    opts.hosts = None
    hosts_text = opts.hosts_text
    if opts.hostfile and hosts_text:
        parser.error("give -H or --hostfile, not both")
    if hosts_text is None and not opts.hostfile and not os.environ.get("SLURM_JOB_ID"):
        # A Kubeflow MPIJob's launcher: its hostfile, as the MPI launcher would take it.
        found = scheduler_hostfile()
        if found:
            opts.hostfile = found[1]
    try:
        if hosts_text is not None:
            opts.hosts = parse_hosts_arg(hosts_text)
        elif opts.hostfile:
            opts.hosts = parse_hostfile(opts.hostfile)
    except HostsError as e:
        parser.error(str(e))

    opts.elastic = bool(opts.host_discovery_script or opts.min_np is not None or opts.max_np is not None)
    if opts.elastic:
        _validate_elastic(parser, opts)
    elif opts.recovery is not None:
        parser.error("--recovery is for elastic jobs (--min-np, --max-np or --host-discovery-script)")
    elif opts.np is None:
        if opts.hosts:
            opts.np = total_slots(opts.hosts)
        else:
            opts.np = slurm_np()
            if opts.np is None:
                parser.error("-np is required when no -H/--hostfile is given")
    if opts.np is not None and opts.np < 1:
        parser.error("-np must be at least 1, got %d" % opts.np)
    if opts.hosts and not opts.elastic and opts.np > total_slots(opts.hosts):
        parser.error("-np %d is more than the %d slots of %s (%s); add slots or lower -np"
                     % (opts.np, total_slots(opts.hosts),
                        "-H" if hosts_text is not None else "hostfile", describe(opts.hosts)))

    if opts.ssh_identity_file:
        if not os.path.isfile(opts.ssh_identity_file):
            parser.error("-i %s: no such key file" % opts.ssh_identity_file)
        opts.ssh_identity_file = os.path.abspath(opts.ssh_identity_file)
    if opts.ssh_port is not None and not 0 < opts.ssh_port < 65536:
        parser.error("-p %d: not a TCP port" % opts.ssh_port)
    if opts.ssh_connect_timeout <= 0:
        parser.error("--ssh-connect-timeout must be positive")
    if opts.start_timeout <= 0:
        parser.error("--start-timeout must be positive")
    if opts.fusion_threshold_mb is not None and opts.fusion_threshold_mb < 0:
        parser.error("--fusion-threshold-mb must not be negative")
    for flag in ("autotune_warmup_samples", "autotune_steps_per_sample", "autotune_samples_per_setting"):
        value = getattr(opts, flag)
        if value is not None and value < (0 if flag == "autotune_warmup_samples" else 1):
            parser.error("--%s must be at least %d" % (flag.replace("_", "-"),
                                                       0 if flag == "autotune_warmup_samples" else 1))
    if opts.cycle_time_ms is not None and opts.cycle_time_ms <= 0:
        parser.error("--cycle-time-ms must be positive")
    if opts.cache_capacity is not None and opts.cache_capacity < 0:
        parser.error("--cache-capacity must not be negative")

    opts.network_interfaces = []
    if opts.network_interface is not None:
        opts.network_interfaces = [n.strip() for n in opts.network_interface.split(",") if n.strip()]
        if not opts.network_interfaces:
            parser.error("--network-interface: no interface name given")
    try:
        opts.mpi_args = shlex.split(opts.mpi_args)
    except ValueError as e:
        parser.error("--mpi-args: %s" % e)
    try:
        opts.rank_env = user_env(opts.env)
    except ValueError as e:
        parser.error(str(e))
    opts.rank_env.update(engine_env(opts))
    if opts.output_filename:
        opts.output_filename = os.path.abspath(opts.output_filename)
    return opts


def _validate_elastic(parser, opts):
    if not opts.host_discovery_script and not opts.hosts:
        parser.error("an elastic job (--min-np/--max-np) needs its hosts: --host-discovery-script, "
                     "-H or --hostfile")
    if opts.host_discovery_script and opts.hosts:
        parser.error("give --host-discovery-script or -H/--hostfile, not both")
    if opts.min_np is None:
        opts.min_np = opts.np if opts.np is not None else 1
    if opts.min_np < 1:
        parser.error("--min-np must be at least 1, got %d" % opts.min_np)
    if opts.max_np is None and opts.np is not None and opts.host_discovery_script is None:
        opts.max_np = opts.np
    if opts.max_np is not None and opts.max_np < opts.min_np:
        parser.error("--max-np %d is less than --min-np %d" % (opts.max_np, opts.min_np))
    if opts.slots_per_host is not None and opts.slots_per_host < 1:
        parser.error("--slots-per-host must be at least 1")
    if opts.elastic_timeout <= 0:
        parser.error("--elastic-timeout must be positive")
    if opts.reset_limit is not None and opts.reset_limit < 0:
        parser.error("--reset-limit must not be negative")
    if opts.blacklist_cooldown_range is not None:
        lo, hi = opts.blacklist_cooldown_range
        if not 0 <= lo <= hi:
            parser.error("--blacklist-cooldown-range MIN MAX needs 0 <= MIN <= MAX")
    if opts.hosts and opts.min_np > total_slots(opts.hosts):
        parser.error("--min-np %d is more than the %d slots of %s" % (opts.min_np, total_slots(opts.hosts),
                                                                      describe(opts.hosts)))
    if opts.np is None:
        opts.np = opts.min_np
    if opts.recovery is None:
        opts.recovery = "auto"


def version_text():
    return "hvdrun (hvdlite) %s, Python %s" % (__version__, sys.version.split()[0])
