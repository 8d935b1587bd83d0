"""Case 4: the compression kernels alone, as ratios to a memcpy of the same bytes.

Builds bench/compressors_bench.cc against the engine (bench/cpp.py: the MPI
compiler wrapper the engine was built with, its flags -std=c++17 -O3, runtime
kernel dispatch; cached by the sources' hash), runs it ``runs`` times and
parses its table. Rows are aggregated over runs: median of the medians, best
of the bests, best of the per-thread CPU times.
"""
import os
import re
import statistics
import subprocess

from . import cpp
from .report_format import case_failed, load_str, ms, ratio, table
from .report_plots import pyplot

ROW = re.compile(r"^(\S.*?|\s+\S.*?)\s{2,}(-?[\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)\s+([\d.]+)x\s+([\d.]+)x\s*$")


def parse(text):
    """The bench's table -> {row name: {median_ms, best_ms, cpu_best_ms, ratio_wall, ratio_cpu}}."""
    rows, header = {}, None
    for line in text.splitlines():
        if header is None and "float32" in line and "reps" in line:
            header = line.strip()
        m = ROW.match(line)
        if m:
            rows[m.group(1).strip()] = {"median_ms": float(m.group(2)), "best_ms": float(m.group(3)),
                                        "cpu_best_ms": float(m.group(4)), "ratio_wall": float(m.group(5)),
                                        "ratio_cpu": float(m.group(6))}
    return header, rows


def run(floats=25557032, reps=7, runs=3, cache_dir=None, progress=None):
    exe, cxx = cpp.build("compressors_bench", cache_dir)
    per_run = []
    header = None
    for i in range(runs):
        p = subprocess.run([exe, str(reps), str(floats)], capture_output=True, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        if p.returncode != 0:
            raise RuntimeError("compressors_bench failed: %s" % p.stderr[-2000:])
        header, rows = parse(p.stdout)
        per_run.append(rows)
        if progress:
            progress(i + 1, runs)
    names = list(per_run[0])
    rows = {}
    for n in names:
        vals = [r[n] for r in per_run if n in r]
        med = statistics.median(v["median_ms"] for v in vals)
        best = min(v["best_ms"] for v in vals)
        cpu = min(v["cpu_best_ms"] for v in vals)
        rows[n] = {"median_ms": med, "best_ms": best, "cpu_best_ms": cpu,
                   "min_median_ms": min(v["median_ms"] for v in vals),
                   "max_median_ms": max(v["median_ms"] for v in vals)}
        # The bench's own ratios (to memcpy's best wall / CPU time of the same run) are
        # exact; medians over runs.
        rows[n]["ratio_best"] = statistics.median(v["ratio_wall"] for v in vals)
        rows[n]["ratio_cpu"] = statistics.median(v["ratio_cpu"] for v in vals)
    return {"floats": floats, "reps": reps, "runs": runs, "header": header, "compiler": cxx,
            "flags": " ".join(cpp.FLAGS), "rows": rows}


# The rows the report shows, with the names users know them by.
HEADLINE = [
    ("memcpy float32 (the whole buffer)", "memcpy fp32 buffer (reference)"),
    ("fp16 round trip (sum of the two)", "fp16 round trip (compress + decompress)"),
    ("fp16 compress (float -> half)", "fp16 compress"),
    ("fp16 decompress (half -> float)", "fp16 decompress"),
    ("top-k 0.01 compress, 1 segment", "top-k 1% selection, 1 tensor"),
    ("top-k 0.01 compress, 161 segments", "top-k 1% selection, 161 tensors"),
    ("top-k 0.01 + error feedback compress, 161 seg", "top-k 1% + error feedback, 161 tensors"),
    ("top-k 0.01 decompress (zero + scatter)", "top-k 1% decompress (zero + scatter)"),
    ("bf16 compress (float -> bfloat16)", "bf16 compress"),
    ("top-k 0.001 + momentum correction, 161 seg", "top-k 0.1% + DGC momentum correction, 161 tensors"),
    ("PowerSGD rank 1 compute, 161 matrices", "PowerSGD rank 1 arithmetic, 161 matrices"),
    ("PowerSGD rank 4 compute, 161 matrices", "PowerSGD rank 4 arithmetic, 161 matrices"),
    ("  reference: exact nth_element k=1% (1 run)".strip(), "exact selection (nth_element), reference"),
]


# ---- the report's section (bench/report.py assembles the document) ----------------------

def plot_kernels(path, res):
    plt = pyplot()
    rows = res["rows"]
    items = [(label, rows[k]) for k, label in HEADLINE if k in rows]
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(items) + 1.3))
    y = list(range(len(items)))[::-1]
    ax.barh([v - 0.2 for v in y], [r["ratio_best"] for _, r in items], height=0.4, label="wall (best)",
            color="#2a7ab9")
    ax.barh([v + 0.2 for v in y], [r["ratio_cpu"] for _, r in items], height=0.4, label="thread CPU (best)",
            color="#9cc3e4")
    ax.set_yticks(y)
    ax.set_yticklabels([label for label, _ in items], fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1.0, color="#333333", lw=0.8)
    ax.set_xlabel("time / memcpy of the fp32 buffer (log scale)", fontsize=8)
    ax.set_title("compression kernels on %d floats, 1 thread" % res["floats"], fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def kernels_section(case, img):
    out = ["## 4. Compression kernels alone\n"]
    f = case_failed(case)
    if f:
        return "\n".join(out + [f])
    rows = case["rows"]
    out.append("`bench/compressors_bench.cc` built with `%s %s` (the engine's flags) on %d float32 "
               "(%.0f MB), one thread, %d runs x %d repetitions. Wall: best time over repetitions; "
               "CPU: the thread's CPU time, steadier on a shared machine. Ratios are to a memcpy of "
               "the fp32 buffer measured in the same run. Load %s.\n"
               % (os.path.basename(case["compiler"]), case["flags"], case["floats"], case["floats"] * 4 / 1e6,
                  case["runs"], case["reps"], load_str(case)))
    t = []
    for k, label in HEADLINE:
        if k in rows:
            r = rows[k]
            t.append([label, ms(r["median_ms"]), ms(r["best_ms"]), ms(r["cpu_best_ms"]),
                      ratio(r["ratio_best"]), ratio(r["ratio_cpu"])])
    out.append(table(["kernel", "median ms", "best ms", "CPU ms", "x memcpy (wall)", "x memcpy (CPU)"], t))
    out.append("\n" + img("bench_kernels.png", plot_kernels, case))
    return "\n".join(out)


def headline(res):
    rows = res["rows"]
    return "fp16 round trip %s memcpy, top-k 1%% (161 tensors) %s memcpy" % (
        ratio(rows["fp16 round trip (sum of the two)"]["ratio_best"]),
        ratio(rows["top-k 0.01 compress, 161 segments"]["ratio_best"]))
