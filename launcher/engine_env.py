"""hvdrun's tuning flags -> the HVDLITE_* variables every rank reads at hvdlite.init()."""

import os


def engine_env(opts):
    """Return {NAME: value} for the engine settings given on the command line.

    Only flags the user gave are turned into variables, so a value already in the
    environment (or the engine's default) is not overridden by an hvdrun default.
    """
    env = {}
    if opts.fusion_threshold_mb is not None:
        env["HVDLITE_FUSION_THRESHOLD"] = str(int(opts.fusion_threshold_mb * 1024 * 1024))
    if opts.cycle_time_ms is not None:
        env["HVDLITE_CYCLE_TIME"] = repr(float(opts.cycle_time_ms))
    if opts.hierarchical_allreduce is not None:
        env["HVDLITE_HIERARCHICAL_ALLREDUCE"] = "1" if opts.hierarchical_allreduce else "0"
    if opts.hierarchical_allgather is not None:
        env["HVDLITE_HIERARCHICAL_ALLGATHER"] = "1" if opts.hierarchical_allgather else "0"
    if opts.autotune:
        env["HVDLITE_AUTOTUNE"] = "1"
    if opts.autotune_log_file is not None:
        env["HVDLITE_AUTOTUNE_LOG"] = os.path.abspath(opts.autotune_log_file)
    for flag in ("warmup_samples", "steps_per_sample", "samples_per_setting"):
        value = getattr(opts, "autotune_" + flag)
        if value is not None:
            env["HVDLITE_AUTOTUNE_" + flag.upper()] = str(value)
    if opts.cache_capacity is not None:
        env["HVDLITE_CACHE_CAPACITY"] = str(opts.cache_capacity)
    if opts.engine_priority is not None:
        env["HVDLITE_ENGINE_PRIORITY"] = opts.engine_priority
    if opts.engine_affinity is not None:
        env["HVDLITE_ENGINE_AFFINITY"] = opts.engine_affinity
    if opts.timeline_filename is not None:
        # Ranks start in other working directories on other hosts: make it absolute.
        env["HVDLITE_TIMELINE"] = os.path.abspath(opts.timeline_filename)
    if opts.timeline_mark_cycles is not None:
        env["HVDLITE_TIMELINE_MARK_CYCLES"] = "1" if opts.timeline_mark_cycles else "0"
    if opts.no_stall_check:
        env["HVDLITE_STALL_CHECK_DISABLE"] = "1"
    if opts.stall_check_warning_time_seconds is not None:
        env["HVDLITE_STALL_CHECK_TIME_SECONDS"] = str(opts.stall_check_warning_time_seconds)
    if opts.stall_check_shutdown_time_seconds is not None:
        env["HVDLITE_STALL_SHUTDOWN_TIME_SECONDS"] = str(opts.stall_check_shutdown_time_seconds)
    # The ring's own sockets take the interfaces MPI is told to use, unless
    # the user named theirs (in hvdrun's environment or with --env), as the
    # other libraries' interface variables (mpi_command.interface_env).
    interfaces = getattr(opts, "network_interfaces", None)
    if interfaces and "HVDLITE_SOCKET_IFNAME" not in os.environ and not any(
            item.partition("=")[0] == "HVDLITE_SOCKET_IFNAME" for item in opts.env or ()):
        env["HVDLITE_SOCKET_IFNAME"] = ",".join(interfaces)
    return env


def user_env(items, environ=None):
    """``--env NAME=VALUE`` / ``--env NAME`` (value taken from hvdrun's environment)."""
    environ = os.environ if environ is None else environ
    env = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not name or not (name[0].isalpha() or name[0] == "_") or \
                not all(c.isalnum() or c == "_" for c in name):
            raise ValueError("--env %s: %r is not a valid variable name" % (item, name))
        if not sep:
            if name not in environ:
                raise ValueError("--env %s: %s is not set in hvdrun's environment "
                                 "(use --env %s=VALUE)" % (item, name, name))
            value = environ[name]
        env[name] = value
    return env
