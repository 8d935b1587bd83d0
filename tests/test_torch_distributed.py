"""torch.distributed's "hvdlite" backend (hvdlite/torch/c10d.py, docs/ddp.md):
every collective against a NumPy reference per dtype and reduce op, and DDP
on hvdlite against DDP on gloo, on 2 ranks that mpiexec starts (so
``init_process_group(backend="hvdlite")`` gets nothing else); torchrun
without MPI gets an error that says how to launch."""
import json
import os
import signal
import subprocess
import sys

import pytest

from harness.checks import require
from harness.hosts import hvdrun_argv
from harness.ranks import ROOT, TESTS, RankTests, rank_env

C10D = RankTests("scripts/torch_c10d.py")


@pytest.fixture(autouse=True, scope="module")
def _torch():
    require("torch")


@pytest.mark.parametrize("case", C10D.cases)
def test_c10d_backend(case, rank_launch):
    rank_launch(C10D, 2).check(case)


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
    assert abs(hv["parameter_sum"] - gl["parameter_sum"]) <= 1e-6 * abs(gl["parameter_sum"]), results
