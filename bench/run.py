"""Runs hvdlite's benchmark suite and writes the results, a Markdown report and plots.

    python -m hvdlite.bench                        # everything (16-25 minutes on 2 vCPUs, the emulated-host cases included)
    python -m hvdlite.bench --cases allreduce,train_step
    python -m hvdlite.bench --cases hosts,autotune       # between emulated hosts; autotune vs a sweep
    python -m hvdlite.bench --cases diloco               # DiLoCo vs compression, an LM (named only: 1-2 hours)
    python -m hvdlite.bench --tiny --out-dir /tmp/b   # seconds: the smoke test's run
    python -m hvdlite.bench --report bench/results/2026-11-23-5.json   # the report of a JSON

(``python bench/run.py ...`` is the same.) Every case runs real ranks through
hvdrun; each contender inside a case is interleaved with its peers (a rotating
order every round) and reported as the median of the slowest rank's times, with
min and max, and as ratios to peers measured in the same run. Writes
``bench/results/<date>.json``, its report ``bench/results/<date>.md`` and
``docs/img/bench_*.png`` (or ``results/``, ``benchmarks.md`` and ``img/`` under
``--out-dir``). docs/benchmarks.md is written by hand: it quotes the current
result of each topic and names the file it comes from. SIGTERM, SIGINT or
SIGHUP stop the bench cleanly (exit status 128 + the signal): the running job's
ranks are stopped through hvdrun and emulated hosts come down.
"""
import argparse
import datetime
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

if __name__ == "__main__" and not __package__:   # python bench/run.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "bench"
    import bench  # noqa: F401

from . import kernels, report  # noqa: E402
from ._stats import load_average, summary  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
ALLREDUCE = os.path.join(BENCH, "allreduce.py")
TRAIN = os.path.join(BENCH, "train_step.py")
BREAKDOWN = os.path.join(BENCH, "breakdown.py")
ACCURACY = os.path.join(BENCH, "compression_accuracy.py")
DILOCO = os.path.join(BENCH, "diloco.py")
LM_STEP_TIME = os.path.join(BENCH, "lm_step_time.py")
CASES = ["allreduce", "train_step", "ddp", "kernels", "network", "hosts", "hosts_train", "scaling",
         "negotiation", "sweep", "autotune", "compression", "diloco"]
TINY_CASES = ["allreduce", "train_step", "sweep"]
# Cases that train to convergence (an hour or more): run only when named.
LONG_CASES = ["diloco"]

FULL = dict(
    scale=1.0, r50_iters=15, small_iters=60,
    layers=6, width=2048, batch=64, train_rounds=16, train_steps=4, warmup=3,
    kernel_floats=25557032, kernel_reps=7, kernel_runs=3,
    net_iters=8, net_train_rounds=4, net_train_steps=3,
    scaling_ranks=[1, 2, 4], scaling_rounds=2, scaling_r50_iters=5, scaling_train_rounds=3,
    scaling_train_steps=3,
    neg_ranks=[2, 4, 8], neg_iters=150, neg_tensors="1,32",
    sweep_fusion="0,1MB,4MB,16MB,64MB", sweep_cycle="0,0.25,1,5", sweep_rounds=4,
    sweep_r50_calls=2, sweep_small_calls=10,
    sweep_train="1MB:1,4MB:1,16MB:1,64MB:1,64MB:0.25,64MB:5,4MB:0.25,4MB:5",
    sweep_train_rounds=4, sweep_train_steps=3,
    breakdown_calls=3,
    hosts_layouts="2x2,4x1,4x2", hosts_iters=7, hosts_allgather_mb=8.0,
    hosts_train_layouts="2x2,4x1,4x2", hosts_train_rounds=4, hosts_train_steps=2,
    ddp_rounds=12, ddp_steps=4, ddp_layouts="2x2,4x1", ddp_hosts_rounds=4, ddp_hosts_steps=2,
    autotune_sweep="1MB:0.5,1MB:1,1MB:5,4MB:0.5,4MB:1,4MB:5,16MB:0.5,16MB:1,16MB:5,64MB:0.5,64MB:1,64MB:5",
    autotune_rounds=4, autotune_steps=3, autotune_steps_per_sample=3, autotune_layout="",
    accuracy_np=4, accuracy_epochs=12, accuracy_seeds="42,1,2",
    diloco_np=4, diloco_model="", diloco_steps=150, diloco_eval_every=25,
    diloco_runs="sync,dgcx2,powersgdx2,diloco50x3,diloco50qx3,streaming50x3", diloco_layouts="4x1",
    diloco_rates="1gbit,100mbit", diloco_conv_runs="sync,diloco10,diloco50,diloco100",
    diloco_conv_steps=3000, diloco_conv_eval_every=250, diloco_conv_model="--d-model 192",
    diloco_chart_models="128,192,256,384,512,768",
    job_timeout=2400,
)
# The language model of the diloco case cut to a smoke test's size.
TINY_LM = "--d-model 32 --layers 1 --heads 2 --seq-len 16 --data-mb 0.2 --eval-windows 8"
TINY = dict(
    scale=0.01, r50_iters=2, small_iters=4,
    layers=2, width=128, batch=8, train_rounds=2, train_steps=2, warmup=1,
    kernel_floats=200000, kernel_reps=2, kernel_runs=1,
    net_iters=2, net_train_rounds=1, net_train_steps=2,
    scaling_ranks=[1, 2], scaling_rounds=1, scaling_r50_iters=2, scaling_train_rounds=1,
    scaling_train_steps=2,
    neg_ranks=[2], neg_iters=10, neg_tensors="1,8",
    sweep_fusion="0,4MB", sweep_cycle="1", sweep_rounds=1, sweep_r50_calls=1, sweep_small_calls=2,
    sweep_train="4MB:1", sweep_train_rounds=1, sweep_train_steps=1,
    breakdown_calls=1,
    hosts_layouts="2x1", hosts_iters=1, hosts_allgather_mb=0.5,
    hosts_train_layouts="2x1", hosts_train_rounds=1, hosts_train_steps=1,
    ddp_rounds=1, ddp_steps=2, ddp_layouts="", ddp_hosts_rounds=1, ddp_hosts_steps=1,
    autotune_sweep="1MB:1,64MB:1", autotune_rounds=1, autotune_steps=1, autotune_steps_per_sample=1,
    autotune_layout="",
    accuracy_np=2, accuracy_epochs=1, accuracy_seeds="42",
    diloco_np=2, diloco_model=TINY_LM, diloco_steps=20, diloco_eval_every=5,
    diloco_runs="sync,dgc,powersgd,diloco5,streaming5", diloco_layouts="", diloco_rates="1gbit",
    diloco_conv_runs="sync,diloco5,diloco10", diloco_conv_steps=20, diloco_conv_eval_every=5,
    diloco_conv_model=TINY_LM,
    diloco_chart_models="16,32",
    job_timeout=300,
)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m hvdlite.bench",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="cases: " + ", ".join(CASES))
    ap.add_argument("--cases", default=None,
                    help="comma list (default: all but %s; with --tiny: %s)"
                    % (",".join(LONG_CASES), ",".join(TINY_CASES)))
    ap.add_argument("--tiny", action="store_true",
                    help="few iterations, small sizes, no network case (a smoke run)")
    ap.add_argument("--np", type=int, default=2, help="ranks of the main cases (default 2)")
    ap.add_argument("--out-dir", help="write results/, benchmarks.md and img/ here instead of "
                    "bench/results/<date>.json, the report beside it (<date>.md) and docs/img")
    ap.add_argument("--rate", default="1gbit", help="emulated link rate (network case)")
    ap.add_argument("--delay", default=None, help="emulated one-way delay, e.g. 100us (network case)")
    ap.add_argument("--report", metavar="JSON", help="only write the Markdown and plots from a results JSON")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a profile setting (e.g. r50_iters=30); see bench/run.py")
    ap.add_argument("--keep-logs", action="store_true", help="keep the ranks' output (printed path)")
    return ap.parse_args(argv)


# ---- paths ---------------------------------------------------------------------------

def output_paths(args):
    """(results directory, report path, image directory); a report path of None
    means: beside the results JSON, with the same name ending in .md."""
    if args.out_dir:
        base = os.path.abspath(args.out_dir)
        return os.path.join(base, "results"), os.path.join(base, "benchmarks.md"), os.path.join(base, "img")
    if args.tiny:
        base = os.path.join(tempfile.gettempdir(), "hvdlite-bench-tiny")
        return os.path.join(base, "results"), os.path.join(base, "benchmarks.md"), os.path.join(base, "img")
    return os.path.join(BENCH, "results"), None, os.path.join(REPO, "docs", "img")


def report_path(doc, json_path):
    return doc if doc is not None else os.path.splitext(os.path.abspath(json_path))[0] + ".md"


def results_file(results_dir):
    os.makedirs(results_dir, exist_ok=True)
    day = datetime.date.today().isoformat()
    path = os.path.join(results_dir, day + ".json")
    k = 2
    while os.path.exists(path):
        path = os.path.join(results_dir, "%s-%d.json" % (day, k))
        k += 1
    return path


# ---- running jobs ---------------------------------------------------------------------

def hvdrun_argv():
    """argv prefix that runs hvdrun (the one of this tree), and extra environment."""
    try:
        spec = importlib.util.find_spec("hvdlite.launcher")
    except ImportError:
        spec = None
    here = os.path.join(REPO, "launcher", "__main__.py")
    if spec is not None and spec.origin and os.path.dirname(os.path.dirname(spec.origin)) == REPO:
        return [sys.executable, "-m", "hvdlite.launcher"], {}
    if os.path.exists(here):   # a checkout that is not the installed one (or not installed)
        return [sys.executable, "-m", "launcher"], {"PYTHONPATH": REPO}
    return [sys.executable, "-m", "hvdlite.launcher"], {}


def mpi_flavour():
    try:
        from hvdlite import _build_info
        return _build_info.MPI_FLAVOUR
    except ImportError:
        return "unknown"


def local_env():
    """Settings for every local job: 1 compute thread per rank, shared memory for MPICH."""
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}
    if mpi_flavour() == "mpich":
        env["UCX_TLS"] = os.environ.get("UCX_TLS", "self,sm")
    return env


class Runner:
    def __init__(self, log_dir, timeout):
        self.log_dir, self.timeout = log_dir, timeout
        self.count = 0

    def job(self, np, script, args, env=None, hvdrun_args=(), wrap=None, timeout=None):
        """Run ``script args`` on np ranks through hvdrun; return the JSON it wrote."""
        self.count += 1
        tag = "%02d-%s-np%d" % (self.count, os.path.basename(script).split(".")[0], np)
        out = os.path.join(self.log_dir, tag + ".json")
        log = os.path.join(self.log_dir, tag + ".log")
        prefix, extra = hvdrun_argv()
        argv = prefix + ["-np", str(np)] + list(hvdrun_args) + [sys.executable, script] + list(args) + \
            ["--json", out]
        if wrap:
            argv = wrap(argv)
        full_env = dict(os.environ)
        full_env.update(extra)
        full_env.update(local_env())
        full_env.update(env or {})
        with open(log, "w") as f:
            f.write("$ %s\n" % " ".join(shlex.quote(a) for a in argv))
            f.flush()
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
            try:
                rc = proc.wait(timeout=timeout or self.timeout)
            except subprocess.TimeoutExpired:
                rc = "timeout"
                stop_job(proc)
            except BaseException:   # the bench told to stop (stop_on_signal): its job first
                stop_job(proc)
                raise
        if rc != 0 or not os.path.exists(out):
            with open(log) as f:
                tail = f.read()[-2500:]
            raise RuntimeError("job %s failed (%s); log %s:\n%s" % (tag, rc, log, tail))
        with open(out) as f:
            return json.load(f)


def stop_job(proc, grace=30):
    """Asks hvdrun to end its job (SIGTERM: it stops its ranks, here or over ssh), then
    kills it if it has not within ``grace`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_on_signal(signum, _frame):
    """SIGTERM, SIGINT and SIGHUP end the bench through its cleanups: the running job is
    stopped (Runner.job) and emulated hosts come down (over_layouts). SIGINT is taken
    too when the shell started the bench in the background with it ignored."""
    raise SystemExit(128 + signum)


def progress(msg):
    print(msg, flush=True)


# ---- the cases -------------------------------------------------------------------------

def sweep_args(P):
    return ["--sweep-fusion", P["sweep_fusion"], "--sweep-cycle", P["sweep_cycle"],
            "--sweep-rounds", str(P["sweep_rounds"]), "--sweep-r50-calls", str(P["sweep_r50_calls"]),
            "--sweep-small-calls", str(P["sweep_small_calls"])]


def train_args(P, rounds=None, steps=None):
    return ["--layers", str(P["layers"]), "--width", str(P["width"]), "--batch", str(P["batch"]),
            "--rounds", str(rounds or P["train_rounds"]), "--steps", str(steps or P["train_steps"]),
            "--warmup", str(P["warmup"])]


def case_allreduce(R, P, args, tiny):
    a = ["--cases", "resnet50,small", "--iters", str(P["r50_iters"]), "--small-iters", str(P["small_iters"]),
         "--scale", str(P["scale"])]
    if tiny:
        a += ["--skip-gloo"]
    res = R.job(args.np, ALLREDUCE, a)
    if not tiny:
        res["breakdown"] = breakdown(R, args.np, P)
    return res


def breakdown(R, np, P, **kw):
    """The timeline breakdown is an explanation, not a result: a failure is recorded, not fatal."""
    try:
        return R.job(np, BREAKDOWN, ["--calls", str(P["breakdown_calls"]), "--scale", str(P["scale"])],
                     **kw)["breakdown"]
    except RuntimeError as e:
        progress("      breakdown failed: %s" % str(e).splitlines()[0])
        return {"error": str(e)[-2000:]}


def case_train(R, P, args, tiny):
    modes = "nocomm,hvdlite,mpi4py,ddp,ddp-hvdlite,horovod" if not tiny else "nocomm,hvdlite,horovod"
    return R.job(args.np, TRAIN, train_args(P) + ["--modes", modes, "--compression", "fp16",
                                                  "--engine-priorities", "normal"])


DDP_MODES = "nocomm,ddp-local,ddp,ddp-hvdlite,fsdp,fsdp-hvdlite,hvdlite,horovod"
# One host also runs DDP as tuned for speed (gradient_as_bucket_view=True, 16 MB
# buckets): DDP's reducer then copies no gradient, which 2 ranks on 2 cores feel.
DDP_MODES_ONE_HOST = ("nocomm,ddp-local,ddp-local-tuned,ddp,ddp-tuned,ddp-hvdlite,ddp-hvdlite-tuned,"
                      "fsdp,fsdp-hvdlite,hvdlite,horovod")


def case_ddp(R, P, args, tiny):
    """A DDP script's train step on hvdlite's torch.distributed backend against DDP on gloo,
    DDP's reducer with no communication, the same model under FSDP2 on either backend,
    hvdlite's Horovod API and Horovod 0.28.1 (when installed), interleaved: on this host,
    then between emulated hosts (one job per layout)."""
    out = {"one_host": R.job(args.np, TRAIN, train_args(P, P["ddp_rounds"], P["ddp_steps"]) +
                             ["--modes", DDP_MODES_ONE_HOST])}
    if P["ddp_layouts"]:
        out["hosts"] = over_layouts(
            args, P["ddp_layouts"], "ddp",
            lambda n_hosts, per_host, hv, env, wrap: R.job(
                n_hosts * per_host, TRAIN, train_args(P, P["ddp_hosts_rounds"], P["ddp_hosts_steps"]) +
                ["--modes", DDP_MODES], env=env, hvdrun_args=hv, wrap=wrap))
    return out


def case_kernels(R, P, args, tiny):
    res = kernels.run(P["kernel_floats"], P["kernel_reps"], P["kernel_runs"],
                      progress=lambda i, n: progress("      kernels run %d/%d done" % (i, n)))
    return res


def case_sweep(R, P, args, tiny):
    out = {"allreduce": R.job(args.np, ALLREDUCE, ["--cases", "sweep", "--scale", str(P["scale"]),
                                                   "--no-horovod"] + sweep_args(P))}
    out["train_step"] = R.job(args.np, TRAIN, train_args(P, P["sweep_train_rounds"], P["sweep_train_steps"]) +
                              ["--modes", "nocomm,hvdlite", "--hvdlite-settings", P["sweep_train"]])
    return out


def _merge(runs):
    """Merge per-contender samples of repeated jobs into one summary each."""
    merged = {}
    for r in runs:
        for name, v in r.items():
            merged.setdefault(name, []).extend(v["samples_ms"])
    return {name: summary(s) for name, s in merged.items()}


def case_scaling(R, P, args, tiny):
    ranks = P["scaling_ranks"]
    r50_runs = {n: [] for n in ranks}
    train_runs = {n: [] for n in ranks}
    contenders = "mpi4py unfused,mpi4py 25 MB,hvdlite none,torch gloo"
    for rnd in range(P["scaling_rounds"]):
        for n in ranks:
            a = ["--cases", "resnet50", "--contenders", contenders, "--iters", str(P["scaling_r50_iters"]),
                 "--scale", str(P["scale"]), "--no-horovod"]
            if tiny:
                a.append("--skip-gloo")
            r50_runs[n].append(R.job(n, ALLREDUCE, a)["resnet50"])
            modes = "nocomm,hvdlite" + ("" if tiny else ",ddp")
            t = R.job(n, TRAIN, train_args(P, P["scaling_train_rounds"], P["scaling_train_steps"]) +
                      ["--modes", modes])
            train_runs[n].append({k: v for k, v in t["modes"].items()})
            progress("      scaling round %d/%d: %d ranks done (load %s)"
                     % (rnd + 1, P["scaling_rounds"], n, load_average()))
    out = {"ranks": ranks, "cpus": os.cpu_count(), "rounds": P["scaling_rounds"], "resnet50": {}, "train_step": {}}
    for n in ranks:
        out["resnet50"][str(n)] = _merge(r50_runs[n])
        out["train_step"][str(n)] = _merge(train_runs[n])
    return out


def case_negotiation(R, P, args, tiny):
    out = {"ranks": P["neg_ranks"], "cpus": os.cpu_count(), "tensors": P["neg_tensors"], "by_ranks": {}}
    for n in P["neg_ranks"]:
        iters = max(10, P["neg_iters"] * 2 // max(2, n))   # oversubscribed steps are slow
        r = R.job(n, ALLREDUCE, ["--cases", "negotiation", "--neg-iters", str(iters),
                                 "--neg-tensors", P["neg_tensors"], "--no-horovod"])
        out["by_ranks"][str(n)] = r["negotiation"]
        progress("      negotiation: %d ranks done (load %s)" % (n, load_average()))
    return out


def load_fixture():
    tests = os.path.join(REPO, "tests")
    if not os.path.exists(os.path.join(tests, "harness", "hosts.py")):
        return None, "tests/harness/hosts.py not found (run from a checkout)"
    if tests not in sys.path:
        sys.path.insert(0, tests)  # the test harness package
    return importlib.import_module("harness.hosts"), None


def emulated_hosts(count, args):
    """(up NetnsHosts of `count` hosts with links shaped to --rate/--delay, None), or
    (None, why they cannot be made here)."""
    fixture, why = load_fixture()
    if fixture is None:
        return None, why
    reasons = fixture.missing_requirements()
    if shutil.which("tc") is None:
        reasons.append("missing tc (iproute2)")
    if reasons:
        return None, "cannot make emulated hosts: %s" % "; ".join(reasons)
    return fixture.NetnsHosts(count, rate=args.rate, delay=args.delay).up(), None


def case_network(R, P, args, tiny):
    hosts, why = emulated_hosts(2, args)
    if hosts is None:
        return {"skipped": why}
    try:
        n1, n2 = hosts.names
        hv = ["-H", "%s:1,%s:1" % (n1, n2), "-i", hosts.key]
        env = {"PATH": hosts.bin_dir + os.pathsep + os.environ["PATH"], "UCX_TLS": "tcp,self"}
        wrap = lambda argv: hosts.on_host(1, argv, cwd=REPO)  # noqa: E731
        before = hosts.link_bytes(2)
        r = R.job(2, ALLREDUCE, ["--cases", "resnet50", "--iters", str(P["net_iters"]), "--scale", str(P["scale"]),
                                 "--contenders", "mpi4py unfused,mpi4py 25 MB,hvdlite", "--skip-gloo",
                                 "--no-horovod"], env=env, hvdrun_args=hv, wrap=wrap)
        mid = hosts.link_bytes(2)
        progress("      network: allreduce done (load %s)" % load_average())
        bd = breakdown(R, 2, P, env=env, hvdrun_args=hv, wrap=wrap)
        t = R.job(2, TRAIN, train_args(P, P["net_train_rounds"], P["net_train_steps"]) +
                  ["--modes", "nocomm,hvdlite", "--compression", "fp16,bf16,topk,dgc,powersgd"],
                  env=env, hvdrun_args=hv, wrap=wrap)
        after = hosts.link_bytes(2)
    finally:
        hosts.down()
    return {"rate": args.rate, "delay": args.delay, "hosts": 2, "ranks_per_host": 1,
            "ucx_tls": "tcp,self", "resnet50": r["resnet50"], "resnet50_meta": r.get("meta"),
            "train_step": t, "breakdown": bd,
            "host2_link_bytes": {"allreduce_rx_tx": [mid[0] - before[0], mid[1] - before[1]],
                                 "train_rx_tx": [after[0] - mid[0], after[1] - mid[1]]}}


def parse_layouts(text):
    """'2x2,4x1' -> [(2, 2), (4, 1)]: hosts x ranks per host."""
    return [tuple(int(x) for x in spec.split("x")) for spec in text.split(",")]


def hosts_contenders(per_host):
    """The ResNet-50 contenders of one layout: the floor, MPICH's schedules, hvdlite as
    configured by default, and hvdlite's other wires between hosts (as --hvdlite-env)."""
    names = ("wire floor,mpi4py unfused,mpi4py one buffer,mpi4py 25 MB,hvdlite none,torch gloo async,"
             "torch.distributed hvdlite async,Horovod none")
    if per_host == 1:
        return names, "RING_ALLREDUCE=0,RING_WIRE=mpi"
    return names, "HIERARCHICAL_ALLREDUCE=1,HIERARCHICAL_ALLREDUCE=0,RING_ALLREDUCE=1+HIERARCHICAL_ALLREDUCE=0"


def over_layouts(args, layouts_text, label, run_layout):
    """Emulated hosts for the largest of the layouts ('2x2,4x1'), then for each layout
    run_layout(n_hosts, per_host, hvdrun_args, env, wrap) -> its result; returns
    {"rate", "delay", "ucx_tls", "layouts": {"2x2": result, ...}} or {"skipped": why}."""
    layouts = parse_layouts(layouts_text)
    hosts, why = emulated_hosts(max(h for h, _ in layouts), args)
    if hosts is None:
        return {"skipped": why}
    out = {"rate": args.rate, "delay": args.delay, "ucx_tls": "tcp,self", "layouts": {}}
    try:
        env = {"PATH": hosts.bin_dir + os.pathsep + os.environ["PATH"], "UCX_TLS": "tcp,self"}
        wrap = lambda argv: hosts.on_host(1, argv, cwd=REPO)  # noqa: E731
        for n_hosts, per_host in layouts:
            hv = ["-H", ",".join("%s:%d" % (name, per_host) for name in hosts.names[:n_hosts]),
                  "-i", hosts.key]
            out["layouts"]["%dx%d" % (n_hosts, per_host)] = run_layout(n_hosts, per_host, hv, env, wrap)
            progress("      %s: %dx%d done (load %s)" % (label, n_hosts, per_host, load_average()))
    finally:
        hosts.down()
    return out


def case_hosts(R, P, args, tiny):
    """Allreduce of the ResNet-50 set, and an allgather, between emulated hosts (network
    namespaces with real sshd, links shaped to --rate), one job per layout, with the wire
    floor of each measured in the same job."""
    def run_layout(n_hosts, per_host, hv, env, wrap):
        contenders, envs = hosts_contenders(per_host)
        r = R.job(n_hosts * per_host, ALLREDUCE,
                  ["--cases", "resnet50,allgather", "--iters", str(P["hosts_iters"]), "--scale", str(P["scale"]),
                   "--allgather-mb", str(P["hosts_allgather_mb"]),
                   "--contenders", contenders, "--hvdlite-env", envs],
                  env=env, hvdrun_args=hv, wrap=wrap)
        return {"resnet50": r["resnet50"], "allgather": r.get("allgather"), "meta": r.get("meta")}
    out = over_layouts(args, P["hosts_layouts"], "hosts", run_layout)
    out["allgather_mb"] = P["hosts_allgather_mb"]
    return out


def case_hosts_train(R, P, args, tiny):
    """The train step of case 2 between emulated hosts, one job per layout: hvdlite with
    no compression, fp16, bf16, top-k 1 %, top-k 0.1 % with DGC's momentum correction and
    PowerSGD rank 4 against no communication in the same job."""
    def run_layout(n_hosts, per_host, hv, env, wrap):
        return R.job(n_hosts * per_host, TRAIN, train_args(P, P["hosts_train_rounds"], P["hosts_train_steps"]) +
                     ["--modes", "nocomm,hvdlite", "--compression", "fp16,bf16,topk,dgc,powersgd"],
                     env=env, hvdrun_args=hv, wrap=wrap)
    return over_layouts(args, P["hosts_train_layouts"], "hosts_train", run_layout)


def case_autotune(R, P, args, tiny):
    """HVDLITE_AUTOTUNE's choice for the train step against a sweep of fusion
    thresholds x cycle times, timed in the same job: on this host, or with
    --set autotune_layout=2x2 between emulated hosts."""
    a = train_args(P, P["autotune_rounds"], P["autotune_steps"]) + \
        ["--modes", "nocomm,hvdlite", "--hvdlite-settings", P["autotune_sweep"], "--autotune",
         "--autotune-steps-per-sample", str(P["autotune_steps_per_sample"])]
    if not P["autotune_layout"]:
        return R.job(args.np, TRAIN, a)
    out = over_layouts(args, P["autotune_layout"], "autotune",
                       lambda n_hosts, per_host, hv, env, wrap: R.job(n_hosts * per_host, TRAIN, a, env=env,
                                                                      hvdrun_args=hv, wrap=wrap))
    if "skipped" in out:
        return out
    res = next(iter(out["layouts"].values()))
    res["layout"], res["rate"] = P["autotune_layout"], args.rate
    return res


def case_compression(R, P, args, tiny):
    """Accuracy against bytes on the wire: the digits example trained with every
    compressor (bitwise-identical parameters checked every step)."""
    return R.job(P["accuracy_np"], ACCURACY, ["--epochs", str(P["accuracy_epochs"]),
                                              "--seeds", P["accuracy_seeds"]])


def diloco_job(R, np, runs, steps, model, eval_every, **kw):
    return R.job(np, DILOCO, ["--runs", runs, "--steps", str(steps), "--eval-every", str(eval_every),
                              "--model=" + model], **kw)


def case_diloco(R, P, args, tiny):
    """The byte-level LM (examples/pytorch_lm.py) to equal samples: synchronous, top-k +
    DGC's preset, PowerSGD, DiLoCo and Streaming DiLoCo between emulated hosts at each
    rate of diloco_rates; DiLoCo at several H against synchronous on this host (the
    convergence sub-case); one rank's step time at each width of diloco_chart_models (the
    chart's compute side). Every ratio is to the synchronous run of the same job."""
    out = {}
    if P["diloco_chart_models"]:
        # lm_step_time.py puts its own --d-model/--heads last: argparse keeps the last.
        out["compute"] = R.job(1, LM_STEP_TIME, ["--d-models", P["diloco_chart_models"],
                                                 "--model=" + P["diloco_model"]])
    if P["diloco_conv_runs"]:   # --set diloco_conv_runs= leaves it out
        out["convergence"] = diloco_job(R, P["diloco_np"], P["diloco_conv_runs"], P["diloco_conv_steps"],
                                        P["diloco_conv_model"], P["diloco_conv_eval_every"])
        progress("      diloco: convergence on one host done (load %s)" % load_average())
    if not P["diloco_layouts"]:
        return out
    out["hosts"] = {}
    for rate in P["diloco_rates"].split(","):
        shaped = argparse.Namespace(**dict(vars(args), rate=rate))
        out["hosts"][rate] = over_layouts(
            shaped, P["diloco_layouts"], "diloco at %s" % rate,
            lambda n_hosts, per_host, hv, env, wrap: diloco_job(
                R, n_hosts * per_host, P["diloco_runs"], P["diloco_steps"], P["diloco_model"],
                P["diloco_eval_every"], env=env, hvdrun_args=hv, wrap=wrap))
    return out


RUNNERS = {"allreduce": case_allreduce, "train_step": case_train, "kernels": case_kernels,
           "network": case_network, "scaling": case_scaling, "negotiation": case_negotiation,
           "sweep": case_sweep, "hosts": case_hosts, "hosts_train": case_hosts_train, "ddp": case_ddp,
           "autotune": case_autotune, "compression": case_compression,
           "diloco": case_diloco}
TITLES = {"allreduce": "cases 1+3: ResNet-50 set and 100 x 4 KB allreduce",
          "train_step": "case 2: train step 6 x Linear(2048, 2048)",
          "kernels": "case 4: compression kernels", "network": "case 5: emulated network",
          "scaling": "case 6: scaling over 1/2/4 ranks", "negotiation": "case 6: negotiation overhead",
          "sweep": "sweep: fusion threshold x cycle time",
          "hosts": "case 7: between emulated hosts (layouts, wire floor)",
          "hosts_train": "case 9: train step between emulated hosts (none, fp16, bf16, top-k, DGC, PowerSGD)",
          "ddp": "case 11: DDP and FSDP2 on hvdlite's backend, on gloo, the Horovod API, Horovod (one host, emulated hosts)",
          "autotune": "case 8: autotune against a sweep",
          "compression": "case 10: accuracy against bytes, every compressor (digits)",
          "diloco": "case 12: DiLoCo against compression (byte-level LM, emulated hosts, convergence)"}


# ---- meta ----------------------------------------------------------------------------

def _git(*a):
    try:
        return subprocess.run(["git"] + list(a), cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.rstrip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def meta(args, P, tiny):
    m = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
         "command": "python -m hvdlite.bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
         "tiny": tiny, "profile": P, "np": args.np,
         "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
         "loadavg_start": load_average(), "git_commit": _git("rev-parse", "--short", "HEAD").strip(),
         "git_dirty_paths": [l[3:] for l in _git("status", "--porcelain", "--untracked-files=no").splitlines()],
         # A run from an exported tree (git archive) names its source here.
         "source": os.environ.get("HVDLITE_BENCH_SOURCE", ""),
         "mpi_flavour": mpi_flavour(), "local_env": local_env()}
    try:
        with open("/proc/cpuinfo") as f:
            m["cpu_model"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    try:
        from mpi4py import MPI
        m["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
    except Exception as e:  # noqa: BLE001
        m["mpi"] = "unknown (%s)" % e
    try:
        import hvdlite
        m["hvdlite"] = getattr(hvdlite, "__version__", "?")
        so = [f for f in os.listdir(os.path.dirname(hvdlite.__file__)) if f.startswith("_engine") and f.endswith(".so")]
        if so:
            with open(os.path.join(os.path.dirname(hvdlite.__file__), so[0]), "rb") as f:
                m["engine_sha256"] = hashlib.sha256(f.read()).hexdigest()[:16]
    except ImportError:
        pass
    try:
        import torch
        m["torch"] = torch.__version__
    except ImportError:
        m["torch"] = None
    spec = importlib.util.find_spec("horovod")
    m["horovod"] = ("installed at %s" % os.path.dirname(spec.origin)) if spec else \
        "not installed (bench/install_horovod.sh installs 0.28.1); Horovod rows are absent"
    m["engine_env"] = {k: v for k, v in os.environ.items() if k.startswith(("HVDLITE_", "HOROVOD_"))}
    return m


# ---- main ----------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    results_dir, doc, img = output_paths(args)
    if importlib.util.find_spec("matplotlib") is None:
        progress("hvdlite bench: matplotlib is not installed: tables only, no plots "
                 "(pip install matplotlib, or pip install -e '.[bench]')")
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, stop_on_signal)
    if args.report:
        with open(args.report) as f:
            data = json.load(f)
        written = report.write(data, report_path(doc, args.report), img, args.report)
        print("wrote " + ", ".join(written))
        return 0
    tiny = args.tiny
    P = dict(TINY if tiny else FULL)
    for kv in args.set:
        k, v = kv.split("=", 1)
        if k not in P:
            raise SystemExit("unknown setting %s (one of %s)" % (k, ", ".join(sorted(P))))
        P[k] = type(P[k])(v) if not isinstance(P[k], list) else [int(x) for x in v.split(",")]
    cases = args.cases.split(",") if args.cases else (
        TINY_CASES if tiny else [c for c in CASES if c not in LONG_CASES])
    for c in cases:
        if c not in RUNNERS:
            raise SystemExit("unknown case %s (one of %s)" % (c, ", ".join(CASES)))
    path = results_file(results_dir)
    log_dir = tempfile.mkdtemp(prefix="hvdlite-bench-")
    R = Runner(log_dir, P["job_timeout"])
    data = {"meta": meta(args, P, tiny), "cases": {}}
    progress("hvdlite bench: %d case(s) -> %s (load %s; logs in %s)"
             % (len(cases), path, data["meta"]["loadavg_start"], log_dir))
    start = time.time()
    failed = 0
    for i, c in enumerate(cases, 1):
        t0, la0 = time.time(), load_average()
        progress("[%d/%d] %s ..." % (i, len(cases), TITLES[c]))
        try:
            res = RUNNERS[c](R, P, args, tiny)
            status = "done"
        except Exception as e:  # noqa: BLE001 -- a failed case is reported, the others still run
            res = {"error": str(e)[-3000:]}
            status = "FAILED: " + str(e).splitlines()[0]
            failed += 1
        res = dict(res) if isinstance(res, dict) else {"value": res}
        res["_seconds"] = round(time.time() - t0, 1)
        res["_loadavg"] = {"start": la0, "end": load_average()}
        data["cases"][c] = res
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
        headline = report.headline(c, res)
        progress("[%d/%d] %s %s in %.0f s (load %s)%s" % (i, len(cases), c, status, time.time() - t0,
                                                          res["_loadavg"]["end"],
                                                          ("\n      " + headline) if headline else ""))
    data["meta"]["loadavg_end"] = load_average()
    data["meta"]["seconds"] = round(time.time() - start, 1)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    written = report.write(data, report_path(doc, path), img, path)
    progress("wrote %s, %s" % (path, ", ".join(written)))
    if not args.keep_logs and not failed:
        shutil.rmtree(log_dir, ignore_errors=True)
    elif failed:
        progress("logs of the failed case(s) kept in %s" % log_dir)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
