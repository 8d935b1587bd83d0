"""torch.distributed's "hvdlite" backend (hvdlite/torch/c10d.py, docs/ddp.md):
every collective against a NumPy reference per dtype and reduce op at 2
ranks; DDP and FSDP2 on hvdlite against the same on gloo, DDP's buckets in the
response cache and hvdlite's compressors as DDP hooks (ddp_hooks.py), at 2
and 4 ranks; subgroups without hvdlite.add_process_set (new_group,
new_subgroups), with the default group on hvdlite or on gloo; ranks that mpiexec starts (so
``init_process_group(backend="hvdlite")`` gets nothing else); torchrun
without MPI gets an error that says how to launch; HVDLITE_TIMELINE shows a
DDP script's bucket allreduces."""
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from harness.checks import require
from harness.hosts import hvdrun_argv
from harness.ranks import ROOT, TESTS, RankTests, rank_env, run_ranks

C10D = RankTests("scripts/torch_c10d.py")
DDP = RankTests("scripts/torch_ddp.py")
SUBGROUPS = RankTests("scripts/torch_subgroups.py")


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
