"""An elastic hvdrun job under in-place recovery, run by a test: its output read
as it comes (with the time each line arrived), the JSON events of
tests/scripts/inplace_allreduce.py picked out, SIGKILL of a rank by uid, the
measure the tests report (from a kill to the survivors' next completed
allreduce on the new communicator), and every process hvdrun started on this
host, seen while it ran: hydra's proxies carry no tag in their command line,
and one left behind would be reparented away from hvdrun."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from .hosts import REPO

SCRIPT = os.path.join(REPO, "tests", "scripts", "inplace_allreduce.py")
LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>: (.*)$")


class InPlaceJob:
    def __init__(self, argv, env, timeout=180):
        self.lines = []             # (arrival time, stream, text)
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, cwd=REPO)
        self.deadline = time.time() + timeout
        self.rc = None
        self.seen = {}              # pid -> command line of hvdrun's descendants
        self._readers = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                         for s, n in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        self._readers.append(threading.Thread(target=self._sample, daemon=True))
        for r in self._readers:
            r.start()

    def _sample(self):
        while self.proc.poll() is None:
            self.seen.update(_descendants(self.proc.pid))
            time.sleep(0.2)

    def leftovers(self, timeout=10.0):
        """hvdrun's descendants seen while it ran that still run (after up to ``timeout`` s)."""
        deadline = time.time() + timeout
        while True:
            left = {p: c for p, c in self.seen.items() if _cmdline(p) == c}
            if not left or time.time() > deadline:
                return left
            time.sleep(0.1)

    def _read(self, stream, name):
        for line in stream:
            with self._cond:
                self.lines.append((time.time(), name, line.rstrip("\n")))
                self._cond.notify_all()

    def events(self, kind=None, uid=None, **match):
        out = []
        with self._cond:
            lines = list(self.lines)
        for _, stream, text in lines:
            m = LINE.match(text)
            if stream == "out" and m and m.group(2) == "stdout" and m.group(3).startswith("{"):
                ev = json.loads(m.group(3))
                if (kind is None or ev["ev"] == kind) and (uid is None or ev["uid"] == uid) and \
                        all(ev.get(k) == v for k, v in match.items()):
                    out.append(ev)
        return out

    def wait_for(self, predicate, what):
        with self._cond:
            while True:
                found = predicate()
                if found:
                    return found
                if self.proc.poll() is not None or time.time() > self.deadline:
                    raise AssertionError("never saw %s; hvdrun's output:\n%s" % (what, self.text()))
                self._cond.wait(0.1)

    def wait_step(self, step, generation=None):
        """Waits until some rank completed ``step`` (in ``generation``)."""
        return self.wait_for(lambda: [e for e in self.events("step") if e["step"] >= step and
                                      (generation is None or e["generation"] == generation)],
                             "step %d%s" % (step, "" if generation is None else " of generation %d" % generation))

    def pid(self, uid):
        return self.events("gen", uid)[0]["pid"]

    def kill(self, uid, paused=True):
        """SIGKILLs rank ``uid`` (once it paused, 0.1 s later: the others then
        wait for it inside the collective); returns the time of the kill."""
        if paused:
            self.wait_for(lambda: self.events("paused", uid), "uid %d pausing" % uid)
            time.sleep(0.1)
        pid = self.pid(uid)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        return killed_at

    def recovery_s(self, killed_at, generation):
        """Seconds from the kill to the last survivor's first allreduce in ``generation``."""
        members = self.wait_for(lambda: self.events("gen", generation=generation), "generation %d"
                                % generation)[0]["members"]
        firsts = []
        for u in members:
            steps = self.wait_for(lambda: self.events("step", u, generation=generation),
                                  "a step of uid %d in generation %d" % (u, generation))
            firsts.append(steps[0]["t"])
        return max(firsts) - killed_at

    def stop(self):
        """Ends hvdrun if it still runs (a failed test): it stops its ranks."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def wait(self):
        try:
            self.rc = self.proc.wait(timeout=max(1, self.deadline - time.time()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.rc = self.proc.wait()
            raise AssertionError("hvdrun did not end in time:\n" + self.text())
        for r in self._readers:
            r.join(5)
        return self.rc

    def stderr(self):
        with self._cond:
            return "\n".join(t for _, s, t in self.lines if s == "err")

    def text(self):
        with self._cond:
            return "\n".join(t for _, _, t in self.lines)[-8000:]


def _cmdline(pid):
    """The command line of a running (not zombie) process, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return None
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return None


def _descendants(root):
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = {}, [root]
    while frontier:
        children = [p for p, pp in parent.items() if pp in frontier]
        for p in children:
            cmd = _cmdline(p)
            if cmd is not None:
                found[p] = cmd
        frontier = children
    return found


def script_argv(tag, *args):
    return [sys.executable, SCRIPT, tag] + [str(a) for a in args]
