"""The timeline: phases and rows, Horovod's layout, merging ranks' files,
starting and stopping at run time.

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_engine_features.py runs it at 2 ranks through shared memory and
through MPI. Each case starts its own engine with its HVDLITE_* settings (the
``engine`` fixture of engine_fixture.py).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

import hvdlite as hvd
from engine_fixture import WIRE, engine, shared_dir  # noqa: F401  (engine, shared_dir: fixtures)
from harness.checks import expect
from hvdlite import timeline


# ---------------------------------------------------------------- timeline

def check_balanced(events):
    depth = {}
    for e in events:
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "B":
            depth[key] = depth.get(key, 0) + 1
        elif e.get("ph") == "E":
            depth[key] = depth.get(key, 0) - 1
            assert depth[key] >= 0, f"E without B on {key}"
    return depth


def write_timeline(r, pattern):
    """An engine writing ``pattern``, running fused, compressed and gathered collectives."""
    for step in range(3):
        hvd.grouped_allreduce([np.ones(100 + i, np.float32) for i in range(4)], name="tl.group")
        hvd.allreduce(np.ones(1000, np.float32), compression=hvd.Compression.fp16, name="tl.fp16")
        hvd.allreduce(np.ones(1000, np.float32), compression=hvd.Compression.topk(0.1), name="tl.topk")
        hvd.allgather(np.ones((r + 1, 2), np.float32), name="tl.gather")
    hvd.stop_timeline()


def test_timeline_phases_and_rows(engine, tmp_path):
    pattern = str(tmp_path / "timeline-%r.json")
    r, n = engine(HVDLITE_TIMELINE=pattern, HVDLITE_FUSION_THRESHOLD=1 << 20)
    write_timeline(r, pattern)
    events = timeline.load(pattern.replace("%r", str(r)))
    names = {e.get("name") for e in events}
    # One host: sums (fp32 and fp16's halves) go through shared memory unless
    # it is turned off; top-k's allgather always through MPI.
    for phase in ["NEGOTIATE_ALLREDUCE", "NEGOTIATE_ALLGATHER", "QUEUE", "ALLREDUCE",
                  "MEMCPY_IN_FUSION_BUFFER", WIRE, "MEMCPY_OUT_FUSION_BUFFER", "COMPRESS", "DECOMPRESS",
                  "MPI_ALLGATHER", "ALLGATHER"]:
        assert phase in names, f"timeline lacks {phase}: {sorted(n for n in names if n)}"
    assert all(v == 0 for v in check_balanced(events).values()), "unbalanced B/E after a clean stop"
    rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"allreduce.tl.group.0", "allreduce.tl.fp16", "allreduce.tl.topk",
            "allgather.tl.gather"} <= rows, rows


def test_timeline_merge_of_every_rank(engine, shared_dir):
    """python -m hvdlite.timeline merge joins the ranks' files: one pid per rank."""
    pattern = os.path.join(shared_dir, "timeline-%r.json")
    r, n = engine(HVDLITE_TIMELINE=pattern, HVDLITE_FUSION_THRESHOLD=1 << 20)
    write_timeline(r, pattern)
    hvd.barrier()  # every rank's file is complete
    if r == 0:
        out = os.path.join(shared_dir, "merged.json")
        subprocess.run([sys.executable, "-m", "hvdlite.timeline", "merge", "-o", out,
                        *[pattern.replace("%r", str(k)) for k in range(n)]], check=True)
        with open(out) as f:
            merged = json.load(f)
        pids = {e["pid"] for e in merged["traceEvents"] if "pid" in e}
        assert pids == set(range(n)), pids


def test_timeline_started_at_run_time(engine, tmp_path):
    r, n = engine()
    path = str(tmp_path / "runtime-%r.json")
    hvd.start_timeline(path)
    hvd.allreduce(np.ones(10, np.float32), name="tl.runtime")
    hvd.stop_timeline()
    assert "tl.runtime" in open(path.replace("%r", str(r))).read()


def test_timeline_dynamic(engine, tmp_path, monkeypatch):
    """HOROVOD_TIMELINE=DYNAMIC: no file at init, start_timeline() later."""
    monkeypatch.chdir(tmp_path)
    r, n = engine(HOROVOD_TIMELINE="DYNAMIC")
    hvd.allreduce(np.ones(10, np.float32), name="tl.dynamic")
    assert not os.path.exists(tmp_path / "DYNAMIC"), "a file named DYNAMIC was written"
    path = str(tmp_path / "runtime-%r.json")
    hvd.start_timeline(path)
    hvd.allreduce(np.ones(10, np.float32), name="tl.dynamic.on")
    hvd.stop_timeline()
    assert "tl.dynamic.on" in open(path.replace("%r", str(r))).read()


def test_timeline_unwritable_path(engine):
    engine()
    expect(hvd.InvalidArgumentError, lambda: hvd.start_timeline("/proc/no-such-dir/tl-%r.json"), "no-such-dir")


def row_spans(events):
    """{row label: [(depth, phase)]} in the order the phases began."""
    labels = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    depth, spans = {}, {}
    for e in events:
        if e.get("ph") == "B":
            d = depth.get(e["tid"], 0)
            spans.setdefault(labels[e["tid"]], []).append((d, e["name"]))
            depth[e["tid"]] = d + 1
        elif e.get("ph") == "E":
            depth[e["tid"]] -= 1
    return spans


def test_timeline_horovod_layout(engine, tmp_path):
    """The timeline reads like Horovod's: a row per tensor labelled
    "<op>.<name>", NEGOTIATE_<OP> then the operation's span with its
    activities nested, times counted from start_time_since_epoch_in_micros."""
    pattern = str(tmp_path / "horovod-layout-%r.json")
    started_us = time.time() * 1e6
    r, n = engine(HOROVOD_TIMELINE=pattern, HOROVOD_TIMELINE_MARK_CYCLES=1)
    path = pattern.replace("%r", str(r))
    x = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
    assert np.array_equal(hvd.allreduce(x, op=hvd.Sum, name="hl.sum"), x * n)
    # Tools may read the file while the run goes on: the row reaches it before
    # anything else is submitted (the bound only guards against a hang).
    give_up = time.monotonic() + 60
    while "allreduce.hl.sum" not in open(path).read():
        assert time.monotonic() < give_up, "the row never reached the file while the run went on"
        time.sleep(0.01)
    hvd.allreduce(x, op=hvd.Sum)  # unnamed: the engine's own name
    assert hvd.allgather(x, name="hl.gather").shape == (n * n, 2)
    assert np.array_equal(hvd.broadcast(x + r, 0, name="hl.bcast"), x)
    received, _ = hvd.alltoall(x + r, name="hl.a2a")  # row r of every rank
    assert np.array_equal(received[:, 0], np.arange(n) + 2 * r), received
    assert np.array_equal(hvd.reducescatter(x, op=hvd.Sum, name="hl.rs"), x[r:r + 1] * n)
    mine = "allreduce" if r == 0 else "allgather"
    expect(hvd.TensorMismatchError, lambda: getattr(hvd, mine)(x, name="hl.mismatch"))
    pset = hvd.add_process_set([0])
    hvd.remove_process_set(pset)
    hvd.barrier()
    hvd.stop_timeline()
    stopped_us = time.time() * 1e6

    events = timeline.load(path)
    start = timeline.start_time_us(events)
    assert started_us - 1e6 <= start <= stopped_us, (started_us, start)
    ts = [e["ts"] for e in events if "ts" in e]
    assert min(ts) >= 0 and start + max(ts) <= stopped_us + 1e6, (min(ts), max(ts))
    assert "CYCLE_START" in {e.get("name") for e in events}
    spans = row_spans(events)
    expected = {"allreduce.hl.sum": ("ALLREDUCE", {"QUEUE", "MEMCPY_IN_FUSION_BUFFER", WIRE,
                                                   "MEMCPY_OUT_FUSION_BUFFER"}),
                "allgather.hl.gather": ("ALLGATHER", {"QUEUE", "MPI_ALLGATHER"}),
                "broadcast.hl.bcast": ("BROADCAST", {"QUEUE", "MPI_BCAST"}),
                "alltoall.hl.a2a": ("ALLTOALL", {"QUEUE", "MPI_ALLTOALL"}),
                "reducescatter.hl.rs": ("REDUCESCATTER", {"QUEUE", "MPI_REDUCESCATTER"})}
    for row, (op, activities) in expected.items():
        got = spans.get(row)
        assert got and got[:2] == [(0, "NEGOTIATE_" + op), (0, op)], (row, got)
        assert {name for d, name in got[2:]} == activities and all(d == 1 for d, _ in got[2:]), \
            (row, got)
    assert spans[f"{mine}.hl.mismatch"][:2] == [(0, f"NEGOTIATE_{mine.upper()}"), (0, "ERROR")]
    unnamed = [row for row in spans if row.startswith("allreduce.noname.")]
    assert len(unnamed) == 1 and spans[unnamed[0]][1] == (0, "ALLREDUCE"), sorted(spans)
    assert not [row for row in spans if row.startswith("allreduce.allreduce.")], sorted(spans)
    for op in ("ADD_PROCESS_SET", "REMOVE_PROCESS_SET", "BARRIER"):
        rows = [v for k, v in spans.items() if k.startswith(op.lower() + ".noname.")]
        assert len(rows) == 1 and rows[0][:2] == [(0, "NEGOTIATE_" + op), (0, op)], (op, sorted(spans))
    assert all(v == 0 for v in check_balanced(events).values()), "unbalanced B/E after a clean stop"
    ends = [e for e in events if e.get("ph") == "E" and e.get("name") == "ALLREDUCE"]
    assert ends and all({"dtype", "shape"} <= set(e.get("args", {})) for e in ends), ends
