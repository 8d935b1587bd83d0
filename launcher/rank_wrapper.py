"""Runs one rank's command under the MPI launcher: prefixes output, reports the end.

hvdrun asks mpiexec/mpirun to start ``python -S rank_wrapper.py CMD ARGS...`` on
every rank instead of CMD itself.  The wrapper

* prefixes every output line with the rank, ``[3]<stdout>: text``, and writes
  each line with one ``write()`` of at most PIPE_BUF bytes.  Such a write reaches
  the MPI launcher's pipe whole, and hydra / Open MPI forward what they read in
  one piece, so lines from different ranks never mix mid-line.  Longer lines are
  cut into several prefixed lines;
* tells hvdrun, on stderr, when the rank started and how it ended (exit code or
  signal), because MPI launchers keep a job running when one rank exits with an
  error after a clean MPI finalize: hvdrun uses the report to stop the job;
* forwards SIGINT/SIGTERM/SIGHUP/SIGUSR1/SIGUSR2 to the rank's process group,
  and makes the kernel SIGKILL the rank if the wrapper itself dies (the MPI
  launcher's last resort is to SIGKILL what it started, which is this wrapper).

It is a standalone script (standard library only, no hvdlite import): it starts
once per rank, so it must start fast and must not load the engine or MPI.  The
rank inherits every file descriptor the wrapper got (MPICH's PMI_FD among them).
"""

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time

# A line on the wrapper's stderr that starts with this is a report for hvdrun,
# not rank output.  Rank output always starts with "[rank]<", so it cannot
# collide.  (hvdrun imports these names; keep them in sync by importing.)
CTL_MARK = "@hvdlite-ctl@ "
PREFIX_FMT = "[{rank}]<{stream}>: "
REPORTS_VAR = "HVDLITE_RANK_REPORTS"     # set in the rank: a reader for report lines is attached

_CTL_MARK_B = CTL_MARK.encode()

MAX_WRITE = 4096            # PIPE_BUF on Linux: writes up to this size are atomic
PARTIAL_FLUSH_S = 1.0       # a line without newline is shown after this long (prompts, progress)
DRAIN_AFTER_EXIT_S = 0.5    # grandchildren may hold the pipes open after the rank exits
KILL_AFTER_S = 5.0          # after forwarding a stop signal, SIGKILL the rank this long later
# A rank killed by a signal it was not sent by hvdrun: the wrapper stays this
# long after reporting it (or until hvdrun stops the job), because the MPI
# launcher stops every other rank the moment this process ends, and hvdrun
# first asks them for their flight recorders (launcher/job.py, DUMP_GRACE_S).
LINGER_AFTER_KILL_S = 2.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1

# Under in-place recovery every rank is its own MPI job (PMI_RANK is 0 in all of
# them): the rank is named by the uid hvdrun gave its process instead.
RANK_VARS = ("HVDLITE_ELASTIC_UID", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def rank_from_env(env=None):
    env = os.environ if env is None else env
    for var in RANK_VARS:
        if env.get(var, "").isdigit():
            return int(env[var])
    return None


def split_for_write(prefix, line, limit=MAX_WRITE):
    """Cut ``line`` (bytes, no newline) into prefixed, newline-ended records of <= limit bytes.

    Cuts never fall inside a UTF-8 multi-byte character.
    """
    room = max(16, limit - len(prefix) - 1)
    records = []
    while True:
        if len(line) <= room:
            records.append(prefix + line + b"\n")
            return records
        cut = room
        while cut > room - 4 and (line[cut] & 0xC0) == 0x80:   # continuation byte
            cut -= 1
        records.append(prefix + line[:cut] + b"\n")
        line = line[cut:]


class _Stream:
    """One of the rank's output pipes, split into lines."""

    def __init__(self, name, pipe, out_fd, prefix, on_report=None):
        self.name, self.pipe, self.out_fd = name, pipe, out_fd
        self.prefix = prefix
        self.on_report = on_report  # called with a report line the rank wrote itself
        self.buf = b""
        self.since = None           # when the oldest unterminated byte arrived
        self.out_ok = True

    def _write(self, line):
        if self.on_report is not None and line.startswith(_CTL_MARK_B) and self.on_report(line):
            return
        for rec in split_for_write(self.prefix, line):
            if not self.out_ok:
                return
            try:
                while rec:
                    rec = rec[os.write(self.out_fd, rec):]
            except OSError:
                # The launcher's end of the pipe is gone; keep draining the rank
                # so it never blocks on a full pipe, but drop the text.
                self.out_ok = False

    def feed(self, data):
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self._write(line)
        if not self.buf:
            self.since = None
        elif lines or self.since is None:       # a new unterminated line began
            self.since = time.monotonic()

    def flush_stale(self, now, force=False):
        if self.buf and (force or now - self.since >= PARTIAL_FLUSH_S):
            self._write(self.buf)
            self.buf, self.since = b"", None


def relay_rank_report(line, rank, host):
    """A rank may announce its own failure before it exits, by writing
    ``@hvdlite-ctl@ {"event": "failing", "code": 1, "reason": "..."}`` on stderr.

    This matters because a rank that exits after using MPI can hang in
    MPI_Finalize (MPICH waits there for every rank), so its real exit never
    comes while the other ranks wait for it.  hvdlite's exit hook writes this
    line; any other program may too.  Returns False for anything else, which is
    then shown as ordinary output.
    """
    try:
        fields = json.loads(line[len(_CTL_MARK_B):].decode("utf-8", "replace"))
    except ValueError:
        return False
    if not isinstance(fields, dict) or fields.get("event") != "failing":
        return False
    code = fields.get("code")
    report("failing", rank=rank, host=host, code=code if isinstance(code, int) and code else 1,
           reason=str(fields.get("reason", ""))[:500])
    return True


def report(event, **fields):
    fields["event"] = event
    line = (CTL_MARK + json.dumps(fields, sort_keys=True) + "\n").encode()
    try:
        os.write(2, line)
    except OSError:
        pass


def _die_with_parent():
    """In the child before exec: get SIGKILL when the wrapper dies; own process group."""
    os.setpgid(0, 0)
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass                                    # not Linux: the launcher's cleanup has to do


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    rank = rank_from_env()
    rank_s = "?" if rank is None else str(rank)
    host = socket.gethostname()
    if not argv:
        sys.stderr.write("usage: rank_wrapper.py CMD [ARGS...]\n")
        return 2

    state = {"child": None, "stop_sig": None, "stop_at": None}

    def on_signal(sig, _frame):
        # Remember the first stop request; forward every signal to the rank's group.
        if state["stop_sig"] is None and sig != signal.SIGUSR1 and sig != signal.SIGUSR2:
            state["stop_sig"], state["stop_at"] = sig, time.monotonic()
        if state["child"] is not None:
            _killpg(state["child"].pid, sig)

    for sig in FORWARDED:
        signal.signal(sig, on_signal)

    wrapper_pid = os.getpid()

    def child_setup():
        _die_with_parent()
        if os.getppid() != wrapper_pid:         # the wrapper died before prctl took effect
            os._exit(137)

    try:
        # REPORTS_VAR tells the rank (hvdlite's exit hook) that a "failing" report
        # line on stderr will be read; without it such a line would just be noise.
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 close_fds=False, preexec_fn=child_setup,
                                 env=dict(os.environ, **{REPORTS_VAR: "1"}))
    except OSError as e:
        msg = "hvdrun: cannot run %r on %s: %s" % (argv[0], host, e.strerror)
        os.write(2, (PREFIX_FMT.format(rank=rank_s, stream="stderr") + msg + "\n").encode())
        code = 127 if isinstance(e, FileNotFoundError) else 126
        report("exit", rank=rank, host=host, code=code, signal=None)
        return code
    state["child"] = child
    if state["stop_sig"] is not None:           # a stop request arrived while starting
        on_signal(state["stop_sig"], None)
    report("start", rank=rank, host=host, pid=child.pid)

    streams = [_Stream("stdout", child.stdout, 1, PREFIX_FMT.format(rank=rank_s, stream="stdout").encode()),
               _Stream("stderr", child.stderr, 2, PREFIX_FMT.format(rank=rank_s, stream="stderr").encode(),
                       on_report=lambda line: relay_rank_report(line, rank, host))]
    sel = selectors.DefaultSelector()
    for s in streams:
        os.set_blocking(s.pipe.fileno(), False)
        sel.register(s.pipe, selectors.EVENT_READ, s)
    open_streams = len(streams)
    exited_at = None
    while True:
        for key, _ in sel.select(timeout=0.2):     # with nothing registered: just a 0.2 s wait
            s = key.data
            try:
                data = os.read(s.pipe.fileno(), 65536)
            except BlockingIOError:
                continue
            if data:
                s.feed(data)
            else:
                sel.unregister(s.pipe)
                open_streams -= 1
        now = time.monotonic()
        for s in streams:
            s.flush_stale(now)
        if child.poll() is not None:
            exited_at = exited_at or now
            # Grandchildren may keep the pipes open after the rank is gone.
            if not open_streams or now - exited_at > DRAIN_AFTER_EXIT_S:
                break
        if state["stop_at"] is not None and now - state["stop_at"] > KILL_AFTER_S:
            _killpg(child.pid, signal.SIGKILL)      # asked to stop, and the rank did not
            state["stop_at"] = None
    for s in streams:
        s.flush_stale(0, force=True)
    code = child.wait()
    if state["stop_sig"] is not None:
        # Stopped on request: take down what the rank left in its group, too.
        _killpg(child.pid, signal.SIGKILL)
    sig = -code if code < 0 else None
    exit_code = 128 + sig if sig else code
    report("exit", rank=rank, host=host, code=exit_code, signal=sig)
    if sig and state["stop_sig"] is None:
        until = time.monotonic() + LINGER_AFTER_KILL_S
        while state["stop_sig"] is None and time.monotonic() < until:
            time.sleep(0.05)
    return exit_code


def _killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(main())
