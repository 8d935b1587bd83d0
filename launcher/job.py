"""Run one job: check hosts, start the MPI launcher, relay output, stop it cleanly.

hvdrun does not start ranks itself; MPI's launcher does.  What hvdrun adds is
bookkeeping the launchers lack: it knows from the rank wrappers' reports which
rank ended how, so it can stop the whole job as soon as one rank fails (hydra
keeps waiting for the others), name that rank and its host, and return its exit
code.

Stopping uses the launcher's own machinery first, then force:
  1. one signal to mpiexec/mpirun (SIGTERM after a rank failure, or the signal
     the user sent); the launcher forwards it to every rank on every host;
  2. after ESCALATE_S, or at a second Ctrl-C: SIGKILL to the launcher's process
     group.  Its remote proxies lose their connection and kill their ranks, and
     each rank wrapper's child dies with its parent (PR_SET_PDEATHSIG);
  3. after GIVE_UP_S hvdrun stops waiting and exits.
"""

import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .flight_report import FlightDumps, parse_flight_line
from .mpi_command import LaunchSpec, build_command, interface_env
from .mpi_detect import MpiNotFound, detect_mpi
from .output import AbortDetector, Echo, LineSplitter, RankFiles, is_rank_line, parse_report
from .ssh_check import SshOptions, check_hosts

ESCALATE_S = 3.0
GIVE_UP_S = 6.0
# How long a stop waits for the output of a rank that another rank's error
# names (its traceback may still be crossing from another host).
OUTPUT_GRACE_S = 1.0
_PR_SET_PDEATHSIG = 1

EXIT_LAUNCH_ERROR = 1           # hvdrun could not start the job (SSH check, no MPI, ...)
# An elastic rank leaves with this code to have hvdrun start the job again
# (hvdlite.elastic uses the same number; EX_TEMPFAIL: "try again").
EXIT_RESTART = 75
# After the first rank of an elastic job leaves for a restart, the others get
# this long to leave on their own before hvdrun stops them.
RESTART_GRACE_S = 1.0
# After a rank died without saying why (killed, or exited with an error and
# no report), the others get this long to dump their flight recorders
# (SIGUSR1, forwarded by the MPI launcher) before hvdrun stops them.
DUMP_GRACE_S = 1.5


def log(msg):
    sys.stderr.write("hvdrun: %s\n" % msg)
    sys.stderr.flush()


def _signal_name(num):
    try:
        return signal.Signals(num).name
    except ValueError:
        return "signal %d" % num


def _launcher_setup():
    """In mpiexec's child before exec: die if hvdrun dies (even by SIGKILL)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def kill_leftovers(launcher):
    """SIGKILL what is left of an ended launcher's process group (its own
    session): an ssh it started to a host whose link went down can outlive it
    by minutes, waiting for TCP to give up."""
    if launcher is not None and launcher.poll() is not None:
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def expected_hosts(hosts, np):
    """rank -> host the launcher will put it on (both fill hosts slot by slot, in order)."""
    where = {}
    rank = 0
    for h in hosts or ():
        for _ in range(h.slots):
            if rank < np:
                where[rank] = h.name
                rank += 1
    return where


class Job:
    def __init__(self, opts):
        self.opts = opts
        self.np = opts.np
        self.started = {}           # rank -> host, from the wrappers' "start" reports
        self.exits = {}             # rank -> (code, host)
        self.first_failure = None   # (rank, host, code, how it ended)
        self.aborts = AbortDetector()
        self.stop_reason = None     # why hvdrun began stopping the job
        self.user_signal = None
        self.stop_at = None
        self.stop_due = None        # a stop that waits for the blamed rank's own output
        self.stop_due_reason = None
        self.killed_at = None
        self.proc = None
        self.flight = FlightDumps()
        self.dump_from = None       # ranks asked for a dump, before the job stops
        self.lost = None            # (rank, how) of a rank that ended without saying why

    # ---- preparation ------------------------------------------------------------
    def _ssh_options(self):
        ssh = shutil.which("ssh")
        if ssh is None:
            raise LaunchError("ssh is not on PATH; install an SSH client (openssh-client)")
        return SshOptions(ssh, self.opts.ssh_port, self.opts.ssh_identity_file,
                          self.opts.ssh_connect_timeout)

    def _check_hosts(self, ssh):
        start = time.monotonic()
        results = check_hosts([h.name for h in self.opts.hosts], ssh, python=sys.executable)
        if self.opts.verbose:
            for r in results:
                log("ssh check %s: %s (%.2f s)" % (r.host, "local" if r.local else
                                                    ("ok" if r.ok else r.reason), r.seconds))
        bad = [r for r in results if not r.ok]
        for r in bad:
            log("cannot use host %s: %s" % (r.host, r.reason))
        if bad:
            raise LaunchError("%d of %d hosts failed the SSH check in %.1f s; nothing was started"
                              % (len(bad), len(results), time.monotonic() - start))

    # ---- running ----------------------------------------------------------------
    def run(self):
        try:
            mpi = detect_mpi(with_version=self.opts.verbose)
        except MpiNotFound as e:
            log(str(e))
            return EXIT_LAUNCH_ERROR
        with tempfile.TemporaryDirectory(prefix="hvdrun-") as tmp:
            try:
                argv, launcher_env = self._prepare(mpi, tmp)
            except LaunchError as e:
                log(str(e))
                return EXIT_LAUNCH_ERROR
            if self.opts.verbose:
                log("MPI: %s, %s (%s)" % (mpi.version or mpi.flavour, mpi.mpiexec, mpi.source))
                for k, v in sorted(launcher_env.items()):
                    log("launcher environment: %s=%s" % (k, v))
                log("running: %s" % " ".join(shlex.quote(a) for a in argv))
            return self._supervise(argv, launcher_env)

    def _prepare(self, mpi, tmp):
        opts = self.opts
        ssh_script = None
        if opts.hosts:
            ssh = self._ssh_options()
            if not getattr(opts, "skip_ssh_check", False):    # the elastic driver checked them
                self._check_hosts(ssh)
            ssh_script = os.path.join(tmp, "ssh")
            with open(ssh_script, "w") as f:
                f.write(ssh.wrapper_script())
            os.chmod(ssh_script, 0o700)
        env = dict(opts.rank_env)
        env.update(interface_env(opts.network_interfaces, os.environ))
        spec = LaunchSpec(self.np, opts.command, sys.executable, hosts=opts.hosts,
                          ssh_script=ssh_script, interfaces=opts.network_interfaces,
                          env=env, mpi_args=opts.mpi_args)
        return build_command(mpi, spec)

    def _supervise(self, argv, launcher_env):
        env = dict(os.environ)
        env.update(launcher_env)
        files = RankFiles(self.opts.output_filename) if self.opts.output_filename else None
        try:
            # Own session: a Ctrl-C in the terminal reaches hvdrun only, and hvdrun
            # decides how to stop the job (instead of every rank getting SIGINT at once).
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         env=env, start_new_session=True,
                                         preexec_fn=_launcher_setup)
        except OSError as e:
            log("cannot run %s: %s" % (argv[0], e.strerror))
            return EXIT_LAUNCH_ERROR
        old_handlers = {s: signal.signal(s, self._on_signal)
                        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        # SIGUSR1 to hvdrun: every rank dumps its flight recorder; the job goes on.
        old_handlers[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, lambda *_: self._ask_dumps())
        try:
            self._pump(files)
        finally:
            for s, h in old_handlers.items():
                signal.signal(s, h)
            if files:
                files.close()
        self._write_flight_report()
        return self._exit_code()

    def _ask_dumps(self):
        try:
            self.proc.send_signal(signal.SIGUSR1)   # hydra and mpirun pass it to every rank
        except ProcessLookupError:
            pass

    def _write_flight_report(self):
        # Lost: a rank that ended without saying why (a rank that reported its
        # own error is named by hvdrun's last line instead).
        declared = [self.lost] if self.lost else []
        self.flight.write_report(self.opts, declared, log)

    def _on_signal(self, sig, _frame):
        if self.user_signal is None:
            self.user_signal = sig
            self._begin_stop("stopped by %s" % _signal_name(sig), sig)
        else:
            self._kill_group()          # second Ctrl-C: no more waiting

    def _begin_stop(self, reason, sig=signal.SIGTERM):
        if self.stop_at is not None:
            return
        self.stop_reason = reason
        self.stop_at = time.monotonic()
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def _kill_group(self):
        if self.killed_at is None:
            self.killed_at = time.monotonic()
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _pump(self, files):
        out, err = Echo(1), Echo(2)
        sel = selectors.DefaultSelector()
        streams = {self.proc.stdout: (LineSplitter(), out), self.proc.stderr: (LineSplitter(), err)}
        for pipe in streams:
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ)
        begun = time.monotonic()
        while streams:
            for key, _ in sel.select(timeout=0.1):
                splitter, echo = streams[key.fileobj]
                try:
                    data = os.read(key.fileobj.fileno(), 65536)
                except BlockingIOError:
                    continue
                lines = splitter.feed(data) if data else splitter.rest()
                for line in lines:
                    self._line(line, echo, files)
                if not data:
                    sel.unregister(key.fileobj)
                    del streams[key.fileobj]
            now = time.monotonic()
            if self.dump_from is not None and self.stop_due is not None and self.flight.complete(self.dump_from):
                self.stop_due = now     # every survivor has dumped: no need to wait longer
            if self.stop_due is not None and now >= self.stop_due:
                self._begin_stop(self.stop_due_reason)
            if self.stop_at is None and len(self.started) < self.np and \
                    now - begun > self.opts.start_timeout:
                self._start_timed_out()
            if self.stop_at is not None and now - self.stop_at > ESCALATE_S:
                self._kill_group()
            if self.killed_at is not None and now - self.killed_at > GIVE_UP_S - ESCALATE_S:
                break               # something else holds the pipes open; do not hang
        self._wait_launcher()

    def _wait_launcher(self):
        """Wait for mpiexec itself, still honouring signals and the escalation timer."""
        while True:
            try:
                self.proc.wait(timeout=0.2)
                kill_leftovers(self.proc)
                return
            except subprocess.TimeoutExpired:
                if self.stop_at is not None and time.monotonic() - self.stop_at > ESCALATE_S:
                    self._kill_group()

    def _line(self, line, echo, files):
        flight = parse_flight_line(line)
        if flight is not None:
            self.flight.add(*flight)    # goes to the report, not to the job's output
            return
        report = parse_report(line)
        if report is not None:
            self._report(report)
            return
        abort = self.aborts.feed(line)
        if abort is not None:
            rank, code = abort
            self._failed(rank, self.started.get(rank), code or 1,
                         "called MPI_Abort with code %d" % code)
        if (self.stop_at is not None or self.first_failure is not None) \
                and not self.opts.verbose and not is_rank_line(line):
            # The launcher's own messages once a rank failed or hvdrun stops the
            # job ("BAD TERMINATION ... EXIT CODE: 9", with hydra's exit string
            # "Segmentation fault" for any code) describe its cleanup, not the
            # cause; hvdrun's summary line names the rank.  --verbose keeps them.
            return
        echo.write(line)
        if files:
            files.write(line)

    def _report(self, report):
        rank, host = report.get("rank"), report.get("host")
        if self.stop_due is not None and self.first_failure and rank == self.first_failure[0] \
                and report.get("event") in ("exit", "failing"):
            # The blamed rank's own report follows its traceback: all is here.
            self._begin_stop("rank %s failed" % rank)
        if report.get("event") == "start":
            self.started[rank] = host
        elif report.get("event") == "exit":
            code = report.get("code", 1)
            self.exits[rank] = (code, host)
            if code == EXIT_RESTART and getattr(self.opts, "elastic", False):
                # Not a failure: the rank left for hvdrun to restart the job.
                if self.stop_due is None and self.stop_at is None:
                    self._stop_soon(RESTART_GRACE_S, "restart")
            elif code != 0:
                sig = report.get("signal")
                self._failed(rank, host, code, ("was killed by %s" % _signal_name(sig)) if sig
                             else ("exited with code %d" % code), ask_dumps=True)
        elif report.get("event") == "failing":
            # The rank said it is failing; it may now hang in MPI_Finalize.
            reason = report.get("reason") or "no reason given"
            cause = _cause_elsewhere(reason)
            if cause is not None:
                # A survivor whose error names the rank that exited or raised:
                # its report can overtake that rank's own, so name the cause.
                rank, code, reason = cause
                host = self.started.get(rank, host)
                # Its own output (the traceback a user needs) may still be on
                # the way from another host: stop once it is here, or soon.
                self._failed(rank, host, code, "failed: %s" % reason, wait_for_output=True)
                return
            self._failed(rank, host, report.get("code") or 1, "failed: %s" % reason)

    def _failed(self, rank, host, code, how, wait_for_output=False, ask_dumps=False):
        # Only the first failure counts: the ones that follow are usually ranks
        # that lost their peer, or ranks hvdrun itself is stopping.
        if self.first_failure is None and self.stop_at is None:
            running = set(range(self.np)) - set(self.exits) - {rank}
            self.first_failure = (rank, host, code, how, len(running))
            if ask_dumps and running:
                # It could not say why, and the others wait for it: they say
                # where they were (flight recorder) before hvdrun stops them.
                self.dump_from = running
                self.lost = (rank, how)
                self._ask_dumps()
                self._stop_soon(DUMP_GRACE_S, "rank %s failed" % rank)
            elif wait_for_output and rank not in self.exits:
                self._stop_soon(OUTPUT_GRACE_S, "rank %s failed" % rank)
            else:
                self._begin_stop("rank %s failed" % rank)

    def _stop_soon(self, delay, reason):
        self.stop_due = time.monotonic() + delay
        self.stop_due_reason = reason

    def _start_timed_out(self):
        missing = sorted(set(range(self.np)) - set(self.started))
        where = expected_hosts(self.opts.hosts, self.np)
        on = sorted({where[r] for r in missing if r in where})
        log("%d of %d ranks did not start within %g s (--start-timeout): rank%s %s%s"
            % (len(missing), self.np, self.opts.start_timeout, "s" if len(missing) > 1 else "",
               ", ".join(map(str, missing)), (" (on %s)" % ", ".join(on)) if on else ""))
        if on:
            log("check that %s can connect back to this host (firewall, --network-interface)"
                % ", ".join(on))
        self._begin_stop("start timeout")

    def _exit_code(self):
        rc = self.proc.returncode
        if self.first_failure is not None:
            rank, host, code, how, running = self.first_failure
            others = ("; hvdrun stopped the %d other rank%s still running"
                      % (running, "s" if running > 1 else "")) if running else ""
            log("rank %s on host %s %s%s" % (rank, host or "?", how, others))
            return code
        if self.user_signal is not None:
            log("job %s; all ranks were stopped" % self.stop_reason)
            return 128 + self.user_signal
        if self.stop_reason == "start timeout":
            return EXIT_LAUNCH_ERROR
        if self.stop_reason == "restart" or (rc != 0 and self.exits and
                                             all(c == EXIT_RESTART for c, _ in self.exits.values())):
            return EXIT_RESTART
        if rc != 0:
            if rc < 0:
                log("%s was killed by %s" % (os.path.basename(self.proc.args[0]), _signal_name(-rc)))
                return 128 - rc
            log("%s exited with code %d and no rank reported how it ended (a rank calling "
                "MPI_Abort, or a launch error: see the messages above)"
                % (os.path.basename(self.proc.args[0]), rc))
            return rc
        return 0


# How a survivor's HvdliteShutdownError names the rank whose exit ended the
# job (hvdlite/basics.py words the reason; "; rank ..." follows for others).
_SHUTDOWN_CAUSE = re.compile(r"HvdliteShutdownError: hvdlite has shut down: rank (\d+) (.*?)(?:; rank \d+ .*)?$")
_EXIT_CODE = re.compile(r"\(exit code (\d+)\)$")
_UNHANDLED = "exited with an unhandled exception: "


def _cause_elsewhere(reason):
    """(rank, exit code, reason) of the rank that a survivor's error blames for
    exiting with an error, or None (no such rank: the survivor is the news)."""
    m = _SHUTDOWN_CAUSE.search(reason)
    if m is None:
        return None
    rank, why = int(m.group(1)), m.group(2)
    if why.startswith(_UNHANDLED):
        return rank, 1, why[len(_UNHANDLED):]
    code = _EXIT_CODE.search(why)
    if why.startswith("called sys.exit(") and code and int(code.group(1)) != 0:
        return rank, int(code.group(1)), why
    return None


class LaunchError(RuntimeError):
    pass


def run_job(opts):
    return Job(opts).run()
