"""torchft's side of issue 39's side by side: kill a replica of the digits job under
torchft and measure what the survivors see; and torchft's cost per step in steady state.

    # 3 replica groups on loopback, SIGKILL replica 2 after step 40, 5 trials
    python bench/torchft_recovery.py recovery --repeat 5
    # the same with torchft's lighthouse tuned to notice the loss sooner
    python bench/torchft_recovery.py recovery --repeat 5 --heartbeat-timeout-ms 500
    # killed while the others wait for it inside the allreduce
    python bench/torchft_recovery.py recovery --repeat 5 --heartbeat-timeout-ms 500 --kill-at collective
    # a replacement replica started right after the kill: it heals from a live peer
    python bench/torchft_recovery.py recovery --repeat 5 --replace
    # one replica per network-namespace host (root; tests/harness/hosts.py makes them)
    python bench/torchft_recovery.py recovery --repeat 5 --netns
    # steady state: torchft vs torch DDP on gloo, interleaved, no sleep in the step
    python bench/torchft_recovery.py overhead --repeat 5
    # the medians of every JSON of a results directory in one file
    python bench/torchft_recovery.py report bench/results/2026-11-27-torchft \
        --out bench/results/2026-11-27-torchft/summary.json

Run it with the Python that has torchft (bench/torchft_digits.py's roles run under
sys.executable). Every trial starts a lighthouse (torchft's LighthouseServer,
--min-replicas 2 by default) and --replicas replica groups of one process each
(bench/torchft_digits.py train), waits until each Manager is up, starts them together,
and SIGKILLs the last replica (--victim) a random moment (0 to --kill-jitter s) after it
printed step --kill-step (--kill-at step: between steps, the others wait for it in the
next quorum), or 0.1 s after it stopped before the allreduce of the step after (--kill-at
collective: the others wait for it inside the gloo allreduce, which then fails). For every
survivor it records, as times after the kill:

- detect: its first step that torchft did not commit (a gloo collective failed), if any;
- quorum: it holds the next quorum, without the victim (the ProcessGroupGloo reconfigured);
- next: its first committed step without the victim (the kill -> next step of issue 39);
- redone: steps it attempted and did not commit between the kill and that step
  (torchft does not roll back: committed steps stay, a failed step is done again);
- whether it kept its process (the pid of its start and done events is the one started);
- at the end: its accuracy and parameters' sha256 (all replicas should agree), next to
  those of an uninterrupted run (--reference, on by default).

--replace starts a new replica with the victim's id --replace-delay s after the kill; it
joins the quorum at a step, fetches the state (model, optimizer, data position) from a
live replica (torchft's heal) and takes part from the step after. Recorded: the times
from the kill and from its start to its process being up, its Manager being up, the
heal, and its first step taking part; and the longest gap between two steps of a
survivor while it joined.
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torchft_digits.py")
REPO = os.path.dirname(HERE)


# ---- where the processes run: loopback, or one network-namespace host each -------------------

class Loopback:
    name = "loopback"

    def addr(self, k):
        return "127.0.0.1"

    def argv(self, k, argv):
        return argv

    def env(self, k):
        return {"GLOO_SOCKET_IFNAME": "lo"}

    def close(self):
        pass


class Netns:
    """Hosts 1..count from tests/harness/hosts.py (root): each its own network, UTS and
    mount namespace with a veth on one bridge."""
    name = "netns"

    def __init__(self, count, attach=None):
        sys.path.insert(0, os.path.join(REPO, "tests"))
        from harness.hosts import NetnsHosts, cleanup_stale, missing_requirements
        self.attached = attach is not None
        if self.attached:
            # Hosts that bench/elastic_recovery.py made, for hvdlite's trials too.
            with open(attach) as f:
                self.hosts = NetnsHosts.attach(json.load(f))
            if self.hosts.count < count:
                raise SystemExit("--netns-attach: %d hosts, %d needed" % (self.hosts.count, count))
            return
        reasons = missing_requirements()
        if reasons:
            raise SystemExit("cannot make netns hosts: " + "; ".join(reasons))
        cleanup_stale()
        self.hosts = NetnsHosts(count)
        self.hosts.up()

    def addr(self, k):
        return self.hosts.addr(k)

    def argv(self, k, argv):
        return self.hosts.on_host(k, argv, cwd=REPO)

    def env(self, k):
        return {"GLOO_SOCKET_IFNAME": "eth0"}

    def close(self):
        if not self.attached:
            self.hosts.down()


class Proc:
    """A child whose stdout is JSON event lines (kept with the time each was read)."""

    def __init__(self, name, argv, env, log_dir):
        self.name = name
        self.events = []
        self.eof = False
        self.cond = threading.Condition()
        self.stderr_path = os.path.join(log_dir, name + ".err")
        self.t_spawn = time.time()
        self.popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=open(self.stderr_path, "w"), env=env, text=True)
        self.pid = self.popen.pid
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.popen.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.cond:
                self.events.append(ev)
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait_event(self, pred, timeout):
        deadline = time.time() + timeout
        with self.cond:
            while True:
                for ev in self.events:
                    if pred(ev):
                        return ev
                left = deadline - time.time()
                if left <= 0 or self.eof:
                    return None
                self.cond.wait(min(left, 0.5))

    def send(self, line):
        try:
            self.popen.stdin.write(line)
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def close_stdin(self):
        try:
            self.popen.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def stop(self, timeout=10):
        """Wait for the child; SIGKILL it (by pid) if it is still there after timeout."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.popen.wait()

    def of(self, kind):
        with self.cond:
            return [e for e in self.events if e["ev"] == kind]

    def stderr_tail(self, n=15):
        try:
            return "".join(open(self.stderr_path).readlines()[-n:])
        except OSError:
            return ""


def child_env(place, k, extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(place.env(k))
    env.update(extra or {})
    return env


def start_lighthouse(args, place, k, log_dir):
    argv = [sys.executable, SCRIPT, "lighthouse", "--addr", place.addr(k),
            "--min-replicas", str(args.min_replicas),
            "--join-timeout-ms", str(args.join_timeout_ms),
            "--quorum-tick-ms", str(args.quorum_tick_ms),
            "--heartbeat-timeout-ms", str(args.heartbeat_timeout_ms)]
    lh = Proc("lighthouse", place.argv(k, argv), child_env(place, k, args.env), log_dir)
    ev = lh.wait_event(lambda e: e["ev"] == "lighthouse", args.start_timeout)
    if ev is None:
        raise RuntimeError("the lighthouse did not start:\n" + lh.stderr_tail())
    return lh, ev["address"]


def start_replica(args, place, k, replica, lighthouse, log_dir, name, wait_go=True, hang_at=None):
    argv = [sys.executable, SCRIPT, "train", "--addr", place.addr(k), "--lighthouse", lighthouse,
            "--replica", str(replica), "--events", "--epochs", str(args.epochs),
            "--step-sleep", str(args.step_sleep), "--min-replicas", "1",
            "--transport", args.transport, "--ddp-hook", args.ddp_hook]
    argv += ["--wait-go"] if wait_go else []
    argv += ["--hang-at-step", str(hang_at)] if hang_at is not None else []
    return Proc(name, place.argv(k, argv), child_env(place, k, args.env), log_dir)


def wait_ready(procs, timeout):
    for p in procs:
        if p.wait_event(lambda e: e["ev"] == "ready", timeout) is None:
            raise RuntimeError("%s did not get ready:\n%s" % (p.name, p.stderr_tail()))


# ---- one recovery trial ------------------------------------------------------------------------

def run_trial(args, place, kill, log_dir):
    R = args.replicas
    lh_host = R + 1 if place.name == "netns" else 0
    lh, address = start_lighthouse(args, place, lh_host, log_dir)
    procs, repl = [], None
    out = {"kill": kill}
    try:
        hang = args.kill_step if kill and args.kill_at == "collective" else None
        procs = [start_replica(args, place, r + 1, r, address, log_dir, "r%d" % r,
                               hang_at=hang if r == args.victim else None)
                 for r in range(R)]
        wait_ready(procs, args.start_timeout)
        for p in procs:
            p.send("go\n")
            p.close_stdin()
        victim = procs[args.victim]
        if kill:
            kind = "hang" if hang is not None else "step"
            ev = victim.wait_event(lambda e: e["ev"] == kind and e["step"] >= args.kill_step,
                                   args.run_timeout)
            if ev is None:
                raise RuntimeError("the victim did not reach step %d:\n%s"
                                   % (args.kill_step, victim.stderr_tail()))
            time.sleep(0.1 if hang is not None else random.uniform(0, args.kill_jitter))
            t_kill = time.time()
            os.kill(victim.pid, signal.SIGKILL)
            victim.popen.wait()
            out["t_kill"] = t_kill
            out["victim_last_step"] = max([e["step"] for e in victim.of("step")] or [0])
            if args.replace:
                time.sleep(args.replace_delay)
                repl = start_replica(args, place, args.victim + 1, args.victim, address, log_dir,
                                     "r%d-new" % args.victim, wait_go=False)
        live = [p for i, p in enumerate(procs) if not (kill and i == args.victim)]
        live += [repl] if repl else []
        deadline = time.time() + args.run_timeout
        for p in live:
            p.wait_event(lambda e: e["ev"] == "done", max(1.0, deadline - time.time()))
        for p in live:
            if p.popen.poll() is None and not p.of("done"):
                os.kill(p.pid, signal.SIGKILL)      # hung: no done event in --run-timeout
            p.stop()
        out["survivors"] = [survivor_metrics(p, out.get("t_kill"), R, repl)
                            for i, p in enumerate(procs) if not (kill and i == args.victim)]
        if repl:
            out["replacement"] = replacement_metrics(repl, out["t_kill"], R)
        if not kill and any(s.get("failed") for s in out["survivors"]):
            raise RuntimeError("the uninterrupted run failed:\n" + procs[0].stderr_tail())
    finally:
        for p in procs + ([repl] if repl else []):
            if p.popen.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.popen.wait()
        lh.close_stdin()
        lh.stop(5)
    return out


def step_gaps(steps):
    return [b["t"] - a["t"] for a, b in zip(steps, steps[1:])]


def last_error(p):
    lines = [l.strip() for l in p.stderr_tail(60).splitlines() if l.strip()]
    errs = [l for l in lines if "Error" in l or "error" in l]
    return (errs or lines or [""])[-1][:200]


def survivor_metrics(p, t_kill, R, repl):
    if not p.of("done"):
        # It ended (or was ended after --run-timeout) without finishing the training.
        return {"name": p.name, "pid": p.pid, "failed": True, "exit_code": p.popen.returncode,
                "last_step": max([e["step"] for e in p.of("step")] or [0]),
                "error": last_error(p)}
    start, done = p.of("start")[0], p.of("done")[0]
    steps = p.of("step")
    m = {"name": p.name, "host": start["host"], "pid": p.pid,
         "pid_kept": start["pid"] == done["pid"] == p.pid,
         "exit_code": p.popen.returncode, "steps": done["steps"], "accuracy": done["accuracy"],
         "params_sha256": done["params_sha256"],
         "quorums": [(q["quorum_id"], q["size"]) for q in p.of("quorum")]}
    pre = [s for s in steps if s["size"] == R and (t_kill is None or s["t"] < t_kill)]
    m["step_s_before"] = statistics.median(step_gaps(pre[5:])) if len(pre) > 7 else None
    if t_kill is None:
        return m
    after = [s for s in steps if s["t"] > t_kill]
    nxt = next((s for s in after if s["size"] < R), None)
    failed = [f for f in p.of("step_failed") if f["t"] > t_kill and (nxt is None or f["t"] <= nxt["t"])]
    quorum = next((q for q in p.of("quorum") if q["t"] > t_kill), None)
    m.update({
        "first_step_after_kill_s": after[0]["t"] - t_kill if after else None,
        "steps_committed_before_next": len([s for s in after if nxt and s["t"] < nxt["t"]]),
        "next_s": nxt["t"] - t_kill if nxt else None,
        "next_step": nxt["step"] if nxt else None,
        "detect_s": failed[0]["t"] - t_kill if failed else None,
        "quorum_s": quorum["t"] - t_kill if quorum else None,
        "redone": len(failed),
        "failed_errors": sorted({str(f.get("error"))[:80] for f in failed}),
    })
    if repl is not None:
        joined = repl.of("quorum")
        if joined:
            t_join = joined[0]["t"]
            around = [s for s in steps if t_join - 2 < s["t"] < t_join + 2]
            m["max_gap_around_join_s"] = max(step_gaps(around)) if len(around) > 1 else None
    return m


def replacement_metrics(p, t_kill, R):
    if not p.of("done"):
        return {"name": p.name, "pid": p.pid, "failed": True, "exit_code": p.popen.returncode,
                "error": last_error(p)}
    start, ready, done = p.of("start")[0], p.of("ready")[0], p.of("done")[0]
    quorums = p.of("quorum")
    healed = next((s for s in p.of("step") if s.get("healed")), None)
    part = next((s for s in p.of("step") if s.get("participating")), None)
    return {
        "name": p.name, "pid": p.pid, "accuracy": done["accuracy"],
        "params_sha256": done["params_sha256"], "steps": done["steps"],
        "spawn_after_kill_s": p.t_spawn - t_kill,
        "up_s": start["t"] - p.t_spawn,                 # python + torch imported
        "ready_s": ready["t"] - p.t_spawn,              # its Manager is up
        "heal_quorum_s": quorums[0]["t"] - p.t_spawn if quorums else None,
        "healed_step": healed["step"] if healed else None,
        "healed_s": healed["t"] - p.t_spawn if healed else None,
        "ready_to_healed_s": healed["t"] - ready["t"] if healed else None,
        "takes_part_step": part["step"] if part else None,
        "takes_part_s": part["t"] - p.t_spawn if part else None,
        "ready_to_takes_part_s": part["t"] - ready["t"] if part else None,
        "kill_to_takes_part_s": part["t"] - t_kill if part else None,
        "first_quorum": quorums[0] if quorums else None,
    }


# ---- summaries --------------------------------------------------------------------------------

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, unit="s"):
    if x is None:
        return "-"
    return "%.3f%s" % (x, unit) if isinstance(x, float) else str(x)


def summarize(trials, reference):
    failed = [s for t in trials for s in t["survivors"] if s.get("failed")]
    surv = [s for t in trials for s in t["survivors"] if not s.get("failed")]
    slowest = [None if any(s.get("failed") or s["next_s"] is None for s in t["survivors"])
               else max(s["next_s"] for s in t["survivors"]) for t in trials]
    head = []
    if failed:
        head.append("%-40s %d of %d: %s" % ("survivors that did NOT finish", len(failed),
                                             len(failed) + len(surv),
                                             sorted({s["error"] for s in failed})))
    if not surv:
        return "\n".join(head)
    rows = [
        ("kill -> next step (each survivor)", med([s["next_s"] for s in surv])),
        ("kill -> next step (slowest survivor)", med(slowest)),
        ("kill -> failed step seen (detect)", med([s["detect_s"] for s in surv])),
        ("kill -> new quorum", med([s["quorum_s"] for s in surv])),
        ("kill -> first commit (any)", med([s["first_step_after_kill_s"] for s in surv])),
        ("steps redone per survivor", med([s["redone"] for s in surv])),
        ("steady step before the kill", med([s["step_s_before"] for s in surv])),
    ]
    lines = head + ["%-40s %s" % (k, fmt(v, "" if k.startswith("steps redone") else "s"))
                    for k, v in rows]
    lines.append("%-40s %s" % ("survivors kept their pid",
                               "%d/%d" % (sum(s["pid_kept"] for s in surv), len(surv))))
    lines.append("%-40s %s" % ("quorums a survivor saw (median count)",
                               med([len(s["quorums"]) for s in surv])))
    lines.append("%-40s %s" % ("redone per survivor, all trials", [s["redone"] for s in surv]))
    lines.append("%-40s %s" % ("next step per trial (slowest)", [round(x, 3) if x else x for x in slowest]))
    accs = [s["accuracy"] for s in surv]
    agree = all(len({s["params_sha256"] for s in t["survivors"] if not s.get("failed")}
                    | ({t["replacement"]["params_sha256"]}
                       if not t.get("replacement", {"failed": True}).get("failed") else set())) <= 1
                for t in trials)
    lines.append("%-40s median %.2f%% (min %.2f, max %.2f); replicas agree in every trial: %s"
                 % ("accuracy", statistics.median(accs), min(accs), max(accs), agree))
    if reference:
        lines.append("%-40s %.2f%% (%d steps)" % ("uninterrupted accuracy", reference["accuracy"],
                                                   reference["steps"]))
    reps = [t["replacement"] for t in trials
            if "replacement" in t and not t["replacement"].get("failed")]
    if reps:
        for key, label in (("up_s", "replacement: start -> process up"),
                           ("ready_s", "replacement: start -> Manager up"),
                           ("ready_to_healed_s", "replacement: Manager up -> healed step"),
                           ("ready_to_takes_part_s", "replacement: Manager up -> takes part"),
                           ("takes_part_s", "replacement: start -> takes part"),
                           ("kill_to_takes_part_s", "replacement: kill -> takes part")):
            lines.append("%-40s %s" % (label, fmt(med([r[key] for r in reps]))))
        lines.append("%-40s %s" % ("survivors' longest step gap at the join",
                                   fmt(med([s.get("max_gap_around_join_s") for s in surv]))))
    return "\n".join(lines)


def cmd_recovery(args):
    random.seed(args.seed)
    place = Netns(args.replicas + 1, args.netns_attach) if args.netns else Loopback()
    log_root = tempfile.mkdtemp(prefix="torchft-recovery-")
    result = {"config": vars(args).copy(), "place": place.name, "torchft": torchft_version(),
              "trials": [], "reference": None}
    result["config"].pop("func", None)
    try:
        if args.reference:
            d = os.path.join(log_root, "reference")
            os.makedirs(d)
            ref = run_trial(args, place, False, d)
            s0 = ref["survivors"][0]
            result["reference"] = {"accuracy": s0["accuracy"], "steps": s0["steps"],
                                   "params_sha256": s0["params_sha256"],
                                   "step_s": med([s["step_s_before"] for s in ref["survivors"]])}
            print("reference: accuracy %.2f%%, %d steps, sha %s" %
                  (s0["accuracy"], s0["steps"], s0["params_sha256"][:12]), flush=True)
        for i in range(args.repeat):
            d = os.path.join(log_root, "trial%d" % i)
            os.makedirs(d)
            t = run_trial(args, place, True, d)
            result["trials"].append(t)
            print("trial %d: next %s, redone %s%s" % (
                i, [fmt(s.get("next_s")) if not s.get("failed") else "FAILED: " + s["error"]
                    for s in t["survivors"]],
                [s.get("redone") for s in t["survivors"]],
                ", replacement takes part %s after the kill"
                % fmt(t["replacement"].get("kill_to_takes_part_s")) if "replacement" in t else ""),
                flush=True)
    finally:
        place.close()
    text = summarize(result["trials"], result["reference"])
    print(text)
    result["summary"] = text
    result["logs"] = log_root
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


# ---- steady state: torchft vs torch DDP on gloo --------------------------------------------------

def run_plain(args, place, log_dir):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.replicas):
        k = r + 1
        argv = [sys.executable, SCRIPT, "plain", "--rank", str(r), "--world-size", str(args.replicas),
                "--master", "%s:%d" % (place.addr(1), port), "--events", "--epochs",
                str(args.epochs), "--wait-go"]
        procs.append(Proc("plain%d" % r, place.argv(k, argv), child_env(place, k, args.env), log_dir))
    run_to_done(args, procs)
    return procs


def run_to_done(args, procs):
    """Starts the ranks together once each is ready and waits until every one printed its
    done event and ended; any still running when that fails is SIGKILLed."""
    try:
        wait_ready(procs, args.start_timeout)
        for p in procs:
            p.send("go\n")
            p.close_stdin()
        for p in procs:
            if p.wait_event(lambda e: e["ev"] == "done", args.run_timeout) is None:
                raise RuntimeError("%s did not finish:\n%s" % (p.name, p.stderr_tail()))
            p.stop()
    finally:
        for p in procs:
            if p.popen.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.popen.wait()


def run_torchft(args, place, log_dir):
    lh, address = start_lighthouse(args, place, args.replicas + 1 if place.name == "netns" else 0,
                                   log_dir)
    try:
        procs = [start_replica(args, place, r + 1, r, address, log_dir, "r%d" % r)
                 for r in range(args.replicas)]
        run_to_done(args, procs)
    finally:
        lh.close_stdin()
        lh.stop(5)
    return procs


def run_stats(procs, skip):
    steps = procs[0].of("step")[skip:]
    gaps = step_gaps(steps)
    done = procs[0].of("done")[0]
    phases = [statistics.median(s["ms"][i] for s in steps) for i in range(3)]
    return {"median_step_s": statistics.median(gaps), "mean_step_s": statistics.mean(gaps),
            "phase_median_ms": phases,
            "steps_timed": len(gaps), "steps": done["steps"], "accuracy": done["accuracy"],
            "params_sha256": done["params_sha256"],
            "agree": len({p.of("done")[0]["params_sha256"] for p in procs}) == 1}


def cmd_overhead(args):
    place = Netns(args.replicas + 1) if args.netns else Loopback()
    log_root = tempfile.mkdtemp(prefix="torchft-overhead-")
    runs = {"plain": [], "torchft": []}
    try:
        for i in range(args.repeat):
            for kind, fn in (("plain", run_plain), ("torchft", run_torchft)):
                d = os.path.join(log_root, "%s%d" % (kind, i))
                os.makedirs(d)
                stats = run_stats(fn(args, place, d), args.skip)
                runs[kind].append(stats)
                print("%d %-8s median step %.3f ms, mean %.3f ms over %d steps, accuracy %.2f%%; "
                      "phases (ms) %s" % (i, kind, 1e3 * stats["median_step_s"],
                                          1e3 * stats["mean_step_s"], stats["steps_timed"],
                                          stats["accuracy"], stats["phase_median_ms"]), flush=True)
    finally:
        place.close()
    summary = {k: {"median_of_medians_ms": 1e3 * statistics.median([r["median_step_s"] for r in v]),
                   "median_of_means_ms": 1e3 * statistics.median([r["mean_step_s"] for r in v]),
                   "phase_medians_ms": [statistics.median(r["phase_median_ms"][i] for r in v)
                                        for i in range(3)]}
               for k, v in runs.items()}
    # Within a kind every run should end with the same parameters. Between the kinds they
    # differ in the last bits with 3 ranks: torch DDP divides each gradient by the world
    # size before the sum, torchft's Manager sums and then divides.
    summary["same_parameters_within_kind"] = {
        k: len({r["params_sha256"] for r in v}) == 1 for k, v in runs.items()}
    summary["ratio_torchft_to_plain"] = (summary["torchft"]["median_of_medians_ms"]
                                         / summary["plain"]["median_of_medians_ms"])
    print(json.dumps(summary, indent=1))
    if args.json:
        cfg = vars(args).copy()
        cfg.pop("func", None)
        with open(args.json, "w") as f:
            json.dump({"config": cfg, "place": place.name, "torchft": torchft_version(),
                       "runs": runs, "summary": summary, "logs": log_root}, f, indent=1)


def recovery_medians(d):
    """The medians of one recovery JSON, for the side-by-side table."""
    surv = [s for t in d["trials"] for s in t["survivors"] if not s.get("failed")]
    failed = sum(1 for t in d["trials"] for s in t["survivors"] if s.get("failed"))
    out = {"place": d["place"], "trials": len(d["trials"]),
           "heartbeat_timeout_ms": d["config"]["heartbeat_timeout_ms"],
           "join_timeout_ms": d["config"]["join_timeout_ms"],
           "kill_at": d["config"]["kill_at"], "ddp_hook": d["config"]["ddp_hook"],
           "replace": d["config"]["replace"], "victim": d["config"]["victim"],
           "survivors": len(surv) + failed, "survivors_crashed": failed}
    if surv:
        out.update({
            "kill_to_next_step_s": med([s["next_s"] for s in surv]),
            "kill_to_next_step_s_all": [round(s["next_s"], 3) for s in surv],
            "detect_s": med([s["detect_s"] for s in surv]),
            "kill_to_quorum_s": med([s["quorum_s"] for s in surv]),
            "redone": med([s["redone"] for s in surv]),
            "pids_kept": "%d/%d" % (sum(s["pid_kept"] for s in surv), len(surv)),
            "accuracy": med([s["accuracy"] for s in surv]),
            "steady_step_s": med([s["step_s_before"] for s in surv])})
    if d.get("reference"):
        out["uninterrupted_accuracy"] = d["reference"]["accuracy"]
    reps = [t["replacement"] for t in d["trials"]
            if "replacement" in t and not t["replacement"].get("failed")]
    if reps:
        for key in ("up_s", "ready_s", "ready_to_healed_s", "ready_to_takes_part_s",
                    "takes_part_s", "kill_to_takes_part_s"):
            out["replacement_" + key] = med([r[key] for r in reps])
        out["survivor_step_gap_at_join_s"] = med([s.get("max_gap_around_join_s") for s in surv])
    return out


def cmd_report(args):
    """Medians of every JSON in a results directory, in one JSON (for the side by side)."""
    out = {}
    for name in sorted(os.listdir(args.dir)):
        if not name.endswith(".json") or name == os.path.basename(args.out):
            continue
        with open(os.path.join(args.dir, name)) as f:
            d = json.load(f)
        key = name[:-len(".json")]
        if "trials" in d:
            out[key] = recovery_medians(d)
        elif "runs" in d:
            out[key] = {"place": d["place"], "rust_log": d["config"].get("rust_log"),
                        **{k + "_step_ms": v["median_of_medians_ms"]
                           for k, v in d["summary"].items() if isinstance(v, dict) and
                           "median_of_medians_ms" in v},
                        **{k + "_phases_ms": v["phase_medians_ms"]
                           for k, v in d["summary"].items() if isinstance(v, dict) and
                           "phase_medians_ms" in v},
                        "ratio_torchft_to_plain": d["summary"]["ratio_torchft_to_plain"]}
        out[key]["torchft"] = d.get("torchft")
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


def torchft_version():
    try:
        from importlib.metadata import version
        return {"torchft": version("torchft"), "torch": version("torch")}
    except Exception:  # noqa: BLE001
        return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    for name in ("recovery", "overhead"):
        q = sub.add_parser(name)
        q.add_argument("--replicas", type=int, default=3)
        q.add_argument("--repeat", type=int, default=5)
        q.add_argument("--epochs", type=int, default=12)
        q.add_argument("--netns", action="store_true",
                       help="one replica per network-namespace host, the lighthouse on another")
        q.add_argument("--netns-attach", metavar="FILE",
                       help="with --netns: run on hosts another process made (the JSON of "
                            "tests/harness/hosts.py NetnsHosts.describe())")
        q.add_argument("--min-replicas", type=int, default=2, help="the lighthouse's")
        q.add_argument("--join-timeout-ms", type=int, default=60000)
        q.add_argument("--quorum-tick-ms", type=int, default=100)
        q.add_argument("--heartbeat-timeout-ms", type=int, default=5000)
        q.add_argument("--transport", choices=["http", "pg"], default="http")
        q.add_argument("--ddp-hook", choices=["torchft", "fixed"], default="torchft",
                       help="fixed: torchft's DDP comm hook made to survive a failed "
                            "allreduce (torchft 0.2.0's fails an assert there)")
        q.add_argument("--rust-log", default=None,
                       help="RUST_LOG for the children (torchft logs every step at info)")
        q.add_argument("--start-timeout", type=float, default=180.0)
        q.add_argument("--run-timeout", type=float, default=240.0)
        q.add_argument("--json", help="write every trial here")
        if name == "recovery":
            q.add_argument("--step-sleep", type=float, default=0.05,
                           help="seconds each step sleeps (as the hvdlite example's --step-sleep)")
            q.add_argument("--kill-step", type=int, default=40)
            q.add_argument("--kill-at", choices=["step", "collective"], default="step",
                           help="step: 0..--kill-jitter s after the victim printed --kill-step "
                                "(between steps: the others wait for it in the quorum); "
                                "collective: the victim stops before the allreduce of the step "
                                "after --kill-step and is killed 0.1 s later, while the others "
                                "wait for it inside the gloo allreduce")
            q.add_argument("--kill-jitter", type=float, default=None,
                           help="kill 0..this many seconds after the step (default: --step-sleep)")
            q.add_argument("--victim", type=int, default=None, help="default: the last replica")
            q.add_argument("--replace", action="store_true")
            q.add_argument("--replace-delay", type=float, default=0.0)
            q.add_argument("--no-reference", dest="reference", action="store_false")
            q.add_argument("--seed", type=int, default=1)
        else:
            q.add_argument("--skip", type=int, default=10, help="steps not timed at the start")
    rep = sub.add_parser("report", help="medians of every JSON in a results directory")
    rep.add_argument("dir")
    rep.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.mode == "report":
        return args
    if args.mode == "overhead":
        args.step_sleep = 0.0
    else:
        if args.kill_jitter is None:
            args.kill_jitter = args.step_sleep
        if args.victim is None:
            args.victim = args.replicas - 1
    args.env = {"RUST_LOG": args.rust_log} if args.rust_log else {}
    return args


def main(argv=None):
    args = parse_args(argv)
    {"recovery": cmd_recovery, "overhead": cmd_overhead, "report": cmd_report}[args.mode](args)


if __name__ == "__main__":
    main()
