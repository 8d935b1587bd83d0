"""hvdrun's side of the output: split the MPI launcher's streams into lines, pick
out the wrappers' reports, echo rank lines, and keep per-rank log files."""

import json
import os
import re

from .rank_wrapper import CTL_MARK

_RANK_LINE = re.compile(rb"^\[(\d+)\]<(stdout|stderr)>: ?")


class LineSplitter:
    """Bytes in, complete lines out (the last unterminated piece is kept)."""

    def __init__(self):
        self.buf = b""

    def feed(self, data):
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        return lines

    def rest(self):
        rest, self.buf = self.buf, b""
        return [rest] if rest else []


def parse_report(line):
    """Return the dict of a wrapper report line, or None for any other line."""
    mark = CTL_MARK.encode()
    if not line.startswith(mark):
        return None
    try:
        return json.loads(line[len(mark):].decode("utf-8", "replace"))
    except ValueError:
        return None


class AbortDetector:
    """Notice a rank calling MPI_Abort in the launcher's messages.

    The MPI launcher kills every rank (wrappers included) right after an abort, so
    the wrapper's exit report may never arrive; the abort message is then the
    only record of which rank failed and with what code.
      MPICH:    "... application called MPI_Abort(MPI_COMM_WORLD, 3) - process 1"
      Open MPI: "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD"
                "with errorcode 3."  (two lines)
    """

    _MPICH = re.compile(rb"MPI_Abort\([^,()]*,\s*(-?\d+)\)\s*-\s*process\s+(\d+)")
    _OMPI_RANK = re.compile(rb"MPI_ABORT was invoked on rank (\d+)")
    _OMPI_CODE = re.compile(rb"with errorcode (-?\d+)")

    def __init__(self):
        self._ompi_rank = None

    def feed(self, line):
        """Return (rank, code) when ``line`` completes an abort message, else None."""
        m = self._MPICH.search(line)
        if m:
            return int(m.group(2)), int(m.group(1))
        m = self._OMPI_RANK.search(line)
        if m:
            self._ompi_rank = int(m.group(1))
        m = self._OMPI_CODE.search(line)
        if m and self._ompi_rank is not None:
            rank, self._ompi_rank = self._ompi_rank, None
            return rank, int(m.group(1))
        return None


def is_rank_line(line):
    return _RANK_LINE.match(line) is not None


class RankFiles:
    """--output-filename DIR: DIR/rank.<N>/stdout and DIR/rank.<N>/stderr, without the
    prefix (the directory already says which rank), written on the launching host."""

    def __init__(self, directory):
        self.directory = directory
        self.files = {}
        os.makedirs(directory, exist_ok=True)

    def write(self, line):
        m = _RANK_LINE.match(line)
        if not m:
            return
        key = (int(m.group(1)), m.group(2).decode())
        f = self.files.get(key)
        if f is None:
            d = os.path.join(self.directory, "rank.%d" % key[0])
            os.makedirs(d, exist_ok=True)
            f = self.files[key] = open(os.path.join(d, key[1]), "ab", buffering=0)
        f.write(line[m.end():] + b"\n")

    def close(self):
        for f in self.files.values():
            f.close()
        self.files = {}


class Echo:
    """Write whole lines to one of hvdrun's own output fds; tolerate a closed reader
    (``hvdrun ... | head``) without stopping the job's bookkeeping."""

    def __init__(self, fd):
        self.fd = fd
        self.ok = True

    def write(self, line):
        if not self.ok:
            return
        data = line + b"\n"
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            self.ok = False
