"""One rank of an in-place elastic job: its own ``mpiexec -n 1``.

Under in-place recovery each rank is a separate MPI job, so that a rank's
death ends only its own job (one hydra job for all ranks SIGKILLs the
survivors when one dies). A rank on another host is started as hvdrun starts
a whole job there: hydra's proxy over hvdrun's ssh. The rank runs under
rank_wrapper.py as usual, which prefixes its output with its uid and reports
how it ended.
"""

import os
import signal
import subprocess
import sys
import time

from .hosts import Host, is_local
from .job import _launcher_setup, kill_leftovers
from .mpi_command import LaunchSpec, build_command
from .output import LineSplitter


class RankProcess:
    def __init__(self, uid, host, mpi, opts, env, ssh_script):
        self.uid = uid
        self.host = host
        local = is_local(host)
        spec = LaunchSpec(1, opts.command, sys.executable,
                          hosts=None if local else [Host(host, 1)],
                          ssh_script=None if local else ssh_script,
                          interfaces=opts.network_interfaces, env=env, mpi_args=opts.mpi_args)
        self.argv, self.launcher_env = build_command(mpi, spec)
        self.proc = None
        self.splitters = {}         # pipe -> (LineSplitter, stream name)
        self.started_at = None      # monotonic time of the start
        self.pid = None             # the rank's pid, from the wrapper's start report (on its host)
        self.failing = None         # the reason of the rank's "failing" report
        self.ended = None           # (exit code, signal or None, how) once it ended
        self.stop_reason = None     # why hvdrun stops it (left out, host removed, job over)
        self.stopped_at = None
        self.killed = False
        self.reaped = False         # what its mpiexec left behind was killed

    def start(self):
        env = dict(os.environ)
        env.update(self.launcher_env)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, start_new_session=True,
                                     preexec_fn=_launcher_setup)
        self.started_at = time.monotonic()
        for pipe, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            os.set_blocking(pipe.fileno(), False)
            self.splitters[pipe] = (LineSplitter(), name)

    @property
    def running(self):
        """Not ended, and not being stopped by hvdrun."""
        return self.ended is None and self.stop_reason is None

    def stop(self, reason, sig=signal.SIGTERM):
        """Ask the rank to end: mpiexec passes the signal on to it (``sig``
        None: the rank was told otherwise; hvdrun's timers kill it later if
        it does not end)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self.stopped_at = time.monotonic()
        if sig is not None:
            self.signal(sig)

    def signal(self, sig):
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def reap(self):
        """Once its mpiexec has ended, kill what is left of its process group."""
        if not self.reaped and self.proc is not None and self.proc.poll() is not None:
            self.reaped = True
            kill_leftovers(self.proc)

    def kill(self):
        """SIGKILL mpiexec: its proxies end, and the rank with its wrapper."""
        self.killed = True
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
