"""Fusion, response cache, compression, timeline, stall inspector (multi-rank)."""
import json
import os
import signal
import subprocess
import sys

import pytest

from mpi_harness import mpiexec, rank_env, run_ranks


def test_features_two_ranks(tmp_path):
    proc = run_ranks("scripts/engine_features.py", 2,
                     args=[tmp_path, "fusion_matches_unfused,cache,fp16,topk,timeline,horovod_layout,stall,"
                                     "priority"])
    assert "stall inspector" in proc.stderr and "stalled.tensor" in proc.stderr
    assert "not by ranks [1]" in proc.stderr


def test_features_four_ranks(tmp_path):
    run_ranks("scripts/engine_features.py", 4,
              args=[tmp_path, "fusion_matches_unfused,cache,fp16,topk,priority"])


def test_features_over_mpi(tmp_path):
    """The same checks with shared memory turned off: MPI carries fused and
    compressed buckets (one host uses shared memory otherwise)."""
    run_ranks("scripts/engine_features.py", 2,
              args=[tmp_path, "fusion_matches_unfused,cache,fp16,topk,timeline,horovod_layout"],
              env={"HVDLITE_SHM_ALLREDUCE": "0"})


def test_timeline_merge(tmp_path):
    run_ranks("scripts/engine_features.py", 2, args=[tmp_path, "timeline"])
    out = tmp_path / "merged.json"
    subprocess.run([sys.executable, "-m", "hvdlite.timeline", "merge", "-o", str(out),
                    str(tmp_path / "timeline-0.json"), str(tmp_path / "timeline-1.json")], check=True)
    merged = json.loads(out.read_text())
    pids = {e["pid"] for e in merged["traceEvents"] if "pid" in e}
    assert pids == {0, 1}


KILLED_SCRIPT = """
import os, signal, sys, time
import numpy as np
import hvdlite as hvd
os.environ["HVDLITE_TIMELINE"] = sys.argv[1]
hvd.init()
end = time.time() + 2.5
i = 0
while time.time() < end:
    hvd.allreduce(np.ones(1000, np.float32), name=f"t.{i % 10}")
    i += 1
print("written", i, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_timeline_survives_sigkill(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED_SCRIPT)
    path = tmp_path / "killed.json"
    proc = subprocess.run([mpiexec(), "-n", "1", sys.executable, str(script), str(path)],
                          env=rank_env(), capture_output=True, text=True, timeout=120)
    assert "written" in proc.stdout, proc.stdout + proc.stderr
    text = path.read_text().rstrip()
    assert not text.endswith("]"), "a killed run cannot have closed the file"
    events = json.loads(text + "]")  # the array format allows the missing bracket
    spans = [e["ts"] for e in events if "ts" in e and e.get("ph") in ("B", "E")]
    assert spans and (max(spans) - min(spans)) > 1.0e6, "less than a second of events survived"
