"""Fusion, response cache, compression, timeline, stall inspector and the
engine thread's placement (multi-rank).

Each case of the feature modules tests/scripts/engine_{fusion_cache,
compression,timeline,stall,thread}.py is a case here; the ranks are launched
once per module and configuration."""
import json
import subprocess
import sys

import pytest

from harness.ranks import RankTests, mpiexec, rank_env

FEATURES = {name: RankTests(f"scripts/engine_{name}.py")
            for name in ("fusion_cache", "compression", "timeline", "stall", "thread")}
AUTOTUNE = RankTests("scripts/engine_autotune.py")


def cases(*modules, without=()):
    """(module, case) of these feature modules, less the cases named ``without``."""
    return [pytest.param(FEATURES[name], case, id=f"{name}-{case}")
            for name in modules for case in FEATURES[name].cases if not case.startswith(without)]


@pytest.mark.parametrize("features,case", cases(*FEATURES))
def test_features_two_ranks(features, case, rank_launch):
    rank_launch(features, 2).check(case)


@pytest.mark.parametrize("case", AUTOTUNE.cases)
def test_autotune_two_ranks(case, rank_launch):
    rank_launch(AUTOTUNE, 2).check(case)


@pytest.mark.parametrize("features,case", cases("fusion_cache", "compression", "thread"))
def test_features_four_ranks(features, case, rank_launch):
    rank_launch(features, 4).check(case)


@pytest.mark.parametrize("features,case", cases("fusion_cache", "compression", "timeline"))
def test_features_over_mpi(features, case, rank_launch):
    """The same checks with shared memory turned off: MPI carries fused and
    compressed buckets (one host uses shared memory otherwise); every case
    fails if anything went through shared memory. (The stall inspector and
    the engine thread's placement run over shared memory only.)"""
    rank_launch(features, 2, env={"HVDLITE_SHM_ALLREDUCE": "0"}).check(case)


KILLED_SCRIPT = """
import os, signal, sys, time
import numpy as np
import hvdlite as hvd
os.environ["HVDLITE_TIMELINE"] = sys.argv[1]
hvd.init()
for i in range(200):
    hvd.allreduce(np.ones(1000, np.float32), name=f"t.{i}")
# As a reader of the live file would: wait until the last allreduce's end is
# written, then die without closing the file.
while open(sys.argv[1]).read().count('"name":"ALLREDUCE","ph":"E"') < 200:
    time.sleep(0.01)
print("written", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_timeline_survives_sigkill(tmp_path):
    """A rank killed while recording leaves a file that loads (without its
    closing bracket) and holds every allreduce it finished, B and E paired."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED_SCRIPT)
    path = tmp_path / "killed.json"
    proc = subprocess.run([mpiexec(), "-n", "1", sys.executable, str(script), str(path)],
                          env=rank_env(), capture_output=True, text=True, timeout=120)
    assert "written" in proc.stdout, proc.stdout + proc.stderr
    text = path.read_text().rstrip()
    assert not text.endswith("]"), "a killed run cannot have closed the file"
    events = json.loads(text + "]")  # the array format allows the missing bracket
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    phases = {}
    for e in events:
        if e.get("name") == "ALLREDUCE" and e.get("ph") in ("B", "E"):
            phases.setdefault(rows[e["tid"]], []).append(e["ph"])
    want = {f"allreduce.t.{i}": ["B", "E"] for i in range(200)}
    assert phases == want, sorted(set(phases.items()) ^ set((k, tuple(v)) for k, v in want.items()))[:5]
