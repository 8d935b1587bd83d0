"""hvdlite under a real SLURM: slurmctld and one slurmd per network-namespace host
(tests/harness/slurm.py), 2 nodes x 2 tasks.

- sbatch with hvdrun and no -H: hvdrun takes the allocation (MPI's launcher starts
  the ranks through srun), the digits example gives the same result as 4 local ranks;
- srun --mpi=pmi2 without hvdrun: the ranks get their places from SLURM's PMI;
- a rank killed inside the allocation ends the job with hvdrun's usual message;
- hvdrun --check-build names the allocation it runs in.

Each test prints its commands' times (-s).
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from harness.checks import require
from harness.hosts import REPO, hvdrun_argv
from harness.slurm import slurm_or_skip

EXAMPLE = os.path.join(REPO, "examples", "pytorch_digits.py")
FAILURE = os.path.join(REPO, "tests", "scripts", "reliability_failure.py")
DIGITS_ARGS = ["--epochs", "4", "--json"]


@pytest.fixture(scope="module")
def cluster():
    require("torch")
    hosts, c = slurm_or_skip(2)
    yield c
    c.down()
    hosts.down()


def env(cluster):
    """What every SLURM command gets: the cluster's SLURM_CONF, MPI over TCP
    (the ranks are on two hosts), the test hosts' ssh and the venv first in PATH."""
    _, extra = hvdrun_argv()
    e = cluster.env(extra)
    e.update(UCX_TLS="tcp,self", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
             PATH=os.pathsep.join([cluster.hosts.bin_dir, os.path.dirname(sys.executable), os.environ["PATH"]]))
    e.pop("HVDLITE_MPIEXEC", None)
    return e


# srun's pmi2 carries MPICH's address exchange; with the UCX netmod it came
# through corrupted in 1 of 5 to 5 of 5 digits runs here (slurmstepd: "mpi/pmi2:
# value not properly terminated", then UCX "failed to unpack address"), with
# OFI over TCP in none of 10. docs/launcher.md says so.
SRUN_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}


def run(cluster, argv, timeout=240, extra_env=None):
    start = time.time()
    e = env(cluster)
    e.update(extra_env or {})
    p = subprocess.run(cluster.hosts.on_host(1, argv, cwd=REPO), env=e, capture_output=True,
                       text=True, timeout=timeout)
    p.elapsed = time.time() - start
    return p


def result_json(text):
    found = [json.loads(m.group(1)) for m in re.finditer(r"^(?:\[\d+\]<stdout>: |\d+: )?(\{.*\})$", text, re.M)]
    assert found, text[-3000:]
    return found[0]


@pytest.fixture(scope="module")
def local_result():
    """The digits example on 4 ranks of one machine: the reference."""
    argv, extra = hvdrun_argv()
    e = dict(os.environ, UCX_TLS="self,sm", OMP_NUM_THREADS="1", **extra)
    e.pop("HVDLITE_MPIEXEC", None)
    p = subprocess.run(argv + ["-np", "4", sys.executable, EXAMPLE] + DIGITS_ARGS, env=e,
                       capture_output=True, text=True, timeout=240, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    return result_json(p.stdout)


def test_sbatch_hvdrun_takes_the_allocation(cluster, local_result, tmp_path):
    hvdrun, _ = hvdrun_argv()
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=2\n"
                      "%s %s %s\n" % (" ".join(hvdrun), " ".join([sys.executable, EXAMPLE]), " ".join(DIGITS_ARGS)))
    out = tmp_path / "job.out"
    p = run(cluster, ["sbatch", "--wait", "-o", str(out), str(script)])
    text = out.read_text()
    assert p.returncode == 0, p.stderr + text[-3000:]
    got = result_json(text)
    assert got["ranks"] == 4
    assert got["test_accuracy"] == local_result["test_accuracy"], (got, local_result)
    print("\nsbatch -N 2 --ntasks-per-node=2 + hvdrun: %.1f s, accuracy %.2f %% (4 local ranks: %.2f %%)"
          % (p.elapsed, got["test_accuracy"], local_result["test_accuracy"]))


def test_srun_pmi2_without_hvdrun(cluster, local_result):
    p = run(cluster, ["srun", "-K", "-N", "2", "--ntasks-per-node=2", "--mpi=pmi2", "--label",
                      sys.executable, "-c",
                      "import json, hvdlite as h; h.init(); print(json.dumps([h.rank(), h.size(), "
                      "h.local_rank(), h.local_size(), h.cross_rank(), h.cross_size()]))"], extra_env=SRUN_ENV)
    assert p.returncode == 0, p.stderr[-3000:]
    places = sorted(json.loads(line.split(": ", 1)[1]) for line in p.stdout.splitlines() if ": [" in line)
    assert places == [[0, 4, 0, 2, 0, 2], [1, 4, 1, 2, 0, 2], [2, 4, 0, 2, 1, 2], [3, 4, 1, 2, 1, 2]], p.stdout
    p = run(cluster, ["srun", "-K", "-N", "2", "--ntasks-per-node=2", "--mpi=pmi2", sys.executable, EXAMPLE]
            + DIGITS_ARGS, extra_env=SRUN_ENV)
    assert p.returncode == 0, p.stderr[-3000:]
    got = result_json(p.stdout)
    assert got["ranks"] == 4 and got["test_accuracy"] == local_result["test_accuracy"], (got, local_result)
    print("\nsrun -N 2 --ntasks-per-node=2 --mpi=pmi2 (MPICH over OFI/TCP): %.1f s, accuracy %.2f %%"
          % (p.elapsed, got["test_accuracy"]))


def test_rank_killed_inside_the_allocation(cluster):
    hvdrun, _ = hvdrun_argv()
    p = run(cluster, ["salloc", "-N", "2", "--ntasks-per-node=2"] + hvdrun +
            [sys.executable, FAILURE, "hvdltag-slurm", "sigkill", "3"])
    lines = [line for line in p.stderr.splitlines() if line.startswith("hvdrun: ")]
    assert lines and re.match(r"hvdrun: rank 3 on host %s was killed by SIGKILL; hvdrun stopped the 3 other "
                              r"ranks still running" % cluster.hosts.name(2), lines[-1]), p.stderr[-3000:]
    assert p.returncode == 137, p.returncode
    print("\nrank 3 SIGKILLed inside salloc: hvdrun and salloc ended %.1f s after the start" % p.elapsed)


def test_check_build_names_the_allocation(cluster):
    hvdrun, _ = hvdrun_argv()
    p = run(cluster, ["salloc", "-N", "2", "--ntasks-per-node=2"] + hvdrun + ["--check-build"])
    assert p.returncode == 0, p.stderr
    assert re.search(r"\[X\] SLURM job \d+: 4 tasks on 2 nodes \(%s\)" % re.escape("hvdl-n[1-2]"), p.stdout), p.stdout
