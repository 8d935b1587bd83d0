"""Recovery from a lost rank on netns hosts with real sshd (root; tests/harness/hosts.py):
hvdlite in place, hvdlite by restart and torchft side by side, and a chaos soak.

    # 5 rounds; each round, in a shuffled order: a digits job on 3 hosts under
    # hvdrun --recovery in-place, the same under --recovery restart, and torchft's
    # digits job (3 replica groups, bench/torchft_recovery.py, its default heartbeat
    # and a 500 ms one); the rank on host 3 SIGKILLed 0-0.05 s after step 40
    python bench/elastic_recovery.py side --repeat 5 --json out.json
    # 10 minutes on 4 hosts in place: a random rank SIGKILLed every ~60 s, its host
    # back after hvdrun's blacklist cool-down (a new rank joins at a commit)
    python bench/elastic_recovery.py soak --minutes 10 --json soak.json

Every trial records, from rank 0's events (examples/pytorch_elastic_digits.py
--events, a commit every step): the time from the kill to the next completed
step, the batches done again, whether the survivors kept their processes, the
final accuracy and whether every rank ends with the same parameters; next to an
uninterrupted run of each mode. The torchft trials run bench/torchft_recovery.py
with --torchft-python (torchft's venv) on the same hosts (--netns-attach).

The soak records every kill (victim, time to the next step, time until the job
is back to full size), the resident memory of every rank process every few
seconds (the survivors' growth from their first minute to the end), and the
final accuracy against an uninterrupted run of the same length.
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
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLE = os.path.join(REPO, "examples", "pytorch_elastic_digits.py")
sys.path.insert(0, os.path.join(REPO, "tests"))

from harness.hosts import NetnsHosts, hvdrun_env, missing_requirements  # noqa: E402
from harness.hvdrun_job import HvdrunJob  # noqa: E402


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


class Job(HvdrunJob):
    """hvdrun on host 1 running the elastic digits example with --events."""

    def __init__(self, hosts, hvdrun_args, script_args, timeout):
        base, env = hvdrun_env(hosts, {"HVDLITE_TIMEOUT_SECONDS": "3"})
        argv = hosts.on_host(1, base + ["-i", hosts.key, "--ssh-connect-timeout", "1"] + hvdrun_args +
                             [sys.executable, EXAMPLE, "--events", "--commit-every", "1"] + script_args,
                             cwd=REPO)
        super().__init__(argv, env, timeout, cwd=REPO)

    def events(self, kind=None, rank=None):
        return [e for e in self.json_events(kind) if rank is None or e["rank"] == rank]

    def live_pids(self):
        pids = []
        for e in self.events("start"):
            try:
                os.kill(e["pid"], 0)
                pids.append(e["pid"])
            except ProcessLookupError:
                pass
        return pids


def recovery(job, killed_at, victims):
    """(seconds from the kill to rank 0's next step, batches redone, survivors kept their processes)."""
    begins = [e for e in job.events("begin") if e["t"] > killed_at]
    if not begins:
        return None, None, False
    resumed = begins[0]["step"]
    before = [e["step"] for e in job.events("step", 0) if e["t"] < begins[0]["t"]]
    after = [e["t"] for e in job.events("step", 0) if e["t"] > begins[0]["t"]]
    first_pids = {e["pid"] for e in job.events("start") if e["t"] < killed_at}
    kept = {e["pid"] for e in begins} >= first_pids - set(victims)
    return (min(after) - killed_at if after else None), (max(before) - resumed if before else None), kept


def hvdlite_trial(hosts, mode, kill, args):
    job = Job(hosts, ["--min-np", "2", "-H", ",".join(hosts.names[:3]), "--recovery", mode],
              ["--epochs", str(args.epochs), "--step-sleep", str(args.step_sleep)], args.run_timeout)
    out = {"mode": mode}
    victims = []
    if kill:
        job.wait_for(lambda: [e for e in job.events("step", 0) if e["step"] >= args.kill_step],
                     "step %d" % args.kill_step)
        time.sleep(random.uniform(0, args.kill_jitter))
        victims = [e["pid"] for e in job.events("start") if e["host"] == hosts.names[2]]
        killed_at = time.time()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
    job.wait()
    done = job.events("done")
    out.update(rc=job.rc, ranks=len(done), accuracy=done[0]["accuracy"] if done else None,
               same_params=len({e["params_sha256"] for e in done}) == 1 and bool(done),
               steps=done[0]["steps"] if done else None)
    if kill:
        out["next_s"], out["redone"], out["kept_processes"] = recovery(job, killed_at, victims)
    if job.rc != 0:
        out["error"] = job.stderr_text()[-3000:]
    return out


def torchft_trial(hosts_file, heartbeat_ms, kill, args, log_dir):
    path = os.path.join(log_dir, "torchft-%d-%d-%s.json" % (heartbeat_ms, kill, time.time()))
    cmd = [args.torchft_python, os.path.join(HERE, "torchft_recovery.py"), "recovery", "--netns",
           "--netns-attach", hosts_file, "--repeat", "1" if kill else "0", "--epochs", str(args.epochs),
           "--step-sleep", str(args.step_sleep), "--kill-step", str(args.kill_step),
           "--kill-jitter", str(args.kill_jitter), "--heartbeat-timeout-ms", str(heartbeat_ms),
           "--json", path, "--seed", str(random.randrange(1 << 30))]
    if kill:
        cmd.append("--no-reference")
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=args.run_timeout + 120)
    out = {"mode": "torchft-hb%d" % heartbeat_ms}
    if p.returncode != 0 or not os.path.exists(path):
        out["error"] = (p.stdout + p.stderr)[-3000:]
        return out
    with open(path) as f:
        d = json.load(f)
    if not kill:
        ref = d["reference"]
        out.update(accuracy=ref["accuracy"], steps=ref["steps"], same_params=True)
        return out
    t = d["trials"][0]
    surv = t["survivors"]
    accs = [s.get("accuracy") for s in surv]
    # Its rank 0's view, as for hvdlite: the first survivor's next step.
    first = next((s for s in surv if not s.get("failed")), {})
    out.update(next_s=first.get("next_s"),
               redone=max((s.get("redone") or 0 for s in surv), default=None),
               kept_processes=all(s.get("pid_kept", False) for s in surv),
               accuracy=accs[0] if accs else None,
               same_params=len({s.get("params_sha256") for s in surv}) == 1,
               failed=[s["error"] for s in surv if s.get("failed")])
    return out


def summarize_side(result):
    lines = ["%-16s %6s %10s %8s %8s %8s %10s %16s" % ("mode", "trials", "next (s)", "min", "max", "redone",
                                                        "kept", "accuracy (ref)")]
    for mode in result["modes"]:
        ts = [t for t in result["trials"] if t["mode"] == mode]
        ok = [t for t in ts if t.get("next_s") is not None]
        nexts = [t["next_s"] for t in ok]
        ref = result["reference"].get(mode, {})
        kept = [t.get("kept_processes") for t in ts]
        lines.append("%-16s %6d %10s %8s %8s %8s %8s %16s" % (
            mode, len(ts), "%.2f" % med(nexts) if nexts else "-",
            "%.2f" % min(nexts) if nexts else "-", "%.2f" % max(nexts) if nexts else "-",
            "%s" % max((t.get("redone") or 0 for t in ok), default="-"),
            "%d/%d" % (sum(1 for k in kept if k), len(ts)),
            "%.2f (%.2f)" % (med([t.get("accuracy") for t in ts]) or 0, ref.get("accuracy") or 0)))
        bad = [t for t in ts if t.get("error") or t.get("failed") or not t.get("same_params")]
        if bad:
            lines.append("    %d trial(s) with an error or differing parameters" % len(bad))
    return "\n".join(lines)


def cmd_side(args):
    random.seed(args.seed)
    hosts = NetnsHosts(4).up()
    log_dir = tempfile.mkdtemp(prefix="elastic-recovery-")
    hosts_file = os.path.join(log_dir, "hosts.json")
    with open(hosts_file, "w") as f:
        json.dump(hosts.describe(), f)
    modes = ["in-place", "restart"] + ["torchft-hb%d" % hb for hb in args.torchft_heartbeats_ms]
    if not args.torchft_python:
        modes = modes[:2]
    result = {"config": {k: v for k, v in vars(args).items() if k != "func"}, "modes": modes,
              "reference": {}, "trials": []}

    def trial(mode, kill):
        if mode.startswith("torchft"):
            return torchft_trial(hosts_file, int(mode[len("torchft-hb"):]), kill, args, log_dir)
        return hvdlite_trial(hosts, mode, kill, args)
    try:
        for mode in modes:
            result["reference"][mode] = trial(mode, False)
            print("uninterrupted %-14s %s" % (mode, json.dumps(result["reference"][mode])[:300]), flush=True)
        for i in range(args.repeat):
            order = list(modes)
            random.shuffle(order)
            for mode in order:
                t = trial(mode, True)
                t["round"] = i
                result["trials"].append(t)
                print("round %d %-14s next %s s, redone %s, kept %s, accuracy %s%s" % (
                    i, mode, "%.3f" % t["next_s"] if t.get("next_s") is not None else "-", t.get("redone"),
                    t.get("kept_processes"), t.get("accuracy"), ", ERROR" if t.get("error") else ""),
                    flush=True)
    finally:
        hosts.down()
    result["summary"] = summarize_side(result)
    print(result["summary"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def cmd_soak(args):
    random.seed(args.seed)
    hosts = NetnsHosts(4).up()
    # A step of ~(compute + sleep); the job should last --minutes on 3-4 ranks.
    steps_per_epoch = 1347 // (32 * 4)
    epochs = max(1, int(args.minutes * 60 / (steps_per_epoch * (args.step_sleep + 0.04))))
    hvdrun_args = ["--min-np", "2", "--max-np", "4", "-H", ",".join(hosts.names), "--recovery", "in-place",
                   "--blacklist-cooldown-range", str(args.cooldown_s), str(args.cooldown_s)]
    result = {"config": {k: v for k, v in vars(args).items() if k != "func"}, "epochs": epochs, "kills": []}
    try:
        ref = Job(hosts, hvdrun_args, ["--epochs", str(epochs)], args.minutes * 60 * 3)
        ref.wait()
        done = ref.events("done")
        result["reference"] = {"rc": ref.rc, "accuracy": done[0]["accuracy"] if done else None,
                               "steps": done[0]["steps"] if done else None}
        print("uninterrupted: %s" % result["reference"], flush=True)
        started = time.time()
        job = Job(hosts, hvdrun_args, ["--epochs", str(epochs), "--step-sleep", str(args.step_sleep)],
                  args.minutes * 60 * 3)
        job.wait_for(lambda: job.events("step", 0), "the first step")
        rss = {}                # pid -> [(t, kB)]
        next_kill = time.time() + random.uniform(0.75, 1.25) * args.kill_every_s
        last_sample = 0
        while job.proc.poll() is None:
            now = time.time()
            if now - last_sample >= args.sample_s:
                last_sample = now
                for pid in job.live_pids():
                    kb = rss_kb(pid)
                    if kb is not None:
                        rss.setdefault(pid, []).append((now - started, kb))
            if now >= next_kill and not job.events("done"):
                # Members only: ranks that began training (not one still starting up).
                began = {e["pid"] for e in job.events("begin")}
                pids = [p for p in job.live_pids() if p in began]
                starts = {e["pid"]: e for e in job.events("start")}
                size = max((e["size"] for e in job.events("step", 0)[-1:]), default=4)
                if len(pids) >= 2:
                    victim = random.choice(pids)
                    killed_at = time.time()
                    os.kill(victim, signal.SIGKILL)
                    kill = {"t": killed_at - started, "pid": victim, "host": starts[victim]["host"],
                            "size_before": size}
                    result["kills"].append(kill)
                    print("kill %d at %.0f s: pid %d on %s (%d ranks)" % (
                        len(result["kills"]), kill["t"], victim, kill["host"], size), flush=True)
                next_kill = time.time() + random.uniform(0.75, 1.25) * args.kill_every_s
            time.sleep(0.2)
        job.wait()
        steps0 = job.events("step", 0)
        for kill in result["kills"]:
            t = kill["t"] + started
            after = [e for e in steps0 if e["t"] > t]
            smaller = [e for e in after if e["size"] < kill["size_before"]]
            kill["next_step_s"] = smaller[0]["t"] - t if smaller else None
            back = [e for e in after if e["size"] >= kill["size_before"]
                    and (not smaller or e["t"] > smaller[0]["t"])]
            kill["full_size_again_s"] = back[0]["t"] - t if back else None
        done = job.events("done")
        result.update(rc=job.rc, minutes=(time.time() - started) / 60,
                      accuracy=done[0]["accuracy"] if done else None,
                      same_params=len({e["params_sha256"] for e in done}) == 1 and bool(done),
                      ranks_at_end=len(done), ranks_started=len(job.events("start")))
        growth = {}
        for pid, samples in rss.items():
            warm = [kb for t, kb in samples if t - samples[0][0] >= 60]
            if len(warm) >= 2 and samples[-1][0] - samples[0][0] >= 120:
                growth[pid] = {"first_minute_kb": warm[0], "end_kb": warm[-1], "growth_kb": warm[-1] - warm[0],
                               "lived_s": samples[-1][0] - samples[0][0]}
        result["rss"] = growth
        if job.rc != 0:
            result["error"] = job.stderr_text()[-4000:]
    finally:
        hosts.down()
    lines = ["soak: %.1f min, rc %s, %d kills, %d rank processes started, %d ranks at the end"
             % (result.get("minutes", 0), result.get("rc"), len(result["kills"]), result.get("ranks_started", 0),
                result.get("ranks_at_end", 0)),
             "accuracy %s%% (uninterrupted %s%%), same parameters on every rank: %s"
             % (result.get("accuracy"), result["reference"]["accuracy"], result.get("same_params"))]
    for i, k in enumerate(result["kills"]):
        lines.append("  kill %d at %5.0f s on %s (%d ranks): next step %s s, full size again %s s" % (
            i + 1, k["t"], k["host"], k["size_before"],
            "%.2f" % k["next_step_s"] if k.get("next_step_s") is not None else "-",
            "%.1f" % k["full_size_again_s"] if k.get("full_size_again_s") is not None else "-"))
    for pid, g in sorted(result.get("rss", {}).items(), key=lambda kv: -kv[1]["lived_s"]):
        lines.append("  rss of pid %d over %.0f s: %d -> %d kB (%+d kB)" % (
            pid, g["lived_s"], g["first_minute_kb"], g["end_kb"], g["growth_kb"]))
    result["summary"] = "\n".join(lines)
    print(result["summary"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    side = sub.add_parser("side", help="in place, restart and torchft, interleaved")
    side.add_argument("--repeat", type=int, default=5)
    side.add_argument("--epochs", type=int, default=12)
    side.add_argument("--step-sleep", type=float, default=0.05)
    side.add_argument("--kill-step", type=int, default=40)
    side.add_argument("--kill-jitter", type=float, default=0.05)
    side.add_argument("--torchft-python", default=None,
                      help="the Python of a venv with torchft (none: hvdlite's modes only)")
    side.add_argument("--torchft-heartbeats-ms", type=int, nargs="*", default=[5000, 500],
                      help="torchft lighthouse heartbeat timeouts to run (5000: its default)")
    side.add_argument("--run-timeout", type=float, default=300.0)
    side.add_argument("--seed", type=int, default=1)
    side.add_argument("--json")
    side.set_defaults(func=cmd_side)
    soak = sub.add_parser("soak", help="chaos: a random rank killed every ~60 s, its host back later")
    soak.add_argument("--minutes", type=float, default=10.0)
    soak.add_argument("--kill-every-s", type=float, default=60.0)
    soak.add_argument("--cooldown-s", type=float, default=10.0,
                      help="hvdrun's --blacklist-cooldown-range: a killed rank's host is back after this")
    soak.add_argument("--step-sleep", type=float, default=0.2)
    soak.add_argument("--sample-s", type=float, default=5.0, help="resident memory sampled this often")
    soak.add_argument("--seed", type=int, default=1)
    soak.add_argument("--json")
    soak.set_defaults(func=cmd_soak)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    reasons = missing_requirements()
    if reasons:
        raise SystemExit("cannot make netns hosts (run as root): " + "; ".join(reasons))
    args.func(args)


if __name__ == "__main__":
    main()
