"""torch.distributed's "hvdlite" backend (hvdlite/torch/c10d.py, docs/ddp.md):
every collective against a NumPy reference per dtype and reduce op at 2
ranks; point-to-point messages, monitored_barrier and the group's timeout
(c10d_p2p.py) at 2 and 4 ranks; DDP and FSDP2 on hvdlite against the same on
gloo, DDP's buckets in the response cache and hvdlite's compressors as DDP
hooks (ddp_hooks.py), at 2 and 4 ranks; the collectives and DDP on the device
path (device.py), CPU tensors through the executor on gloo and, on GPU hosts,
CUDA tensors; subgroups without hvdlite.add_process_set (new_group,
new_subgroups), with the default group on hvdlite or on gloo; ranks that
mpiexec starts (so
``init_process_group(backend="hvdlite")`` gets nothing else); torchrun
without MPI gets an error that says how to launch; HVDLITE_TIMELINE shows a
DDP script's bucket allreduces. A DDP script's failures as a Horovod
script's (test_reliability.py): a failed rank makes the others raise from
DDP's backward, a killed one ends the job under hvdrun, the stall inspector
names a skipped collective, and under TORCH_DISTRIBUTED_DEBUG=DETAIL
collectives that differ between ranks raise at once; and its elastic restart
under hvdrun ends with the parameters of an uninterrupted run."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid

import pytest

from harness.checks import require
from harness.hosts import hvdrun_argv, run_tagged
from harness.ranks import ROOT, TESTS, RankTests, rank_env, run_ranks
from test_reliability import FAILURE_LIMIT_S, HOST, launch, parse

C10D = RankTests("scripts/torch_c10d.py")
P2P = RankTests("scripts/torch_c10d_p2p.py")
DDP = RankTests("scripts/torch_ddp.py")
C10D_DEVICE = RankTests("scripts/torch_c10d_device.py")
SUBGROUPS = RankTests("scripts/torch_subgroups.py")
DEBUG_DETAIL = RankTests("scripts/torch_c10d_debug.py")


@pytest.fixture(autouse=True, scope="module")
def _torch():
    require("torch")


@pytest.mark.parametrize("case", C10D.cases)
def test_c10d_backend(case, rank_launch):
    rank_launch(C10D, 2).check(case)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("case", P2P.cases)
def test_c10d_point_to_point(case, ranks, rank_launch):
    rank_launch(P2P, ranks).check(case)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("case", DDP.cases)
def test_ddp(case, ranks, rank_launch):
    rank_launch(DDP, ranks).check(case)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("case", DEBUG_DETAIL.cases)
def test_c10d_debug_detail_checks_each_collective(case, ranks, rank_launch):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: collectives that differ between ranks
    raise TensorMismatchError on every rank at once; DDP and every collective
    pass the check unchanged."""
    rank_launch(DEBUG_DETAIL, ranks, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}).check(case)


def test_fsdp2_under_debug_detail_matches_gloo(rank_launch):
    """FSDP2's all-gathers and reduce-scatters pass DETAIL's check: the model
    trains on hvdlite as on gloo (whose group torch wraps for the same check)."""
    case = "test_fsdp2_matches_gloo"
    rank_launch(DDP, 2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, cases=[case]).check(case)


@pytest.mark.parametrize("case", C10D.cases)
def test_c10d_backend_every_collective_through_the_executor(case, rank_launch):
    """torch_c10d.py's every collective, dtype and reduce op, subgroups on
    process sets included, with HVDLITE_DEVICE_TRANSPORT=gloo: every tensor
    through the device executor (its per-process-set groups too)."""
    rank_launch(C10D, 2, env={"HVDLITE_DEVICE_TRANSPORT": "gloo"}).check(case)


@pytest.mark.parametrize("case", C10D_DEVICE.cases)
def test_c10d_backend_on_the_device_path(case, rank_launch):
    """The backend's collectives and DDP with every CPU tensor taken by the
    device executor on gloo (HVDLITE_DEVICE_TRANSPORT=gloo: the path of CUDA
    tensors, gloo in NCCL's place)."""
    rank_launch(C10D_DEVICE, 2, env={"HVDLITE_DEVICE_TRANSPORT": "gloo"}).check(case)


@pytest.mark.parametrize("case", C10D_DEVICE.cases)
@pytest.mark.parametrize("ranks", [1, 2])
def test_c10d_backend_cuda_tensors(ranks, case, rank_launch):
    """The same checks on CUDA tensors (GPU machines only): at 1 rank through
    NCCL, at 2 ranks on one GPU staged through host memory (NCCL refuses two
    ranks on one GPU); with a GPU per rank, 2 ranks run through NCCL too."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU: torch.cuda.is_available() is False here")
    rank_launch(C10D_DEVICE, ranks, env={"HVDLITE_TEST_C10D_DEVICE": "cuda"}).check(case)


@pytest.mark.parametrize("order", ["hvdlite-first", "gloo-default"])
def test_device_executor_beside_a_default_group(order):
    """The executor's groups are its own: hvdlite.init() before
    init_process_group("hvdlite"), or init_process_group("gloo") starting
    hvdlite through env://; destroy_process_group() and hvdlite.shutdown()
    leave each other's groups alone."""
    run_ranks("scripts/torch_c10d_device_order.py", 2, args=[order],
              env={"HVDLITE_DEVICE_TRANSPORT": "gloo"})


@pytest.mark.parametrize("ranks,default", [(2, "hvdlite"), (4, "hvdlite"), (4, "gloo")])
@pytest.mark.parametrize("case", SUBGROUPS.cases)
def test_subgroups(case, ranks, default, rank_launch):
    """dist.new_group(ranks, backend="hvdlite") with no hvdlite.add_process_set,
    the default group on hvdlite or on gloo."""
    rank_launch(SUBGROUPS, ranks, env={"HVDLITE_TEST_DEFAULT_BACKEND": default}).check(case)


def test_subgroup_before_hvdlite_starts_says_so(tmp_path):
    """The default group on gloo with torch's own rendezvous (hvdlite not
    started): a group on hvdlite of some ranks fails on its members, which
    alone cannot start hvdlite, instead of hanging."""
    script = tmp_path / "subgroup.py"
    script.write_text(
        "import os\nimport torch.distributed as dist\nimport hvdlite, hvdlite.torch\n"
        "rank = int(os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK', '0')))\n"
        "os.environ.update(RANK=str(rank), WORLD_SIZE='2', MASTER_ADDR='127.0.0.1')\n"
        "dist.init_process_group(backend='gloo')\n"
        "try:\n"
        "    sub = dist.new_group([0], backend='hvdlite')\n"
        "    assert rank == 1 and sub == dist.GroupMember.NON_GROUP_MEMBER, sub\n"
        "except ValueError as e:\n"
        "    assert rank == 0 and 'Call hvdlite.init()' in str(e), e\n"
        "assert not hvdlite.is_initialized()\n"
        "dist.destroy_process_group()\n"
        "print(f'RANK {rank} OK', flush=True)\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_ranks(str(script), 2, env={"MASTER_PORT": port, "PYTHONPATH": ROOT}, timeout=120)


def _timeline(path):
    text = path.read_text().rstrip()
    return json.loads(text if text.endswith("]") else text + "]")


def test_ddp_timeline_shows_the_bucket_allreduces(tmp_path):
    """HVDLITE_TIMELINE with a DDP script: every rank's file has a row per
    bucket, named by the backend (c10d.py's engine names), with one ALLREDUCE
    per step: the first step's single bucket of all parameters, then the
    rebuilt buckets every later step, two of one size in a row told apart by
    their last number."""
    steps = 5
    proc = run_ranks("scripts/torch_ddp_timeline.py", 2, args=[steps],
                     env={"HVDLITE_TIMELINE": str(tmp_path / "tl-%r.json")})
    total = int(re.search(r"PARAMS (\d+)", proc.stdout).group(1))
    pattern = re.compile(r"allreduce\.c10d\.[^.]+\.allreduce\.sum\.float32\.(\d+)\.(\d+)")
    for r in range(2):
        events = _timeline(tmp_path / f"tl-{r}.json")
        rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        runs = {}
        for e in events:
            if e.get("name") == "ALLREDUCE" and e.get("ph") == "B":
                runs[rows[e["tid"]]] = runs.get(rows[e["tid"]], 0) + 1
        buckets = {}
        for row, n in runs.items():
            m = pattern.fullmatch(row)
            if m:
                buckets[(int(m.group(1)), int(m.group(2)))] = n
        assert buckets.get((total, 0)) == 1, (r, runs)
        rebuilt = {key: n for key, n in buckets.items() if key != (total, 0)}
        assert all(n == steps - 1 for n in rebuilt.values()), (r, runs)
        assert sum(numel for numel, _ in rebuilt) == total, (r, runs)
        assert any(j == 1 and (numel, 0) in rebuilt for numel, j in rebuilt), (r, runs)


def test_torchrun_without_mpi_says_how_to_launch(tmp_path):
    script = tmp_path / "init.py"
    script.write_text("import torch.distributed as dist\nimport hvdlite.torch\n"
                      "dist.init_process_group(backend='hvdlite')\n")
    env = rank_env({"PYTHONPATH": os.pathsep.join([ROOT, TESTS])})
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_SIZE"):
        env.pop(var, None)
    # --standalone: torchrun's own rendezvous on a free port of this host.
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", str(script)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # torchrun and the ranks it started
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not end within 120 s:\n{out[-4000:]}")
    assert proc.returncode != 0, out[-4000:]
    assert "the hvdlite backend runs on MPI's world" in out, out[-4000:]
    assert "hvdrun -np N python script.py" in out and "mpiexec -n N" in out, out[-4000:]


def test_ddp_example_under_hvdrun_matches_gloo():
    """examples/pytorch_ddp_digits.py launched by hvdrun, init_process_group
    without arguments: on hvdlite and on gloo the same training, to 1e-6."""
    require("sklearn", import_module=False)
    argv, extra = hvdrun_argv()
    env = rank_env(dict(extra, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])))
    results = {}
    for backend in ("hvdlite", "gloo"):
        proc = subprocess.run(argv + ["-np", "2", sys.executable,
                                      os.path.join(ROOT, "examples", "pytorch_ddp_digits.py"),
                                      "--backend", backend, "--epochs", "3", "--json"],
                              env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        line = [ln for ln in proc.stdout.splitlines() if '"backend"' in ln][-1]
        results[backend] = json.loads(line.split(": ", 1)[1])
    hv, gl = results["hvdlite"], results["gloo"]
    assert hv["backend"] == "hvdlite" and hv["ranks"] == 2, hv
    assert hv["test_accuracy"] >= 90, hv
    # DDP's buckets (one per step here) from the engine's response cache
    assert hv["cache_hits"] >= 30 and hv["cache_hits"] > 3 * hv["cache_misses"], hv
    assert abs(hv["parameter_sum"] - gl["parameter_sum"]) <= 1e-6 * abs(gl["parameter_sum"]), results


def _plugin_ranks():
    """tests/scripts/torch_c10d_plugin.py under hvdrun -np 2: {rank: its report}."""
    argv, extra = hvdrun_argv()
    proc = subprocess.run(argv + ["-np", "2", sys.executable, os.path.join(TESTS, "scripts",
                                                                            "torch_c10d_plugin.py")],
                          env=rank_env(extra), capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    reports = [json.loads(ln.split("PLUGIN ", 1)[1]) for ln in proc.stdout.splitlines() if "PLUGIN " in ln]
    return {r["rank"]: r for r in reports}, out


@pytest.fixture(scope="module")
def plugin_ranks():
    return _plugin_ranks()


@pytest.mark.parametrize("rank", [0, 1])
def test_backend_from_torchs_entry_point_all_reduce(plugin_ranks, rank):
    """A script that imports torch alone: torch's entry point registered
    "hvdlite"; init_process_group(backend="hvdlite") under hvdrun, nothing else."""
    reports, out = plugin_ranks
    assert rank in reports, out[-4000:]
    r = reports[rank]
    assert (r["size"], r["backend"]) == (2, "hvdlite"), r
    assert r["max_error"] == 0.0, r


def test_backend_from_torchs_entry_point_does_not_load_hvdlite_with_torch(plugin_ranks):
    """``import torch`` pays for a registration only: hvdlite loads with the first group."""
    reports, out = plugin_ranks
    assert sorted(reports) == [0, 1], out[-4000:]
    assert all(r["hvdlite_loaded_with_torch"] == [] for r in reports.values()), reports


# ---------------------------------------------------------------- failures, as a Horovod script's

FAILURE = "scripts/torch_ddp_failure.py"

# What a survivor's exception says when rank {v} fails: DDP's backward raises
# a RuntimeError that carries the engine's error (c10d_work.py).
DDP_SURVIVOR = {
    "raise": "HvdliteShutdownError: hvdlite has shut down: rank {v} exited with an unhandled "
             "exception: ValueError: simulated failure in rank {v}",
    "exit": "HvdliteShutdownError: hvdlite has shut down: rank {v} called sys.exit(3) (exit code 3)",
    "sigstop": "HvdliteTimeoutError: ",
}


@pytest.mark.parametrize("mode,ranks", [("raise", 2), ("exit", 4), ("sigstop", 2)])
def test_ddp_failed_rank_raises_on_the_others(mode, ranks):
    """A rank of a DDP script raises, calls sys.exit, or hangs (with
    HVDLITE_TIMEOUT_SECONDS): the others, inside DDP's backward, raise an
    exception naming it (or the timeout) within FAILURE_LIMIT_S, and the job
    ends with a non-zero status."""
    victim = ranks - 1
    env = {"HVDLITE_TIMEOUT_SECONDS": "2"} if mode == "sigstop" else None
    proc, _, ended = launch(FAILURE, ranks, [mode, victim], env=env)
    out = proc.stdout + proc.stderr
    ready, fail_at, survivors = parse(proc.stdout)
    assert len(ready) == ranks and fail_at is not None, out[-4000:]
    assert proc.returncode != 0, out[-4000:]
    if mode == "sigstop":   # the first rank to time out aborts the job
        assert survivors and victim not in survivors, out[-4000:]
    else:
        assert set(survivors) == set(range(ranks)) - {victim}, out[-4000:]
    words = DDP_SURVIVOR[mode].format(v=victim)
    for r, (at, message) in survivors.items():
        assert words in message, f"rank {r}: {message}"
        if mode == "sigstop":
            assert "HVDLITE_TIMEOUT_SECONDS=2" in message, message
        assert at - fail_at < FAILURE_LIMIT_S, f"rank {r} learnt it after {at - fail_at:.1f} s"
    if mode == "exit":
        assert proc.returncode == 3, proc.returncode
    assert ended - fail_at < FAILURE_LIMIT_S + 5
    took = max(at for at, _ in survivors.values()) - fail_at
    print(f"\nDDP, {mode} on rank {victim} of {ranks}: the others raised within {took:.3f} s")


@pytest.mark.parametrize("mode,code,words", [("sigkill", 137, "was killed by SIGKILL"),
                                             ("os_exit", 3, "exited with code 3")])
def test_ddp_killed_rank_ends_the_job_under_hvdrun(mode, code, words):
    """A rank of a DDP script killed, or gone by os._exit (no exit handler
    runs): hvdrun names it and stops the others, as for a Horovod script."""
    proc, _, ended = launch(FAILURE, 2, [mode, 1], hvdrun=True)
    out = proc.stdout + proc.stderr
    _, fail_at, _ = parse(proc.stdout)
    assert fail_at is not None, out[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert re.match(rf"hvdrun: rank 1 on host {re.escape(HOST)} {words}; hvdrun stopped the 1 "
                    r"other rank still running", last), out[-4000:]
    assert proc.returncode == code, out[-4000:]
    assert ended - fail_at < FAILURE_LIMIT_S
    print(f"\nDDP, {mode} of rank 1 (hvdrun): job gone {ended - fail_at:.2f} s later: {last}")


@pytest.mark.parametrize("limit", ["stall_shutdown_variable", "group_timeout"])
def test_ddp_skipped_collective_stall_inspector(limit):
    """Rank 1 of a DDP script skips a dist.all_reduce the others make: the
    stall inspector's warning names the c10d collective (its engine name) and
    rank 1, and HVDLITE_STALL_SHUTDOWN_TIME_SECONDS, or where that is unset
    init_process_group's timeout, ends the job with StallError on every rank
    instead of a hang."""
    env = {"HVDLITE_STALL_CHECK_TIME_SECONDS": "1"}
    if limit == "stall_shutdown_variable":
        env["HVDLITE_STALL_SHUTDOWN_TIME_SECONDS"] = "3"
        mode = "stall"
    else:
        # Rank 0 waits on the all_reduce's future, as DDP does: wait()'s own
        # timeout (the same group timeout) would otherwise end it first.
        env["TEST_GROUP_TIMEOUT_SECONDS"] = "3"
        mode = "stall_future"
    proc, _, _ = launch(FAILURE, 2, [mode, 1], env=env)
    out = proc.stdout + proc.stderr
    _, start, failed = parse(proc.stdout)
    assert proc.returncode != 0 and set(failed) == {0, 1}, out[-4000:]
    warning = re.search(r"WARNING stall inspector: tensor 'c10d\.0\.allreduce\.sum\.float32\.7\.0' "
                        r"\(allreduce\) has waited [\d.]+ s: submitted by ranks \[0\] but not by "
                        r"ranks \[1\]", proc.stderr)
    assert warning, out[-4000:]
    stall = ("StallError: stall inspector stopped hvdlite (HVDLITE_STALL_SHUTDOWN_TIME_SECONDS=3): "
             "tensor 'c10d.0.allreduce.sum.float32.7.0'")
    for r, (at, message) in failed.items():
        assert stall in message and "not by ranks [1]" in message, f"rank {r}: {message}"
        assert 3 <= at - start < FAILURE_LIMIT_S, at - start


def test_ddp_collective_of_other_shapes_named_by_the_stall_inspector():
    """Each rank of a DDP script calls one dist.all_reduce with another number
    of elements: the engine names differ, the call stalls, and the
    StallError every rank raises names both shapes and says what they mean."""
    proc, _, _ = launch(FAILURE, 2, ["shape", 1], env={"HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3"})
    out = proc.stdout + proc.stderr
    _, start, failed = parse(proc.stdout)
    assert proc.returncode != 0 and set(failed) == {0, 1}, out[-4000:]
    names = {r: "'c10d.0.allreduce.sum.float32.%d.0'" % (7 + r) for r in (0, 1)}
    shapes = {r: "allreduce, float32 [%d]" % (7 + r) for r in (0, 1)}
    for r, (at, message) in failed.items():
        a, b = (0, 1) if names[0] + " (allreduce) has waited" in message else (1, 0)
        assert (f"tensor {names[a]} (allreduce) has waited" in message and
                f"submitted by ranks [{a}] but not by ranks [{b}]; ranks [{b}] submitted "
                f"{names[b]} ({shapes[b]}) instead of this ({shapes[a]}): if the two are one "
                "call, the ranks disagree on its name, dtype or shape" in message), \
            f"rank {r}: {message}"
        assert 3 <= at - start < FAILURE_LIMIT_S, at - start


# ---------------------------------------------------------------- elastic

ELASTIC_STEPS = 30
EVENT = re.compile(r"^\[(\d+)\]<stdout>: (\{.*\})$")


def _elastic_job(hvdrun_args, script_args=(), env=None):
    """tests/scripts/torch_ddp_elastic.py under hvdrun; (CompletedProcess, events)."""
    tag = "hvdlddpel-" + uuid.uuid4().hex[:10]
    argv, extra = hvdrun_argv()
    cmd = argv + list(hvdrun_args) + [sys.executable, os.path.join(TESTS, "scripts",
                                                                   "torch_ddp_elastic.py"),
                                      tag, str(ELASTIC_STEPS), *script_args]
    env = rank_env(dict(extra, **(env or {}),
                        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])))
    proc = run_tagged(cmd, tag, env=env, timeout=240, cwd=ROOT)
    events = [json.loads(m.group(2)) for m in map(EVENT.match, proc.stdout.splitlines()) if m]
    return proc, events


_uninterrupted = []


def _uninterrupted_sha():
    """The parameters' sha256 after an uninterrupted run (a plain hvdrun job)."""
    if not _uninterrupted:
        proc, events = _elastic_job(["-np", "2"])
        done = [e for e in events if e["ev"] == "done"]
        assert proc.returncode == 0 and len(done) == 2, (proc.stdout + proc.stderr)[-4000:]
        assert {e["backend"] for e in events if e["ev"] == "start"} == {"hvdlite"}
        assert all(e["hvdlite"].startswith(ROOT) for e in events if e["ev"] == "start"), events[:2]
        _uninterrupted.append(done[0]["params_sha256"])
    return _uninterrupted[0]


@pytest.mark.parametrize("fail", ["sigkill", "sigstop"])
def test_ddp_elastic_restart_ends_as_an_uninterrupted_run(fail):
    """An elastic DDP script (TorchState of the DDP model, hvd.elastic.run)
    under hvdrun --min-np 2 on this host: rank 1 is killed (SIGKILL; the host
    comes back after --blacklist-cooldown-range) or hangs (SIGSTOP; the others
    time out in DDP's backward after HVDLITE_TIMEOUT_SECONDS and leave for a
    restart) at step 10. The next generation builds the group and DDP again,
    resumes from the commit of step 9 and ends with the parameters of an
    uninterrupted run, bit for bit."""
    want = _uninterrupted_sha()
    args = ["--recovery", "restart", "--min-np", "2", "-H", "localhost:2"]
    env = None
    if fail == "sigkill":
        args += ["--blacklist-cooldown-range", "1", "2"]
    else:
        env = {"HVDLITE_TIMEOUT_SECONDS": "2"}
    proc, events = _elastic_job(args, ["--fail", fail, "--fail-at", "10", "--commit-every", "3"],
                                env)
    err = proc.stderr
    assert proc.returncode == 0, (proc.stdout + err)[-6000:]
    if fail == "sigkill":
        assert "elastic: host localhost lost rank 1 (was killed by SIGKILL)" in err, err[-4000:]
    else:
        assert re.search(r"rank 0 leaves for a restart: HvdliteTimeoutError: .*"
                         r"HVDLITE_TIMEOUT_SECONDS=2", err), err[-4000:]
    assert "elastic: generation 2 on localhost:2 (2 ranks), from the newest commit" in err, err
    begins = [e for e in events if e["ev"] == "begin" and e["generation"] == 2]
    assert len(begins) == 2 and {e["step"] for e in begins} == {9}, begins
    assert len({e["params_sha256"] for e in begins}) == 1, "ranks began generation 2 apart"
    done = [e for e in events if e["ev"] == "done"]
    assert len(done) == 2 and {e["generation"] for e in done} == {2}, events[-4:]
    assert {e["steps"] for e in done} == {ELASTIC_STEPS}
    assert {e["params_sha256"] for e in done} == {want}, \
        "parameters differ from the uninterrupted run"


def test_ddp_elastic_in_place_asks_for_restart():
    """In place, a rebuild abandons the engine under torch.distributed's
    process group, which torch cannot re-create inside the running script:
    hvd.elastic.run says so at once and names --recovery restart."""
    proc, _ = _elastic_job(["--recovery", "in-place", "--min-np", "2", "-H", "localhost:2"], [])
    assert proc.returncode != 0
    assert "cannot rebuild torch.distributed's process group" in proc.stderr, proc.stderr[-4000:]
    assert "--recovery restart" in proc.stderr
