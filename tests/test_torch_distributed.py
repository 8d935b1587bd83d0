"""torch.distributed's "hvdlite" backend (hvdlite/torch/c10d.py, docs/ddp.md):
every collective against a NumPy reference per dtype and reduce op at 2
ranks; DDP and FSDP2 on hvdlite against the same on gloo, DDP's buckets in the
response cache and hvdlite's compressors as DDP hooks (ddp_hooks.py), at 2
and 4 ranks; the collectives and DDP on the device path (device.py), CPU
tensors through the executor on gloo and, on GPU hosts, CUDA tensors; ranks that mpiexec starts (so
``init_process_group(backend="hvdlite")`` gets nothing else); torchrun
without MPI gets an error that says how to launch; HVDLITE_TIMELINE shows a
DDP script's bucket allreduces."""
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from harness.checks import require
from harness.hosts import hvdrun_argv
from harness.ranks import ROOT, TESTS, RankTests, rank_env, run_ranks

C10D = RankTests("scripts/torch_c10d.py")
DDP = RankTests("scripts/torch_ddp.py")
C10D_DEVICE = RankTests("scripts/torch_c10d_device.py")


@pytest.fixture(autouse=True, scope="module")
def _torch():
    require("torch")


@pytest.mark.parametrize("case", C10D.cases)
def test_c10d_backend(case, rank_launch):
    rank_launch(C10D, 2).check(case)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("case", DDP.cases)
def test_ddp(case, ranks, rank_launch):
    rank_launch(DDP, ranks).check(case)


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
