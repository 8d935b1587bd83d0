"""An hvdrun job run by a test: hvdrun's stdout and stderr read as they come,
each line kept with the time it arrived, and the JSON events the ranks print
picked out of hvdrun's ``[rank]<stdout>: `` lines. Subclasses choose which
events a test asks for (``events``) and which output a failure shows; also a
host discovery script whose listing a test rewrites."""

import json
import re
import subprocess
import threading
import time

LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>: (.*)$")


class HvdrunJob:
    # How often wait_for looks at hvdrun and the deadline between lines.
    poll_s = 0.1

    def __init__(self, argv, env, timeout, cwd=None):
        self.lines = []             # (arrival time, stream: "out" or "err", text)
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, cwd=cwd)
        self.deadline = time.time() + timeout
        self.rc = None
        self._readers = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                         for s, n in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for r in self._readers:
            r.start()

    def _read(self, stream, name):
        for line in stream:
            with self._cond:
                self.lines.append((time.time(), name, line.rstrip("\n")))
                self._cond.notify_all()

    def json_events(self, kind=None):
        """The JSON events (of ``kind``) the ranks printed on stdout so far, in order."""
        out = []
        with self._cond:
            lines = list(self.lines)
        for _, stream, text in lines:
            m = LINE.match(text)
            if stream == "out" and m and m.group(2) == "stdout" and m.group(3).startswith("{"):
                ev = json.loads(m.group(3))
                if kind is None or ev["ev"] == kind:
                    out.append(ev)
        return out

    def failure_text(self):
        """What an assertion shows of hvdrun's output."""
        return self.text()

    def wait_for(self, predicate, what):
        """``predicate()``'s first true value; fails naming ``what`` when hvdrun ended or
        the deadline passed first."""
        with self._cond:
            while True:
                found = predicate()
                if found:
                    return found
                if self.proc.poll() is not None or time.time() > self.deadline:
                    raise AssertionError("never saw %s; hvdrun's output:\n%s" % (what, self.failure_text()))
                self._cond.wait(self.poll_s)

    def wait(self):
        """hvdrun's exit status (also in ``rc``) once it ended and its output is read;
        killed and failed when it runs past the deadline."""
        try:
            self.rc = self.proc.wait(timeout=max(1, self.deadline - time.time()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.rc = self.proc.wait()
            raise AssertionError("hvdrun did not end in time:\n" + self.failure_text())
        for r in self._readers:
            r.join(5)
        return self.rc

    def stderr(self):
        """hvdrun's stderr (its own lines and the ranks' stderr), whole."""
        with self._cond:
            return "\n".join(t for _, s, t in self.lines if s == "err")

    def text(self):
        """The end of everything hvdrun printed."""
        with self._cond:
            return "\n".join(t for _, _, t in self.lines)[-8000:]

    def stderr_text(self):
        """The end of hvdrun's stderr with the ranks' stderr lines of its stdout."""
        with self._cond:
            return "\n".join(t for _, s, t in self.lines if s == "err" or "<stderr>" in t)[-6000:]


def discovery_script(directory, hosts):
    """A --host-discovery-script in ``directory`` that prints a listing file, which
    lists ``hosts`` (one a line) until the test writes others; returns (script, listing)."""
    listing = directory / "hosts.txt"
    listing.write_text("\n".join(hosts) + "\n")
    script = directory / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % listing)
    script.chmod(0o755)
    return script, listing
