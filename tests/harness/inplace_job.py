"""An elastic hvdrun job under in-place recovery, run by a test: its output read
as it comes (harness.hvdrun_job), the JSON events of
tests/scripts/inplace_allreduce.py picked out, SIGKILL of a rank by uid, the
measure the tests report (from a kill to the survivors' next completed
allreduce on the new communicator), and every process hvdrun started on this
host, seen while it ran: hydra's proxies carry no tag in their command line,
and one left behind would be reparented away from hvdrun (``end_jobs`` stops a
test's jobs and kills what they left)."""

import os
import signal
import subprocess
import sys
import threading
import time

from .hosts import REPO, wait_until_gone
from .hvdrun_job import HvdrunJob

SCRIPT = os.path.join(REPO, "tests", "scripts", "inplace_allreduce.py")


class InPlaceJob(HvdrunJob):
    def __init__(self, argv, env, timeout=180):
        super().__init__(argv, env, timeout, cwd=REPO)
        self.seen = {}              # pid -> command line of hvdrun's descendants
        self._readers.append(threading.Thread(target=self._sample, daemon=True))
        self._readers[-1].start()

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

    def failure_text(self):
        """hvdrun's output without the step events, which would push the
        generations' starts and errors out of the shown tail; and the steps
        each generation ran."""
        with self._cond:
            lines = [t for _, _, t in self.lines if '"ev": "step"' not in t]
        steps = {}
        for ev in self.events("step"):
            key = "generation %s uid %s" % (ev.get("generation"), ev.get("uid"))
            first, last = steps.get(key, (ev["step"], ev["step"]))
            steps[key] = (min(first, ev["step"]), max(last, ev["step"]))
        summary = ", ".join("%s: steps %d-%d" % (k, a, b) for k, (a, b) in sorted(steps.items()))
        return "\n".join(lines)[-8000:] + "\n(step events left out; %s)" % (summary or "none")

    def events(self, kind=None, uid=None, **match):
        return [ev for ev in self.json_events(kind) if (uid is None or ev["uid"] == uid) and
                all(ev.get(k) == v for k, v in match.items())]

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


def end_jobs(jobs, tag=None):
    """Ends a test's jobs (the list ``jobs``, emptied): stops each hvdrun still running
    and SIGKILLs what was left behind: hvdrun's descendants still running and, with
    ``tag``, whatever process of this host carries the tag after 10 s. Returns what was
    left behind, {pid: command line}."""
    left = {}
    while jobs:
        job = jobs.pop()
        job.stop()
        left.update(job.leftovers())
    if tag is not None:
        left.update(wait_until_gone(tag, timeout=10))
    for pid in left:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return left
