"""Case 4: the compression kernels alone, as ratios to a memcpy of the same bytes.

Builds bench/compressors_bench.cc with the MPI compiler wrapper the engine was
built with (same flags as the engine: -std=c++17 -O3, runtime kernel dispatch)
into a cache directory keyed by the sources' hash, runs it ``runs`` times and
parses its table. Rows are aggregated over runs: median of the medians, best
of the bests, best of the per-thread CPU times.
"""
import ast
import glob
import hashlib
import os
import re
import shutil
import statistics
import subprocess

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
ROW = re.compile(r"^(\S.*?|\s+\S.*?)\s{2,}(-?[\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)\s+([\d.]+)x\s+([\d.]+)x\s*$")


def sources():
    """The bench and the engine's sources less the C API (build_engine.py's
    ENGINE_SOURCES, read from the file: importing it writes _build_info.py),
    so the compressors link with whatever they use."""
    csrc = os.path.join(REPO, "csrc")
    tree = ast.parse(open(os.path.join(REPO, "build_engine.py")).read())
    listed = next(ast.literal_eval(node.value) for node in tree.body
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "ENGINE_SOURCES")
    files = [os.path.join(BENCH, "compressors_bench.cc")]
    files += [os.path.join(csrc, f) for f in listed if f != "api/c_api.cc"]
    headers = sorted(glob.glob(os.path.join(csrc, "**", "*.h"), recursive=True))
    return files, headers


def mpicxx():
    exe = os.environ.get("MPICXX")
    if not exe:
        try:
            from hvdlite import _build_info
            exe = _build_info.MPICXX
        except ImportError:
            exe = None
    if not exe or not os.path.exists(exe):
        import sys
        exe = shutil.which("mpicxx") or os.path.join(sys.prefix, "bin", "mpicxx")
    return exe


def build(cache_dir=None, log=None):
    """Compile the micro-benchmark (cached); returns the binary's path."""
    files, headers = sources()
    h = hashlib.sha256()
    for f in files + headers:
        with open(f, "rb") as fh:
            h.update(f.encode() + b"\0" + fh.read())
    cxx = mpicxx()
    h.update(cxx.encode())
    cache_dir = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "hvdlite-bench")
    out_dir = os.path.join(cache_dir, h.hexdigest()[:16])
    exe = os.path.join(out_dir, "compressors_bench")
    if os.path.exists(exe):
        return exe, cxx
    os.makedirs(out_dir, exist_ok=True)
    cmd = [cxx, "-std=c++17", "-O3", "-I", os.path.join(REPO, "csrc")] + files + ["-o", exe + ".tmp"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("building compressors_bench failed:\n%s\n%s" % (" ".join(cmd), p.stderr[-3000:]))
    os.replace(exe + ".tmp", exe)
    return exe, cxx


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
    exe, cxx = build(cache_dir)
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
            "flags": "-std=c++17 -O3", "rows": rows}


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
