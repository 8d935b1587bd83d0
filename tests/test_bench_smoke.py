"""Smoke test of the benchmark suite (python -m hvdlite.bench): a tiny run of the
allreduce and train-step cases writes the results JSON, the Markdown report and
the plots, and --report regenerates the report from the JSON alone; the C++
micro-benchmarks (bench/cpp.py) build against the engine and run tiny."""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from harness import cpp_build
from harness.checks import installed, require, unavailable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(REPO, "bench", "run.py")
PNG = b"\x89PNG\r\n\x1a\n"


def _run(args, timeout):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, RUN] + args, capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)


def _check_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == PNG, path
    assert os.path.getsize(path) > 2000, path


def test_tiny_suite_writes_json_markdown_and_plots(tmp_path):
    require("hvdlite._engine", import_module=False)
    require("matplotlib", import_module=False)
    with_torch = installed("torch")
    cases = "allreduce,train_step" if with_torch else "allreduce"
    p = _run(["--tiny", "--cases", cases, "--out-dir", str(tmp_path)], timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    # one progress line per case, start and end
    assert "[1/%d]" % len(cases.split(",")) in p.stdout

    files = glob.glob(str(tmp_path / "results" / "*.json"))
    assert len(files) == 1, files
    with open(files[0]) as f:
        data = json.load(f)
    meta = data["meta"]
    assert meta["tiny"] is True and len(meta["loadavg_start"]) == 3 and meta["mpi"]
    r50 = data["cases"]["allreduce"]["resnet50"]
    for name in ("mpi4py unfused", "mpi4py one buffer", "mpi4py 25 MB buckets",
                 "hvdlite none", "hvdlite fp16", "hvdlite topk 1%"):
        r = r50[name]
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"], (name, r)
    small = data["cases"]["allreduce"]["small"]
    assert {"mpi4py loop", "hvdlite"} <= set(small)
    assert small["hvdlite"]["per_call"]["collectives"] >= 1
    if with_torch:
        modes = data["cases"]["train_step"]["modes"]
        assert {"no communication", "hvdlite", "hvdlite fp16"} <= set(modes)
        assert modes["no communication"]["ratio_to_nocomm"] == 1.0
        assert "Horovod" in modes or "Horovod" in data["cases"]["train_step"]["absent"]

    doc = (tmp_path / "benchmarks.md").read_text()
    assert "## Targets" in doc and "## Method" in doc and "## 1. ResNet-50" in doc
    assert "| hvdlite none |" in doc and "Tiny mode" in doc
    pngs = ["bench_resnet50.png", "bench_small.png"] + (["bench_train_step.png"] if with_torch else [])
    for name in pngs:
        _check_png(str(tmp_path / "img" / name))
        assert "(img/%s)" % name in doc

    # The report alone, from the JSON: same sections, plots written again.
    out2 = tmp_path / "again"
    q = _run(["--report", files[0], "--out-dir", str(out2)], timeout=120)
    assert q.returncode == 0, q.stdout + q.stderr
    doc2 = (out2 / "benchmarks.md").read_text()
    assert doc2.count("\n## ") == doc.count("\n## ")
    for name in pngs:
        _check_png(str(out2 / "img" / name))


def _bench_module(name):
    sys.path.insert(0, REPO)
    try:
        return __import__(f"bench.{name}", fromlist=["_"])
    finally:
        sys.path.remove(REPO)


def _built(program, tmp_path):
    """bench/<program>.cc linked by bench/cpp.py against the sanitized engine
    build the C++ tests use (compiled once per source tree; the benchmark's own
    -O3 build of the same sources would be a second compile of the engine):
    an overread or undefined behaviour in the program fails its test."""
    cpp = _bench_module("cpp")
    if not os.path.isfile(cpp.mpicxx()):
        unavailable("no mpicxx found: install the mpich wheel (pip install mpich)")
    return cpp.link(program, cpp_build.engine_objects(), cpp_build.FLAGS, str(tmp_path / program))


def test_compressors_bench_builds_and_runs_tiny(tmp_path):
    """bench/compressors_bench.cc on 1,000,000 floats, 1 repetition: the table
    the kernels case parses, with every row the report shows."""
    kernels = _bench_module("kernels")
    p = subprocess.run([_built("compressors_bench", tmp_path), "1", "1000000"], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    cpp_build.assert_ran_clean(p, "compressors_bench")
    header, rows = kernels.parse(p.stdout)
    assert header and header.startswith("1000000 float32") and "1 reps" in header, p.stdout
    missing = [key for key, _ in kernels.HEADLINE if key not in rows]
    assert not missing, f"rows missing: {missing}\n{p.stdout}"
    for name, r in rows.items():
        assert r["median_ms"] >= r["best_ms"] >= 0 and r["ratio_wall"] >= 0 and r["ratio_cpu"] >= 0, (name, r)
    for key, _ in kernels.HEADLINE:  # each at least 1/100 of a memcpy of the buffer
        assert rows[key]["ratio_wall"] > 0 and rows[key]["ratio_cpu"] > 0, (key, rows[key])
    assert rows["memcpy float32 (the whole buffer)"]["ratio_wall"] == 1.0, p.stdout


def test_sum_step_bench_builds_and_runs_tiny(tmp_path):
    """bench/sum_step_bench.cc on 1 MB tensors, 3 repetitions: both ways of
    the shared-memory sum step timed."""
    p = subprocess.run([_built("sum_step_bench", tmp_path), "3", "1"], capture_output=True, text=True, timeout=300)
    cpp_build.assert_ran_clean(p, "sum_step_bench")
    m = re.fullmatch(r"sum step per 1 MB tensor, median of 3: scratch ([\d.]+) ms, one pass ([\d.]+) ms\n",
                     p.stdout)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, p.stdout


def test_kernel_table_parser():
    """The compression-kernel case parses compressors_bench's table (no build needed)."""
    kernels = _bench_module("kernels")
    text = "\n".join([
        "25557032 float32 (102.2 MB), 7 reps, fp16 kernels: f16c",
        "ms                                               median     best cpu best   best/memcpy (wall, cpu)",
        "memcpy float32 (the whole buffer)                 10.07     9.20     9.10    1.00x   1.00x",
        "fp16 round trip (sum of the two)                  18.63    16.64    16.50    1.81x   1.81x",
        "  scalar fallback: compress                       30.28    30.28     5.60   77.02x  14.18x",
        "top-k 0.01 compress, 161 segments                 60.16    52.08    52.09    5.66x   5.72x",
        "  (repeated passes 0, mid-pass trims 14)",
    ])
    header, rows = kernels.parse(text)
    assert header.startswith("25557032 float32")
    assert set(rows) == {"memcpy float32 (the whole buffer)", "fp16 round trip (sum of the two)",
                         "scalar fallback: compress", "top-k 0.01 compress, 161 segments"}
    assert rows["fp16 round trip (sum of the two)"] == {
        "median_ms": 18.63, "best_ms": 16.64, "cpu_best_ms": 16.5, "ratio_wall": 1.81, "ratio_cpu": 1.81}


def test_compressor_series_styles(tmp_path):
    """Every compressor has its own colour and its own marker in every plot
    (bench/report_plots.py), whatever the benchmark calls the series; other
    series (MPI, hvdlite with a setting changed) get styles of their own."""
    plots = _bench_module("report_plots")
    names = {"none": "none", "hvdlite": "none", "hvdlite none": "none", "fp16": "fp16",
             "hvdlite fp16": "fp16", "bf16": "bf16", "hvdlite bf16": "bf16",
             "top-k 1%": "top-k", "hvdlite topk 1%": "top-k", "top-k 0.1% + warm-up": "top-k",
             "top-k 1% + DGC": "DGC", "hvdlite topk 0.1% + DGC": "DGC", "PowerSGD r2": "PowerSGD",
             "hvdlite powersgd r4": "PowerSGD", "mpi4py unfused": None,
             "hvdlite none RING_ALLREDUCE=0": None, "hvdlite HIERARCHICAL_ALLGATHER=0": None}
    assert {n: plots.compressor(n) for n in names} == names
    styles = plots.COMPRESSOR_STYLES
    assert list(styles) == ["none", "fp16", "bf16", "top-k", "DGC", "PowerSGD"]
    assert len({c for c, _ in styles.values()}) == len({m for _, m in styles.values()}) == 6
    # The same compressor looks the same in the accuracy plot and the hosts' bars.
    accuracy = plots.series_styles(["none", "bf16", "top-k 0.1% + DGC", "PowerSGD r4"])
    train = plots.series_styles(["hvdlite", "hvdlite bf16", "hvdlite topk 0.1% + DGC",
                                 "hvdlite powersgd r4"])
    assert list(accuracy.values()) == list(train.values()) == [
        styles["none"], styles["bf16"], styles["DGC"], styles["PowerSGD"]]
    # bench_hosts.png's series: no two alike, none taking a compressor's colour or marker.
    hosts = ["mpi4py unfused", "mpi4py one buffer", "mpi4py 25 MB buckets", "hvdlite none",
             "hvdlite none HIERARCHICAL_ALLREDUCE=1", "hvdlite none HIERARCHICAL_ALLREDUCE=0",
             "hvdlite none RING_ALLREDUCE=1+HIERARCHICAL_ALLREDUCE=0", "hvdlite none RING_ALLREDUCE=0"]
    got = plots.series_styles(hosts)
    assert got["hvdlite none"] == styles["none"]
    others = [got[n] for n in hosts if n != "hvdlite none"]
    assert len({c for c, _ in got.values()}) == len({m for _, m in got.values()}) == len(hosts)
    assert not {c for c, _ in others} & {c for c, _ in styles.values()}
    assert not {m for _, m in others} & {m for _, m in styles.values()}

    require("matplotlib", import_module=False)
    out = str(tmp_path / "layouts.png")
    plots.plot_layout_bars(out, {"2x1": {"hvdlite": {"r": 2.0}, "hvdlite fp16": {"r": 1.5}},
                                 "4x1": {"hvdlite": {"r": 3.0}}}, "r", None, "ratio", "title",
                           highlight="hvdlite")
    _check_png(out)


@pytest.mark.parametrize("signame,ignored", [("SIGTERM", False), ("SIGINT", True)])
def test_signal_stops_the_bench_and_its_job(tmp_path, signame, ignored):
    """A signal ends the bench through its cleanups: the running job's ranks are
    stopped, not left behind, and the bench exits 128 + the signal. SIGINT too when
    it was started with SIGINT ignored (a shell's background job)."""
    from harness.hosts import tagged_processes, wait_until_gone
    require("hvdlite._engine", import_module=False)
    require("torch", import_module=False)
    sig = getattr(signal, signame)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, RUN, "--tiny", "--cases", "train_step", "--set", "train_rounds=200",
         "--out-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, cwd=REPO, preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None)
    try:
        first = proc.stdout.readline()
        logs = re.search(r"logs in (\S+?)\)", first)
        assert logs, first
        deadline = time.time() + 120
        while len(tagged_processes(logs.group(1))) < 3 and time.time() < deadline:  # hvdrun and 2 ranks
            time.sleep(0.5)
        assert len(tagged_processes(logs.group(1))) >= 3, first + proc.stdout.read()
        time.sleep(3)   # the ranks past their imports
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, first + out
    left = wait_until_gone(logs.group(1), timeout=20)
    assert not left, "ranks left behind: %s" % left


def test_tiny_hosts_and_autotune_cases(tmp_path):
    """Case 7 between two emulated hosts (wire floor beside the contenders),
    case 9 (the train step there, with compression), case 11 (a DDP and an FSDP2
    script on hvdlite's backend, on one host and there) and case 8 (autotune's choice
    timed beside a sweep) in a tiny run."""
    from harness.checks import REQUIRE_ALL
    require("hvdlite._engine", import_module=False)
    require("torch", import_module=False)
    require("matplotlib", import_module=False)
    p = _run(["--tiny", "--cases", "hosts,hosts_train,autotune,ddp", "--set", "hosts_layouts=2x1",
              "--set", "ddp_layouts=2x1", "--out-dir", str(tmp_path)], timeout=500)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(glob.glob(str(tmp_path / "results" / "*.json"))[0]) as f:
        cases = json.load(f)["cases"]
    doc = (tmp_path / "benchmarks.md").read_text()
    ddp_modes = {"no communication", "torch DDP, no communication", "torch DDP (gloo)",
                 "torch DDP (hvdlite)", "torch FSDP2 (gloo)", "torch FSDP2 (hvdlite)", "hvdlite"}
    assert ddp_modes <= set(cases["ddp"]["one_host"]["modes"]), cases["ddp"]["one_host"]
    assert "## Case 11: DDP and FSDP2 on hvdlite's torch.distributed backend" in doc
    _check_png(str(tmp_path / "img" / "bench_ddp.png"))
    hosts = cases["hosts"]
    if "skipped" in hosts:  # no network namespaces here (not root): CI has them
        assert not REQUIRE_ALL, hosts["skipped"]
    else:
        r50 = hosts["layouts"]["2x1"]["resnet50"]
        assert {"wire floor", "hvdlite none", "hvdlite none RING_ALLREDUCE=0", "mpi4py unfused",
                "torch gloo async", "torch.distributed hvdlite async"} <= set(r50), list(r50)
        assert r50["wire floor"]["ratio_to_wire_floor"] == 1.0 and r50["hvdlite none"]["ratio_to_wire_floor"] > 0
        assert "## Case 7: between hosts" in doc and "| wire floor |" in doc
        _check_png(str(tmp_path / "img" / "bench_hosts.png"))
        gather = hosts["layouts"]["2x1"]["allgather"]
        assert {"wire floor", "mpi4py allgather", "hvdlite", "hvdlite HIERARCHICAL_ALLGATHER=0"} <= set(gather)
        _check_png(str(tmp_path / "img" / "bench_hosts_allgather.png"))
        modes = cases["hosts_train"]["layouts"]["2x1"]["modes"]
        assert {"no communication", "hvdlite", "hvdlite fp16", "hvdlite topk 1%"} <= set(modes), list(modes)
        assert all(m["median_ms"] > 0 for m in modes.values())
        assert "## Case 9: train step between hosts" in doc
        _check_png(str(tmp_path / "img" / "bench_hosts_train.png"))
        assert ddp_modes <= set(cases["ddp"]["hosts"]["layouts"]["2x1"]["modes"])
    tune = cases["autotune"]
    chosen = [m for m in tune["modes"] if m.startswith("hvdlite autotuned")]
    assert len(chosen) == 1 and tune["autotune"]["label"] == chosen[0], tune["modes"]
    assert tune["autotune"]["log"][-1]["note"] == "best" and tune["autotune"]["samples"] > 0
    assert tune["autotune"]["ratio_to_best_of_sweep"] > 0
    assert "## Case 8: autotune against a sweep" in doc


def test_tiny_compression_accuracy_case(tmp_path):
    """Case 10 in a tiny run: the digits example once per compressor (2 ranks,
    1 epoch), each checked bitwise identical on all ranks every step, with its
    accuracy and bytes per step; the report's table and plot."""
    require("hvdlite._engine", import_module=False)
    require("torch", import_module=False)
    require("sklearn", import_module=False)
    require("matplotlib", import_module=False)
    p = _run(["--tiny", "--cases", "compression", "--out-dir", str(tmp_path)], timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(glob.glob(str(tmp_path / "results" / "*.json"))[0]) as f:
        runs = json.load(f)["cases"]["compression"]["runs"]
    assert {"none", "fp16", "bf16", "top-k 0.1% + DGC", "PowerSGD r2"} <= set(runs), list(runs)
    assert all(r["bitwise_identical_every_step"] for r in runs.values())
    none = runs["none"]["wire_bytes_per_step_last_epoch"]
    assert runs["fp16"]["wire_bytes_per_step_last_epoch"] * 2 == none
    assert runs["top-k 0.1%"]["wire_bytes_per_step_last_epoch"] < none / 5
    assert runs["PowerSGD r1"]["wire_bytes_per_step_last_epoch"] < runs["PowerSGD r4"]["wire_bytes_per_step_last_epoch"]
    doc = (tmp_path / "benchmarks.md").read_text()
    assert "## Case 10: accuracy against bytes, every compressor" in doc
    _check_png(str(tmp_path / "img" / "bench_compression_accuracy.png"))


def test_tiny_diloco_case(tmp_path):
    """Case 12 in a tiny run: the language-model example (cut to a 1-layer
    d_model 32 model) synchronous, with DiLoCo at two H on one host, and every
    method between two emulated hosts at 1 Gbit/s; ratios to the synchronous
    run of the same job; the report's tables and plot."""
    from harness.checks import REQUIRE_ALL
    require("hvdlite._engine", import_module=False)
    require("torch", import_module=False)
    require("matplotlib", import_module=False)
    p = _run(["--tiny", "--cases", "diloco", "--set", "diloco_layouts=2x1", "--out-dir", str(tmp_path)],
             timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(glob.glob(str(tmp_path / "results" / "*.json"))[0]) as f:
        case = json.load(f)["cases"]["diloco"]
    runs = case["convergence"]["runs"]
    assert list(runs) == ["sync", "diloco5", "diloco10"], list(runs)
    assert runs["sync"]["val_loss_ratio"] == 1.0 and runs["sync"]["bytes_ratio"] == 1.0
    for name, h in (("diloco5", 5), ("diloco10", 10)):   # one model per H steps
        assert runs[name]["bytes_ratio"] == round(1 / h, 4), runs[name]
        assert runs[name]["val_loss"] < runs[name]["first_train_loss"], runs[name]
        assert runs[name]["curve"][-1][0] == 20 and len(runs[name]["curve"]) == 4
    doc = (tmp_path / "benchmarks.md").read_text()
    assert "## Case 12: DiLoCo against compression" in doc and "| DiLoCo H=10 |" in doc
    _check_png(str(tmp_path / "img" / "bench_diloco.png"))
    widths = case["compute"]["models"]   # the chart's compute side: one rank per width
    assert [w["d_model"] for w in widths] == [16, 32], widths
    assert widths[0]["params"] < widths[1]["params"] and all(w["seconds_per_step"] > 0 for w in widths)
    assert "**One rank's step without communication**" in doc
    hosts = case["hosts"]["1gbit"]
    if "skipped" in hosts:  # no network namespaces here (not root): CI has them
        assert not REQUIRE_ALL, hosts["skipped"]
        return
    links = hosts["layouts"]["2x1"]["runs"]
    assert list(links) == ["sync", "dgc", "powersgd", "diloco5", "streaming5"], list(links)
    sync = links["sync"]
    assert sync["peak_wire_bytes_per_step"] == 4 * 29920 and sync["seconds_to_sync_loss"] is not None
    assert links["streaming5"]["peak_wire_bytes_per_step"] < sync["peak_wire_bytes_per_step"]
    assert links["dgc"]["wire_bytes"] < sync["wire_bytes"]
    assert "**Between emulated hosts, 1gbit 2x1**" in doc


def _diloco_chart_case():
    """A diloco case measured at two rates whose step times follow a + b / rate exactly."""
    fits = {"sync": (0.5, 4e8, 1.0), "diloco50x3": (0.45, 8e6, 2.0), "powersgd": (0.6, 5e7, None)}
    hosts = {}
    for rate, bits in (("1gbit", 1e9), ("100mbit", 1e8)):
        runs = {}
        for name, (a, b, factor) in fits.items():
            steps = 100 * (3 if name.endswith("x3") else 1)
            seconds = steps * (a + b / bits)
            reached = None if factor is None else int(100 * factor)
            runs[name] = {"label": name, "steps": steps, "seconds": seconds, "val_loss": 2.0,
                          "wire_bytes": 1, "peak_wire_bytes_per_step": 1, "curve": [[steps, seconds, 1, 2.0]],
                          "steps_to_sync_loss": reached,
                          "seconds_to_sync_loss": None if reached is None else reached * (a + b / bits)}
        hosts[rate] = {"layouts": {"4x1": {"ranks": 4, "steps": 100, "params": 7e6, "runs": runs}}}
    compute = {"models": [{"d_model": 192, "params": 2e6, "seconds_per_step": 0.1},
                          {"d_model": 384, "params": 7e6, "seconds_per_step": 0.3}]}
    return fits, {"hosts": hosts, "compute": compute}


def test_diloco_chart_fits_each_run_and_picks_the_soonest(tmp_path):
    """The chart's model: a run's step fitted as a + b / rate over the measured rates, its
    steps to synchronous's final loss as a factor, runs that never reached it left out; at
    the measured width, time to the target relative to synchronous's is exact."""
    require("matplotlib", import_module=False)
    from hvdlite.bench import diloco_report as dr
    fits, case = _diloco_chart_case()
    models = dr.step_models(case)
    for name, (a, b, factor) in fits.items():
        got_a, got_b, got_factor, _ = models[name]
        assert abs(got_a - a) < 1e-9 and abs(got_b - b) < 1e-3 and got_factor == factor, (name, models[name])
    params, grid = dr.chart_grid(case, [1e8, 1e9, 1e10])
    assert params == [2e6, 7e6] and set(grid) == {"sync", "diloco50x3"}   # powersgd never reached it
    for j, bits in enumerate((1e8, 1e9, 1e10)):
        want = 2.0 * (0.45 + 8e6 / bits) / (0.5 + 4e8 / bits)
        assert abs(grid["diloco50x3"][1][j] - want) < 1e-9 and grid["sync"][1][j] == 1.0
    # 100 Mbit/s: DiLoCo at 2 x 0.53 s against 4.5 s; 10 Gbit/s: 2 x 0.4508 against 0.54.
    table = dr.chart_table(case)
    assert "| 7.0 M | 100 Mbit/s | 1.00 | 0.24 | diloco50x3 |" in table, table
    assert "| 7.0 M | 10 Gbit/s | 1.00 | 1.67 | sync |" in table, table
    dr.plot_chart(str(tmp_path / "chart.png"), case)
    _check_png(str(tmp_path / "chart.png"))


def test_diloco_bench_run_names_take_a_steps_factor():
    """bench/diloco.py: ``diloco50x3`` is DiLoCo H=50 for three times --steps; a
    ``q`` after H sends 4-bit outer gradients."""
    require("torch", import_module=False)
    require("hvdlite._engine", import_module=False)
    sys.path.insert(0, os.path.join(REPO, "bench"))
    try:
        import diloco
    finally:
        sys.path.pop(0)
    table = diloco.runs_table(0.01, 0.05)
    assert diloco.parse_run("diloco50x3", table, 150) == ("DiLoCo H=50, 3x the steps", ["--diloco", "50"], 450)
    assert diloco.parse_run("diloco50qx2", table, 150) == (
        "DiLoCo H=50, 4-bit, 2x the steps", ["--diloco", "50", "--compression", "quantize"], 300)
    assert diloco.parse_run("sync", table, 150) == ("synchronous", [], 150)
    assert diloco.parse_run("diloco7", table, 150) is None and diloco.parse_run("syncx", table, 150) is None
    # A --model with --lr sets every run's lr but the DGC run's (argparse keeps the last).
    dgc = diloco.example_argv(diloco.parse_run("dgcx2", table, 150), "--batch-size 1 --lr 5e-4", 25)
    assert dgc[:2] == ["--batch-size", "1"] and dgc[dgc.index("--lr", 3):][:2] == ["--lr", "0.05"], dgc
    lm = diloco.pytorch_lm
    assert lm.parse_args(dgc).lr == 0.05 and lm.parse_args(dgc).steps == 300
    sync = diloco.example_argv(diloco.parse_run("sync", table, 150), "--lr 5e-4", 25, "ckpt/sync")
    assert lm.parse_args(sync).lr == 5e-4 and sync[-2:] == ["--checkpoint", "ckpt/sync"]


REPORT_WITHOUT_RAW = """
import sys
sys.path.insert(0, "bench")
import allreduce
results = {"hvdlite none": {"median_ms": 10.0, "min_ms": 9.0, "max_ms": 12.0},
           "hvdlite none SHM_STREAMING_STORES=1": {"median_ms": 15.0, "min_ms": 14.0, "max_ms": 16.0}}
text, best = allreduce.report("set", results, ["mpi4py unfused"])
assert best is None, best
assert "(ratios against hvdlite none (no raw MPI schedule ran))" in text, text
assert "| hvdlite none SHM_STREAMING_STORES=1 | 15.00 | 14.00 | 16.00 | 1.50x |" in text, text
print("ok")
"""


def test_allreduce_report_without_a_raw_contender():
    """--contenders with hvdlite settings only (no raw MPI schedule): ratios
    against the first contender, not a KeyError."""
    require("hvdlite._engine", import_module=False)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", REPORT_WITHOUT_RAW], capture_output=True, text=True,
                       env=env, timeout=120, cwd=REPO)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout + p.stderr


def test_step_phases_prints_every_rank(tmp_path):
    """bench/step_phases.py: each rank prints the four phases' medians, CPU
    and wall time, in both modes."""
    import re

    from harness.ranks import mpiexec, rank_env
    require("torch", import_module=False)
    require("hvdlite._engine", import_module=False)
    for mode in ("nocomm", "hvdlite"):
        p = subprocess.run([mpiexec(), "-n", "2", sys.executable, os.path.join(REPO, "bench", "step_phases.py"),
                            mode, "--steps", "2", "--warmup", "1"],
                           capture_output=True, text=True, env=rank_env(), timeout=240, cwd=REPO)
        assert p.returncode == 0, p.stdout + p.stderr
        for r in range(2):
            line = next((l for l in p.stdout.splitlines() if l.startswith(f"{mode} rank {r},")), None)
            assert line is not None, p.stdout
            phases = re.findall(r"(\w+) ([\d.]+)/([\d.]+)", line)
            assert [name for name, _, _ in phases] == ["forward", "backward", "synchronize", "optimizer"], line
            assert all(float(w) > 0 for name, _, w in phases if name != "synchronize" or mode == "hvdlite"), line
