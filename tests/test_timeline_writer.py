"""Timeline writer (csrc/timeline/timeline.cc, built standalone with g++) and the
tool (hvdlite/timeline.py: merge, summarize, stragglers, plot) on synthetic
per-rank files."""
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from harness.checks import REQUIRE_ALL, require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "hvdlite", "timeline.py")


def _load_tool():
    # By path: the tool is stdlib-only and must not need the compiled engine.
    spec = importlib.util.spec_from_file_location("hvdlite_timeline_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tl = _load_tool()


def _cli(*args, module=False):
    cmd = [sys.executable] + (["-m", "hvdlite.timeline"] if module else [TOOL]) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)


def _balanced_rows(events):
    """{(pid, tid): depth at the end}; asserts no E without its B."""
    depth = {}
    for e in events:
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "B":
            depth[key] = depth.get(key, 0) + 1
        elif e.get("ph") == "E":
            depth[key] = depth.get(key, 0) - 1
            assert depth[key] >= 0, f"E without B on {key}"
    return depth


# ---------------------------------------------------------------- C++ writer

@pytest.fixture(scope="module")
def writer_binary(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        if REQUIRE_ALL:
            pytest.fail("g++ is required in CI to build tests/cpp/test_timeline.cc")
        pytest.skip("g++ not installed")
    out = str(tmp_path_factory.mktemp("timeline_bin") / "test_timeline")
    cmd = [gxx, "-std=c++17", "-O2", "-pthread", "-Wall", "-Wextra", "-Werror",
           "-I" + os.path.join(ROOT, "csrc"),
           os.path.join(ROOT, "tests", "cpp", "test_timeline.cc"),
           os.path.join(ROOT, "csrc", "timeline", "timeline.cc"),
           os.path.join(ROOT, "csrc", "common", "json_text.cc"),
           "-o", out]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return out


def test_writer_cpp(writer_binary, tmp_path):
    res = subprocess.run([writer_binary, str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all timeline checks passed" in res.stdout

    # The SIGKILLed child's file: no closing bracket, ends on a whole event,
    # readable as is by the tool and by json after adding the bracket.
    killed = str(tmp_path / "killed-1.json")
    text = open(killed, encoding="utf-8").read()
    assert text.startswith("[\n") and text.rstrip().endswith("}")
    json.loads(text + "]")
    events, truncated = tl._load(killed)
    assert truncated
    ts = [e["ts"] for e in events if e["ph"] != "M"]
    assert max(ts) - min(ts) > 1_000_000
    assert all(d <= 2 for d in _balanced_rows(events).values())
    meta = {e["name"]: e["args"] for e in events if e["ph"] == "M" and e["tid"] == 0}
    # As in Horovod's files: times count from the wall-clock start in the metadata.
    start = tl.start_time_us(events)
    assert abs(start - time.time() * 1e6) < 3600e6
    assert 0 <= min(ts) and max(ts) < 600e6
    assert meta["process_name"] == {"name": "rank 1", tl.START_TIME_KEY: start}
    assert meta["process_sort_index"] == {"sort_index": 1}

    # A cleanly stopped file is plain JSON with balanced rows and named rows.
    events = json.load(open(tmp_path / "threads-3.json", encoding="utf-8"))
    assert not any(_balanced_rows(events).values())
    rows = {e["tid"]: e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"}
    assert len(set(rows.values())) == len(rows)
    assert "q\"uote\\back\nnl\ttab\x01 \u00fc ok \ufffd\ufffd bad" in rows.values()
    assert "cycle markers" in rows.values()
    assert all(e["pid"] == 3 for e in events)

    # The real writer's files merge like the synthetic ones.
    merged = str(tmp_path / "merged.json")
    tl.merge([killed, str(tmp_path / "threads-3.json")], merged)
    assert {e["pid"] for e in json.load(open(merged))["traceEvents"]} == {1, 3}


# ------------------------------------------------------------ synthetic files

T0 = 1_700_000_000_000_000  # microseconds since the epoch: the earliest event
TENSORS = ["allreduce.grad/conv1", "allreduce.grad/fc \"out\""]
STRAGGLER, LAG_US, STEPS = 1, 5000, 6


def _start_us(rank):
    # Each rank started its timeline at its own moment, before its first event.
    return T0 - 1000 * (rank + 1)


def _rank_events(rank, steps=STEPS, before_horovod_names=False):
    """A per-rank file's events: rank STRAGGLER enters negotiation LAG_US
    late every step; the others wait for it inside NEGOTIATE_ALLREDUCE.
    ``before_horovod_names``: the format of files written before the timeline
    took Horovod's names (plain NEGOTIATE, epoch times, no start time)."""
    start = 0 if before_horovod_names else _start_us(rank)
    process = {"name": f"rank {rank}"}
    if not before_horovod_names:
        process[tl.START_TIME_KEY] = start
    negotiate = "NEGOTIATE" if before_horovod_names else "NEGOTIATE_ALLREDUCE"
    ev = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": process},
          {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
           "args": {"sort_index": rank}}]
    for i, name in enumerate(TENSORS):
        ev.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": 3 + i,
                   "args": {"name": name}})
    for step in range(steps):
        base = T0 + step * 100_000 + rank * 10 - start  # ranks' clocks a little apart
        for i, _ in enumerate(TENSORS):
            tid = 3 + i
            enter = base + i * 1000 + (LAG_US if rank == STRAGGLER else 0)
            agreed = base + i * 1000 + LAG_US + 200
            ev += [{"name": negotiate, "ph": "B", "ts": enter, "pid": rank, "tid": tid},
                   {"name": negotiate, "ph": "E", "ts": agreed, "pid": rank, "tid": tid},
                   {"name": "ALLREDUCE", "ph": "B", "ts": agreed, "pid": rank, "tid": tid},
                   {"name": "MPI_ALLREDUCE", "ph": "B", "ts": agreed + 10, "pid": rank,
                    "tid": tid},
                   {"name": "MPI_ALLREDUCE", "ph": "E", "ts": agreed + 510, "pid": rank,
                    "tid": tid},
                   {"name": "ALLREDUCE", "ph": "E", "ts": agreed + 520, "pid": rank, "tid": tid,
                    "args": {"dtype": "float32", "shape": "[2, 3]"}}]
    return ev


def _write_rank(path, events, cut=False):
    """Writes the writer's format; `cut` imitates a SIGKILL of rank 2: an open
    B, no closing bracket and half an event at the end."""
    body = "[\n" + ",\n".join(json.dumps(e) for e in events)
    if cut:
        body += (',\n{"name":"MPI_ALLREDUCE","ph":"B","ts":%d,"pid":2,"tid":3}'
                 % (T0 + 900_000 - _start_us(2)))
        body += ',\n{"name":"MEMCPY_OUT_FUS'
    else:
        body += "\n]\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(body)


@pytest.fixture
def rank_files(tmp_path):
    paths = []
    for rank in range(3):
        path = str(tmp_path / f"tl-{rank}.json")
        _write_rank(path, _rank_events(rank), cut=(rank == 2))
        paths.append(path)
    return paths


@pytest.mark.parametrize("tail,expected", [
    ("\n]\n", 2), ("", 2), (",\n", 2), (',\n{"name":"X","ph":"B","ts":12', 2),
    (",\n{\"name\":\"X\",\"ph\":\"B\",\"ts\":12,\"pid\":0,\"tid\":1}", 3)])
def test_load_tolerates_cut_files(tmp_path, tail, expected):
    path = tmp_path / "f.json"
    path.write_text('[\n{"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"rank 0"}},\n'
                    '{"name":"Q","ph":"i","s":"t","ts":10,"pid":0,"tid":1}' + tail)
    assert len(tl.load(str(path))) == expected


def test_load_empty_and_object_forms(tmp_path):
    only_bracket = tmp_path / "a.json"
    only_bracket.write_text("[")  # killed right after opening
    assert tl.load(str(only_bracket)) == []
    obj = tmp_path / "b.json"
    obj.write_text(json.dumps({"traceEvents": [{"ph": "i", "ts": 1, "pid": 0, "tid": 0}]}))
    assert len(tl.load(str(obj))) == 1
    bad = tmp_path / "c.json"
    bad.write_text("hello")
    with pytest.raises(ValueError):
        tl.load(str(bad))


def _check_merged(path, nranks=3):
    data = json.load(open(path, encoding="utf-8"))
    assert data["displayTimeUnit"] == "ms"
    events = data["traceEvents"]
    procs = {e["pid"]: e["args"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    # One clock for all: each process starts at the earliest event.
    assert procs == {r: {"name": f"rank {r}", tl.START_TIME_KEY: T0} for r in range(nranks)}
    sort = {e["pid"]: e["args"]["sort_index"] for e in events
            if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert sort == {r: r for r in range(nranks)}
    timed = [e["ts"] for e in events if e["ph"] != "M"]
    assert min(timed) == 0
    # Common clock: shifted by the same amount everywhere.
    offset = data["otherData"]["epoch_offset_us"]
    assert offset == T0
    negotiate = {(e["pid"], e["ts"]) for e in events
                 if e.get("name") in ("NEGOTIATE_ALLREDUCE", "NEGOTIATE") and e["ph"] == "B"}
    assert (STRAGGLER, LAG_US + STRAGGLER * 10) in negotiate
    # Rows per tensor kept, per rank; every row balanced, the cut one too.
    rows = {(e["pid"], e["args"]["name"]) for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"}
    assert rows == {(r, t) for r in range(nranks) for t in TENSORS}
    assert not any(_balanced_rows(events).values())
    return data


def test_merge_function(rank_files, tmp_path):
    out = str(tmp_path / "merged.json")
    other = tl.merge(rank_files, out)
    data = _check_merged(out)
    assert [f["truncated"] for f in other["files"]] == [False, False, True]
    assert other["files"][2]["open_phases_closed"] == 1
    assert other["negotiation_rounds"] == STEPS * len(TENSORS)
    events = data["traceEvents"]
    cut = [e for e in events if e.get("name") == "TRACE_CUT"]
    assert len(cut) == 1 and cut[0]["pid"] == 2
    # The lateness counter makes the straggler's track the only non-zero one.
    lag = {}
    for e in events:
        if e["ph"] == "C":
            lag[e["pid"]] = max(lag.get(e["pid"], 0), e["args"]["ms"])
    assert lag == {0: 0, 1: pytest.approx((LAG_US + 10) / 1000), 2: pytest.approx(0.02)}


@pytest.mark.parametrize("form", ["paths", "pattern", "glob"])
def test_merge_cli(rank_files, tmp_path, form):
    out = str(tmp_path / "merged.json")
    inputs = {"paths": rank_files,
              "pattern": [str(tmp_path / "tl-%r.json"), "--ranks", "3"],
              "glob": [str(tmp_path / "tl-*.json")]}[form]
    res = _cli("merge", "-o", out, *inputs)
    assert res.returncode == 0, res.stderr
    assert "3 rank(s)" in res.stdout and "cut by a kill" in res.stdout
    _check_merged(out)


def test_cli_as_module(rank_files, tmp_path):
    try:
        import hvdlite  # noqa: F401  (the package import loads the engine)
    except ImportError as e:
        if REQUIRE_ALL:
            raise
        pytest.skip(f"hvdlite not importable here: {e}")
    out = str(tmp_path / "merged.json")
    res = _cli("merge", "-o", out, *rank_files, module=True)
    assert res.returncode == 0, res.stderr
    _check_merged(out)


def test_cli_errors(tmp_path):
    res = _cli("merge", "-o", str(tmp_path / "m.json"), str(tmp_path / "tl-%r.json"))
    assert res.returncode == 1 and "--ranks" in res.stderr
    res = _cli("merge", "-o", str(tmp_path / "m.json"), str(tmp_path / "nope.json"))
    assert res.returncode == 1 and "nope.json" in res.stderr
    assert not glob.glob(str(tmp_path / "m.json*"))


def test_stragglers(rank_files, tmp_path):
    merged = str(tmp_path / "merged.json")
    tl.merge(rank_files, merged)
    for source in ([merged], rank_files):  # merged file, or the per-rank ones
        s = tl.stragglers(source)
        assert s["ranks"][STRAGGLER]["last"] == STEPS * len(TENSORS)
        for tensor in TENSORS:
            t = s["tensors"][tensor]
            assert t["last_rank"] == STRAGGLER and t["rounds"] == STEPS
            # The lag is against the earliest rank (rank 0, whose clock is 10 us ahead).
            assert t["mean_lag_ms"] == pytest.approx((LAG_US + 10) / 1000)
    res = _cli("stragglers", merged)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[1].split()[0] == str(STRAGGLER) and "100.0%" in lines[1]
    assert any(line.startswith("allreduce.grad/conv1") for line in lines)


def test_summarize(rank_files, tmp_path):
    s = tl.summarize(rank_files[0])
    phases = s[0]["phases"]
    assert phases["MPI_ALLREDUCE"] == {"total_us": 500 * STEPS * len(TENSORS),
                                       "count": STEPS * len(TENSORS)}
    assert s[0]["tensors"]["allreduce.grad/conv1"]["NEGOTIATE_ALLREDUCE"] == (LAG_US + 200) * STEPS
    assert phases["ALLREDUCE"]["count"] == STEPS * len(TENSORS)
    res = _cli("summarize", str(tmp_path / "tl-%r.json"), "--ranks", "3")
    assert res.returncode == 0, res.stderr
    assert "rank 2 (file cut: killed?)" in res.stdout and "MPI_ALLREDUCE" in res.stdout


def test_duplicate_ranks_kept_apart(tmp_path):
    a, b = str(tmp_path / "run1.json"), str(tmp_path / "run2.json")
    _write_rank(a, _rank_events(0, steps=1))
    _write_rank(b, _rank_events(0, steps=1))
    out = str(tmp_path / "m.json")
    tl.merge([a, b], out)
    names = sorted(e["args"]["name"] for e in json.load(open(out))["traceEvents"]
                   if e["ph"] == "M" and e["name"] == "process_name")
    assert names == ["rank 0", "rank 0 (run2.json)"]


def test_files_from_before_horovod_names(tmp_path):
    """Files with plain NEGOTIATE phases and epoch times (no start time in the
    metadata) still merge onto the same clock and show the straggler."""
    paths = []
    for rank in range(3):
        paths.append(str(tmp_path / f"old-{rank}.json"))
        _write_rank(paths[-1], _rank_events(rank, before_horovod_names=True))
    merged = str(tmp_path / "merged.json")
    other = tl.merge(paths, merged)
    assert other["epoch_offset_us"] == T0 and other["negotiation_rounds"] == STEPS * len(TENSORS)
    s = tl.stragglers(paths)
    assert s["ranks"][STRAGGLER]["last"] == STEPS * len(TENSORS)
    assert s["tensors"]["allreduce.grad/conv1"]["mean_lag_ms"] == pytest.approx((LAG_US + 10) / 1000)


# ------------------------------------------------------------------- plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _bar_counts(data):
    return {rank: {row: len(bars) for row, bars in rows.items()}
            for rank, rows in data["bars"].items()}


def test_plot_data_rows_and_stragglers(rank_files, tmp_path):
    """Steps 2-3 of the synthetic run: per rank a negotiate and a communicate
    row; the ranks that wait show one long negotiation per step (both tensors'
    joined), the straggler two short ones, each marked as last."""
    merged = str(tmp_path / "merged.json")
    tl.merge(rank_files, merged)
    data = tl.plot_data(merged, steps="2-3")
    # A step starts where the first rank enters conv1's negotiation: every 100 ms.
    assert data["window_ms"] == (100.0, 300.0)
    assert data["steps"] == [(2, 100.0), (3, 200.0)]
    assert data["ranks"] == [(0, "rank 0"), (1, "rank 1"), (2, "rank 2")]
    assert data["rows"] == ["negotiate", "communicate"]  # no queue, copy or compress phases here
    assert _bar_counts(data) == {0: {"negotiate": 2, "communicate": 4},
                                 1: {"negotiate": 4, "communicate": 4},
                                 2: {"negotiate": 2, "communicate": 4}}
    waited = (LAG_US + 1000 + 200) / 1000  # from conv1's entry to fc's agreement
    assert [length for _, length in data["bars"][0]["negotiate"]] == pytest.approx([waited] * 2)
    assert [length for _, length in data["bars"][1]["negotiate"]] == pytest.approx([0.2] * 4)
    assert [length for _, length in data["bars"][2]["communicate"]] == pytest.approx([0.5] * 4)

    marks = data["stragglers"]
    assert [m["rank"] for m in marks] == [STRAGGLER] * 4
    assert [m["tensor"] for m in marks] == TENSORS * 2
    assert [m["at_ms"] for m in marks] == pytest.approx(
        [step * 100 + i + LAG_US / 1000 + 0.01 for step in (1, 2) for i in range(len(TENSORS))])
    assert all(m["lag_ms"] == pytest.approx((LAG_US + 10) / 1000) for m in marks)

    # The per-rank files give the same picture as the merged one.
    assert tl.plot_data(rank_files, steps="2-3") == data
    # Marks only for rounds at least this late.
    assert tl.plot_data(merged, steps="2-3", min_lag_ms=6)["stragglers"] == []


def test_plot_data_time_window(rank_files):
    """--start-ms/--end-ms clip the bars and keep only the marks inside."""
    data = tl.plot_data(rank_files, start_ms=103, end_ms=105.5)
    assert data["window_ms"] == (103.0, 105.5) and data["steps"] == []
    # (start, length) of each bar
    assert [len(data["bars"][r]["negotiate"]) for r in range(3)] == [1, 1, 1]
    assert data["bars"][0]["negotiate"][0] == pytest.approx((103.0, 2.5))
    assert data["bars"][0]["communicate"] == [pytest.approx((105.21, 0.29))]
    assert data["bars"][1]["negotiate"] == [pytest.approx((105.01, 0.2))]
    assert [(m["rank"], m["tensor"]) for m in data["stragglers"]] == [(STRAGGLER, TENSORS[0])]
    # The last step runs to the end of the trace: rank 2's file is cut at 900 ms.
    assert tl.plot_data(rank_files, steps="6")["window_ms"] == (500.0, 900.0)


def test_plot_writes_png(rank_files, tmp_path):
    require("matplotlib")
    out = str(tmp_path / "step.png")
    data = tl.plot(rank_files, out, steps="2")
    assert data == tl.plot_data(rank_files, steps="2")
    with open(out, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert width == 1100 and height > 300  # 10 inches at 110 dpi; 3 ranks x 2 rows
    # The command line, on per-rank files named by a pattern.
    res = _cli("plot", "-o", str(tmp_path / "cli.png"), str(tmp_path / "tl-%r.json"),
               "--ranks", "3", "--steps", "2-3")
    assert res.returncode == 0, res.stderr
    assert "3 rank(s), 100.000 to 300.000 ms" in res.stdout
    assert "rows negotiate, communicate; last to negotiate: rank 1 4" in res.stdout
    assert open(tmp_path / "cli.png", "rb").read(8) == PNG_SIGNATURE


def test_plot_errors(rank_files, tmp_path):
    out = str(tmp_path / "x.png")
    res = _cli("plot", "-o", out, *rank_files, "--steps", "9")
    assert res.returncode == 1 and "the trace has 6 step(s)" in res.stderr
    res = _cli("plot", "-o", out, *rank_files, "--steps", "2", "--start-ms", "5")
    assert res.returncode == 1 and "either --steps or --start-ms" in res.stderr
    res = _cli("plot", "-o", out, *rank_files, "--start-ms", "50", "--end-ms", "40")
    assert res.returncode == 1 and "empty time window" in res.stderr
    # Without matplotlib: a message that says what to install, no traceback.
    hide = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            "sys.argv = ['timeline.py'] + sys.argv[1:]; runpy.run_path(%r, run_name='__main__')" % TOOL)
    res = subprocess.run([sys.executable, "-c", hide, "plot", "-o", out] + rank_files,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "pip install matplotlib" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not os.path.exists(out)
