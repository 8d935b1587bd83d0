"""Turns a results JSON of ``python -m hvdlite.bench`` into docs/benchmarks.md and plots.

    python -m hvdlite.bench --report bench/results/<date>.json

Everything in the document that depends on numbers is computed here from the
JSON (tables, ratios, targets met or not, the best settings of the sweep, the
network analysis), so regenerating it from another run keeps text and numbers
consistent.
"""
import math
import os
import statistics

from . import kernels as kernels_mod

R50_RAW = ["mpi4py unfused", "mpi4py one buffer", "mpi4py 25 MB buckets"]
IDLE_MODE = "hvdlite, engine priority idle"      # runs from before auto was the default
NORMAL_MODE = "hvdlite, engine priority normal"
TARGETS = {"resnet50": 1.10, "train_step": 1.15, "small": 2.0, "net_topk": 10.0, "net_fp16": 1.8}
RESNET50_FLOATS = 25557032


# ---- small helpers --------------------------------------------------------------------

def ms(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x < 1:
        return "%.3f" % x
    if x < 10:
        return "%.2f" % x
    if x < 100:
        return "%.1f" % x
    return "%.0f" % x


def ratio(x):
    return "-" if x is None else "%.2fx" % x


def table(headers, rows, align=None):
    align = align or ["---"] + ["---:"] * (len(headers) - 1)
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def best_of(results, names):
    names = [n for n in names if n in results]
    if not names:
        return None
    return min(names, key=lambda n: results[n]["median_ms"])


def met(value, limit, higher_is_better=False):
    if value is None:
        return "not measured"
    ok = value >= limit if higher_is_better else value <= limit
    return "**met**" if ok else "**not met**"


def fmt_bytes(b):
    b = int(b)
    if b == 0:
        return "0"
    if b % (1 << 20) == 0:
        return "%d MB" % (b >> 20)
    if b % 1024 == 0:
        return "%d KB" % (b >> 10)
    return "%d B" % b


def load_str(case):
    la = case.get("_loadavg") if isinstance(case, dict) else None
    if not la:
        return "?"
    return "%s -> %s" % (la["start"][0] if la.get("start") else "?", la["end"][0] if la.get("end") else "?")


def ok(data, name):
    c = data["cases"].get(name)
    return c is not None and "error" not in c and "skipped" not in c


# ---- headlines (one line per case for the progress output) ----------------------------

def headline(case, res):
    try:
        if "error" in res or "skipped" in res:
            return res.get("skipped", "")
        if case == "allreduce":
            r, s = res["resnet50"], res["small"]
            b = best_of(r, R50_RAW)
            parts = ["ResNet-50: hvdlite none %s, fp16 %s, topk %s (best raw %s %s ms)" % (
                ratio(r["hvdlite none"]["median_ms"] / r[b]["median_ms"]),
                ratio(r["hvdlite fp16"]["median_ms"] / r[b]["median_ms"]),
                ratio(r["hvdlite topk 1%"]["median_ms"] / r[b]["median_ms"]), b, ms(r[b]["median_ms"]))]
            parts.append("small: hvdlite %s of mpi4py loop" %
                         ratio(s["hvdlite"]["median_ms"] / s["mpi4py loop"]["median_ms"]))
            return "; ".join(parts)
        if case == "train_step":
            m = res["modes"]
            return ", ".join("%s %s ms (%s)" % (k, ms(v["median_ms"]), ratio(v["ratio_to_nocomm"]))
                             for k, v in m.items())
        if case == "kernels":
            rows = res["rows"]
            return "fp16 round trip %s memcpy, top-k 1%% (161 tensors) %s memcpy" % (
                ratio(rows["fp16 round trip (sum of the two)"]["ratio_best"]),
                ratio(rows["top-k 0.01 compress, 161 segments"]["ratio_best"]))
        if case == "network":
            n = network_numbers(res)
            return "fp32 %s ms, fp16 %s ms (%s faster), topk %s ms (%s faster)" % (
                ms(n["none"]), ms(n["fp16"]), ratio(n["fp16_speedup"]), ms(n["topk"]), ratio(n["topk_speedup"]))
        if case == "autotune":
            a = res["autotune"]
            return "chose fusion %s cycle %g ms in %d steps: %s the best of the sweep (%s)" % (
                fmt_bytes(a["fusion_threshold_bytes"]), a["cycle_time_ms"], a["steps"],
                ratio(a["ratio_to_best_of_sweep"]), a["best_of_sweep"])
        if case == "hosts":
            return "; ".join("%s: hvdlite %s of the wire floor, %s of the best MPICH schedule" % (
                lay, ratio(n["hvdlite"] / n["floor"]), ratio(n["hvdlite"] / n["best_mpich"]))
                for lay, n in hosts_numbers(res).items())
        if case == "compression":
            return ", ".join("%s %.2f%% (%+.2f)" % (k, acc, d or 0) for k, (acc, d, _) in
                             compression_numbers(res).items())
        if case == "hosts_train":
            return "; ".join("%s: %s" % (lay, ", ".join("%s %s" % (k, ratio(v)) for k, v in r.items()))
                             for lay, r in hosts_train_numbers(res).items()) + " (x no-comm)"
        if case == "sweep":
            b = sweep_best(res["allreduce"]["sweep"])
            return "best ResNet-50: fusion %s cycle %s ms; best small: fusion %s cycle %s ms" % (
                fmt_bytes(b["resnet50"][0]), b["resnet50"][1], fmt_bytes(b["small"][0]), b["small"][1])
    except (KeyError, TypeError, ZeroDivisionError):
        return ""
    return ""


# ---- derived numbers ------------------------------------------------------------------

def network_numbers(net):
    r = net["resnet50"]
    get = lambda k: r[k]["median_ms"] if k in r else None  # noqa: E731
    n = {"none": get("hvdlite none"), "fp16": get("hvdlite fp16"), "topk": get("hvdlite topk 1%"),
         "raw_unfused": get("mpi4py unfused"), "raw_buckets": get("mpi4py 25 MB buckets")}
    n["fp16_speedup"] = n["none"] / n["fp16"] if n["none"] and n["fp16"] else None
    n["topk_speedup"] = n["none"] / n["topk"] if n["none"] and n["topk"] else None
    meta = net.get("resnet50_meta") or {}
    mbytes = meta.get("resnet50_mbytes", RESNET50_FLOATS * 4 / 1e6)
    fp32 = [x for x in (n["raw_unfused"], n["raw_buckets"], n["none"]) if x]
    # A 2-rank allreduce sends the whole buffer once each way: the fastest fp32 exchange
    # gives (a lower bound of) the rate the link delivered.
    n["link_MBps"] = mbytes / (min(fp32) / 1e3) if fp32 else None
    n["mbytes"] = mbytes
    m = net["train_step"]["modes"]
    n["steps"] = {k: v["median_ms"] for k, v in m.items()}
    return n


def hosts_numbers(case):
    """{layout: {floor, best_mpich, best_mpich_name, hvdlite (default settings)}} in ms."""
    out = {}
    for lay, res in case.get("layouts", {}).items():
        r = res["resnet50"]
        b = best_of(r, R50_RAW)
        out[lay] = {"floor": r["wire floor"]["median_ms"], "best_mpich": r[b]["median_ms"],
                    "best_mpich_name": b, "hvdlite": r["hvdlite none"]["median_ms"]}
    return out


def sweep_best(rows):
    out = {}
    for case in ("resnet50", "small"):
        b = min(rows, key=lambda r: r[case]["median_ms"])
        out[case] = (b["fusion_threshold"], b["cycle_time_ms"], b[case]["median_ms"])
    return out


def sweep_grid(rows, case):
    fusions = sorted({r["fusion_threshold"] for r in rows})
    cycles = sorted({r["cycle_time_ms"] for r in rows})
    grid = {(r["fusion_threshold"], r["cycle_time_ms"]): r for r in rows}
    return fusions, cycles, grid


# ---- plots ----------------------------------------------------------------------------

COLORS = {"hvdlite": "#2a7ab9", "mpi4py": "#7f7f7f", "torch": "#e08a2c", "Horovod": "#c0504d",
          "no communication": "#bbbbbb"}


def color(name):
    for k, c in COLORS.items():
        if name.startswith(k):
            return c
    return "#555555"


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def bars(path, results, title, xlabel="ms (median; whiskers: min-max)", absent=()):
    plt = _plt()
    names = list(results) + list(absent)
    med = [results[n]["median_ms"] if n in results else 0 for n in names]
    lo = [results[n]["median_ms"] - results[n]["min_ms"] if n in results else 0 for n in names]
    hi = [results[n]["max_ms"] - results[n]["median_ms"] if n in results else 0 for n in names]
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(names) + 1.3))
    y = list(range(len(names)))[::-1]
    ax.barh(y, med, xerr=[lo, hi], color=[color(n) for n in names], capsize=3, ecolor="#333333")
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=8)
    top = max((results[n]["max_ms"] for n in results), default=1)
    for yi, n, m in zip(y, names, med):
        x = results[n]["max_ms"] if n in results else top * 0.01
        ax.text(x, yi, "  absent" if n not in results else "  %s ms" % ms(m), va="center", fontsize=7)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.set_xlim(0, top * 1.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_kernels(path, res):
    plt = _plt()
    rows = res["rows"]
    items = [(label, rows[k]) for k, label in kernels_mod.HEADLINE if k in rows]
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


def plot_network(path, net):
    plt = _plt()
    r = net["resnet50"]
    t = net["train_step"]["modes"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, res, title in ((a1, r, "ResNet-50 set allreduce across the link"),
                           (a2, t, "train step across the link")):
        names = list(res)
        med = [res[n]["median_ms"] for n in names]
        lo = [res[n]["median_ms"] - res[n]["min_ms"] for n in names]
        hi = [res[n]["max_ms"] - res[n]["median_ms"] for n in names]
        ax.bar(range(len(names)), med, yerr=[lo, hi], color=[color(n) for n in names], capsize=3)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=25, ha="right", fontsize=7)
        ax.set_ylabel("ms (median; min-max)", fontsize=8)
        ax.set_title("%s (%s%s)" % (title, net["rate"], ", delay " + net["delay"] if net.get("delay") else ""),
                     fontsize=9)
        for i, (m, h) in enumerate(zip(med, hi)):
            ax.text(i, m + h, ms(m), ha="center", va="bottom", fontsize=7)
        ax.set_ylim(0, max(m + h for m, h in zip(med, hi)) * 1.12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_layout_bars(path, by_layout, key, skip, ylabel, title, label=None, highlight=None):
    """Grouped bars: one group per layout, one bar per contender of
    by_layout[layout] (a {name: summary} dict) but `skip`, height summary[key],
    with a dashed line at 1."""
    plt = _plt()
    layouts = list(by_layout)
    names = [n for n in dict.fromkeys(n for lay in layouts for n in by_layout[lay]) if n != skip]
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        vals = [by_layout[lay].get(name, {}).get(key, 0) for lay in layouts]
        ax.bar([x + i * width for x in range(len(layouts))], vals, width,
               label=label(name) if label else name, color=color(name),
               alpha=1.0 if highlight in (None, name) else 0.55 + 0.1 * (i % 4))
    ax.axhline(1.0, color="#333333", lw=0.8, ls="--")
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(layouts))])
    ax.set_xticklabels(["%s hosts x ranks" % lay for lay in layouts], fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend
    ax.legend(fontsize=6, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_hosts(path, case):
    plot_layout_bars(path, {lay: res["resnet50"] for lay, res in case["layouts"].items()},
                     "ratio_to_wire_floor", "wire floor", "time / wire floor (median)",
                     "ResNet-50 set between emulated hosts at %s" % case.get("rate"),
                     label=lambda n: "hvdlite (defaults)" if n == "hvdlite none" else n.replace("hvdlite none ", "hvdlite "),
                     highlight="hvdlite none")


def plot_hosts_allgather(path, gathers, rate):
    plot_layout_bars(path, gathers, "ratio_to_wire_floor", "wire floor", "time / wire floor (median)",
                     "Allgather between emulated hosts at %s" % rate, highlight="hvdlite")


def plot_hosts_train(path, case):
    plot_layout_bars(path, {lay: res["modes"] for lay, res in case["layouts"].items()},
                     "ratio_to_nocomm", "no communication", "step / no-communication step (median)",
                     "Train step between emulated hosts at %s" % case.get("rate"), highlight="hvdlite")


def hosts_section(case, img):
    L = ["## Case 7: between hosts\n"]
    failed = case_failed(case)
    if failed:
        return "\n".join(L + [failed])
    L.append("The ResNet-50 gradient set (fp32, Sum) between emulated hosts: network namespaces with "
             "real sshd, each host's link shaped to %s with tc, UCX over TCP, ranks started by hvdrun "
             "on the hosts. The **wire floor** is measured in the same job: every host sends "
             "2(H-1)/H of the set to the next host and receives as much, with nothing summed, which "
             "is what any allreduce among H hosts must move over each link at least once. All "
             "hosts share this machine's 2 cores, so layouts with more ranks also measure CPU "
             "contention. `hvdlite none` runs with default settings; the other hvdlite rows name "
             "the setting they change.\n" % case.get("rate"))
    for lay, res in case.get("layouts", {}).items():
        r = res["resnet50"]
        b = best_of(r, R50_RAW)
        rows = [[name, ms(v["median_ms"]), ms(v["min_ms"]), ms(v["max_ms"]), ratio(v.get("ratio_to_wire_floor")),
                 ratio(v["median_ms"] / r[b]["median_ms"])] for name, v in r.items()]
        L.append("**%s** (hosts x ranks per host):\n" % lay)
        L.append(table(["contender", "median ms", "min", "max", "/ wire floor", "/ best MPICH (%s)" % b], rows))
        L.append("")
    gathers = {lay: res["allgather"] for lay, res in case.get("layouts", {}).items() if res.get("allgather")}
    if gathers:
        mb = case.get("allgather_mb")
        L.append("Allgather%s: every rank gathers every rank's part; with several ranks per host hvdlite "
                 "gathers across hosts by local rank, then inside the host (`HIERARCHICAL_ALLGATHER=0`: "
                 "MPI's allgather through every rank). The wire floor here is (H-1)/H of the result over "
                 "each link.\n" % (" of %g MB per rank" % mb if mb else ""))
        rows = []
        for lay, g in gathers.items():
            base = g.get("mpi4py allgather", {}).get("median_ms")
            for name, v in g.items():
                rows.append([lay, name, ms(v["median_ms"]), ratio(v.get("ratio_to_wire_floor")),
                             ratio(v["median_ms"] / base) if base else ""])
        L.append(table(["layout", "contender", "median ms", "/ wire floor", "/ MPI allgather"], rows))
        L.append("")
        L.append(img("bench_hosts_allgather.png", plot_hosts_allgather, gathers, case.get("rate")))
    L.append(img("bench_hosts.png", plot_hosts, case))
    return "\n".join(L) + "\n"


def hosts_train_numbers(case):
    """{layout: {mode: step / no-communication step}}."""
    return {lay: {k: v["ratio_to_nocomm"] for k, v in res["modes"].items() if k != "no communication"}
            for lay, res in case.get("layouts", {}).items() if "modes" in res}


def hosts_train_section(case, img):
    L = ["## Case 9: train step between hosts\n"]
    failed = case_failed(case)
    if failed:
        return "\n".join(L + [failed])
    first = next(iter(case["layouts"].values()))
    L.append("The train step of case 2 (%d x Linear(%d, %d), %.0f MB of float32 gradients) on the "
             "emulated hosts of case 7 (links at %s), one job per layout, modes interleaved (%d rounds "
             "x %d steps). With several ranks per host, fp16, bf16 and top-k compress only what "
             "crosses hosts: each host sums exactly in its memory, and each of its ranks compresses one "
             "block of the host's sum (the wire bytes count that block; uncompressed, the whole "
             "bucket); PowerSGD runs over all ranks. All hosts share this machine's 2 cores, so a layout with more ranks "
             "also has less CPU per rank: compare rows within a layout.\n"
             % (first["layers"], first["width"], first["width"], first.get("params", 0) * 4 / 1e6,
                case.get("rate"), first["rounds"], first["steps_per_round"]))
    for lay, res in case["layouts"].items():
        mo = res["modes"]
        base = mo.get("hvdlite", {}).get("median_ms")
        rows = [[k, ms(v["median_ms"]), ms(v["min_ms"]), ms(v["max_ms"]), ratio(v["ratio_to_nocomm"]),
                 ratio(v["median_ms"] / base) if base and k != "no communication" else "",
                 "%.0f" % (v["wire_bytes_per_rank_step"] / 1e3) if v.get("wire_bytes_per_rank_step") else ""]
                for k, v in mo.items()]
        L.append("**%s** (hosts x ranks per host):\n" % lay)
        L.append(table(["mode", "median ms", "min", "max", "x no-comm", "x hvdlite fp32", "wire KB/rank/step"],
                       rows))
        L.append("")
    L.append(img("bench_hosts_train.png", plot_hosts_train, case))
    return "\n".join(L) + "\n"


def plot_compression_accuracy(path, case):
    """Test accuracy against bytes per rank and step (steady state), log x."""
    plt = _plt()
    runs = case["runs"]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for label, r in runs.items():
        x, y = r["wire_bytes_per_step_last_epoch"], r["test_accuracy"]
        family = next((c for k, c in (("none", "#1f77b4"), ("fp16", "#ff7f0e"), ("bf16", "#ff7f0e"),
                                      ("top-k", "#2ca02c"), ("PowerSGD", "#9467bd")) if label.startswith(k)),
                      "#555555")
        ax.scatter([x], [y], s=36, color=family, marker="D" if "DGC" in label else "o", zorder=3)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
    base = runs.get("none", {}).get("test_accuracy")
    if base is not None:
        ax.axhline(base, color="#999999", lw=0.8, ls="--", zorder=1)
        ax.axhspan(base - 1.0, base, color="#dddddd", alpha=0.5, zorder=0, label="within 1 point of none")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_xscale("log")
    ax.set_xlabel("bytes per rank and step on the wire (last epoch; log)", fontsize=8)
    seeds = ",".join(str(x) for x in case.get("seeds", []))
    ax.set_ylabel("test accuracy %% (mean of seeds %s)" % seeds, fontsize=8)
    ax.set_title("Digits MLP, %d ranks, %d epochs: accuracy against bytes per compressor"
                 % (case["ranks"], case["epochs"]), fontsize=9)
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compression_numbers(case):
    """{compressor: (accuracy, points vs none, steady bytes per step)}."""
    return {k: (r["test_accuracy"], r.get("vs_none_points"), r["wire_bytes_per_step_last_epoch"])
            for k, r in case.get("runs", {}).items()}


def compression_section(case, img):
    L = ["## Case 10: accuracy against bytes, every compressor\n"]
    failed = case_failed(case)
    if failed:
        return "\n".join(L + [failed])
    L.append("The digits example (`examples/pytorch_digits.py`: a 64-128-64-10 MLP, SGD with momentum "
             "0.9) trained once per compressor and seed at %d ranks for %d epochs, every run checking "
             "after each step that the parameters are bitwise identical on all ranks (`--check`). "
             "Bytes are what one rank put on the wire for the gradients (`wire_bytes_*` of "
             "`hvdlite.engine_stats()`), per step over the whole run (warm-ups included) and over "
             "the last epoch. DGC = momentum correction (the optimizer's 0.9 moved into the engine), "
             "a 66-step density warm-up from dense and clipping at norm 5. Tensors under 1024 "
             "entries go whole under top-k and dense under PowerSGD, so here they, not the two "
             "8192-entry matrices, set the floor of the byte counts.\n" % (case["ranks"], case["epochs"]))
    rows = [[k, "%.2f" % r["test_accuracy"], "%+.2f" % r["vs_none_points"] if r.get("vs_none_points") is not None
             else "", " / ".join("%.2f" % a for a in r.get("per_seed", [])), "%d" % r["wire_bytes_per_step"],
             "%d" % r["wire_bytes_per_step_last_epoch"],
             ratio(r.get("fewer_bytes_last_epoch")), "yes" if r.get("bitwise_identical_every_step") else "NO"]
            for k, r in case["runs"].items()]
    L.append(table(["compressor", "accuracy %", "vs none", "per seed", "B/step (run)", "B/step (last epoch)",
                    "fewer bytes", "identical every step"], rows))
    L.append("")
    L.append(img("bench_compression_accuracy.png", plot_compression_accuracy, case))
    return "\n".join(L) + "\n"


def autotune_section(case):
    L = ["## Case 8: autotune against a sweep\n"]
    failed = case_failed(case)
    if failed:
        return "\n".join(L + [failed])
    a = case["autotune"]
    where = ("%s emulated hosts x ranks at %s" % (case["layout"], case["rate"])) if case.get("layout") else \
        "%d ranks on this host" % case["ranks"]
    L.append("The train step of case 2 (%s). First a tuning phase: hvdlite trains with "
             "`HVDLITE_AUTOTUNE=1` (samples of %s steps) until its search ends: %d samples in %d steps, "
             "%.1f s. Then its choice runs as one more mode, interleaved with a sweep of fixed settings "
             "(median of %d rounds x %d steps):\n"
             % (where, a["log"][1]["steps"] if len(a["log"]) > 1 else "?", a["samples"], a["steps"],
                a["seconds"], case["rounds"], case["steps_per_round"]))
    rows = [[name, ms(m["median_ms"]), ms(m["p25_ms"]), ms(m["p75_ms"]), ratio(m["ratio_to_nocomm"])]
            for name, m in case["modes"].items()]
    L.append(table(["mode", "median ms", "p25", "p75", "x no-comm"], rows))
    L.append("\nAutotune chose fusion %s, cycle %g ms: **%s** the step time of the best fixed setting "
             "(%s).\n" % (fmt_bytes(a["fusion_threshold_bytes"]), a["cycle_time_ms"],
                          ratio(a["ratio_to_best_of_sweep"]), a["best_of_sweep"]))
    return "\n".join(L) + "\n"


def plot_scaling(path, sc, neg):
    plt = _plt()
    panels = []
    if sc:
        panels += [("resnet50", "ResNet-50 set allreduce"), ("train_step", "train step")]
    if neg:
        panels.append(("negotiation", "steps of tiny tensors (negotiation)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.4), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        by = neg["by_ranks"] if key == "negotiation" else sc[key]
        ranks = sorted(by, key=int)
        names = []
        for n in ranks:
            names += [k for k in by[n] if k not in names]
        for name in names:
            xs = [int(n) for n in ranks if name in by[n]]
            ys = [by[str(n)][name]["median_ms"] for n in xs]
            ax.plot(xs, ys, marker="o", label=name,
                    linestyle="--" if ("cache off" in name or name.startswith("mpi4py")) else "-")
        ax.set_xticks([int(n) for n in ranks])
        ax.set_xlabel("ranks (%d cores)" % (sc or neg).get("cpus", 0), fontsize=8)
        ax.set_ylabel("ms (median)", fontsize=8)
        if key == "negotiation":
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(path, sw):
    plt = _plt()
    rows = sw["allreduce"]["sweep"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, case, title in ((axes[0], "resnet50", "ResNet-50 set (hvdlite none)"),
                            (axes[1], "small", "100 x 4 KB")):
        fusions, cycles, grid = sweep_grid(rows, case)
        vals = [[grid[(f, c)][case]["median_ms"] if (f, c) in grid else float("nan") for c in cycles]
                for f in fusions]
        im = ax.imshow(vals, cmap="viridis_r", aspect="auto")
        ax.set_xticks(range(len(cycles)))
        ax.set_xticklabels(["%g" % c for c in cycles], fontsize=8)
        ax.set_yticks(range(len(fusions)))
        ax.set_yticklabels([fmt_bytes(f) for f in fusions], fontsize=8)
        ax.set_xlabel("HVDLITE_CYCLE_TIME (ms)", fontsize=8)
        ax.set_ylabel("HVDLITE_FUSION_THRESHOLD", fontsize=8)
        ax.set_title(title + ", median ms", fontsize=9)
        for i, row in enumerate(vals):
            for j, v in enumerate(row):
                ax.text(j, i, ms(v), ha="center", va="center", fontsize=7, color="white")
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- the document ---------------------------------------------------------------------

def soak_section(doc_path):
    """The soak run (bench/soak.py) is measured separately; its table lives in
    benchmarks-soak.md and is included here so this page has every figure."""
    soak = os.path.join(os.path.dirname(os.path.abspath(doc_path)), "benchmarks-soak.md")
    if not os.path.exists(soak):
        return ""
    text = open(soak).read().strip().splitlines()
    body = [ln for ln in text if not ln.startswith("# ")]
    return "## Soak: 10,000 steps of mixed collectives\n\n" + "\n".join(body) + "\n"


def write(data, doc_path, img_dir, json_path):
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(doc_path)), exist_ok=True)
    written = []
    img_rel = os.path.relpath(img_dir, os.path.dirname(os.path.abspath(doc_path)))

    def img(name, fn, *a):
        path = os.path.join(img_dir, name)
        try:
            fn(path, *a)
        except Exception as e:  # noqa: BLE001 -- a plot must not lose the tables
            return "(plot %s failed: %s)" % (name, e)
        written.append(path)
        return "![%s](%s)" % (name, os.path.join(img_rel, name))

    cases = data["cases"]
    m = data["meta"]
    json_rel = os.path.relpath(os.path.abspath(json_path), os.path.dirname(os.path.abspath(doc_path)))
    repo_json = os.path.relpath(os.path.abspath(json_path), os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    L = []
    L.append("# Benchmarks\n")
    L.append("<!-- generated by `python -m hvdlite.bench --report %s`; edit bench/report.py, not this file -->\n"
             % repo_json)
    L.append("Numbers from one run of `python -m hvdlite.bench` (%s, %s%s), results in "
             "[`%s`](%s). Regenerate this page from that file with\n"
             % (m.get("date", "?"), m.get("source") or "commit `%s`" % m.get("git_commit", "?"),
                ", with uncommitted changes in %s" % ", ".join(m["git_dirty_paths"]) if m.get("git_dirty_paths") else "",
                repo_json, json_rel))
    L.append("```\npython -m hvdlite.bench --report %s\n```\n" % repo_json)
    L.append("and rerun everything (16-25 minutes on 2 vCPUs, the emulated-host cases included; `--cases` picks some, `--tiny` is a "
             "seconds-long smoke run that writes to a temporary folder) with\n")
    L.append("```\npython -m hvdlite.bench            # or: python bench/run.py\n```\n")
    L.append("(plots need matplotlib: `pip install matplotlib` or `pip install -e '.[bench]'`). Each "
             "case's worker is an ordinary hvdlite script that `hvdrun` also starts by hand, e.g.\n")
    L.append("```\nhvdrun -np 2 python bench/allreduce.py --iters 15            # cases 1 and 3\n"
             "hvdrun -np 2 python bench/train_step.py --compression fp16     # case 2\n"
             "hvdrun -np 2 python bench/allreduce.py --cases sweep          # fusion x cycle sweep\n"
             "hvdrun -np 4 python bench/allreduce.py --cases negotiation    # cache on/off\n"
             "hvdrun -np 2 python bench/breakdown.py                        # timeline phases\n"
             "hvdrun -np 2 python bench/step_phases.py hvdlite              # a train step's phases per rank\n"
             "hvdrun -np 2 python bench/step_phases.py nocomm               # the same without communication\n```\n")
    if m.get("tiny"):
        L.append("> **Tiny mode**: sizes and iteration counts are cut down; these numbers only show "
                 "that the suite works.\n")
    L.append(summary_section(data))
    L.append(method_section(data))
    if "allreduce" in cases:
        L.append(allreduce_section(cases["allreduce"], img))
    if "train_step" in cases:
        L.append(train_section(cases["train_step"], img))
    if "allreduce" in cases:
        L.append(small_section(cases["allreduce"], img))
    if "kernels" in cases:
        L.append(kernels_section(cases["kernels"], img))
    if "network" in cases:
        L.append(network_section(data, img))
    if "hosts" in cases:
        L.append(hosts_section(cases["hosts"], img))
    if "hosts_train" in cases:
        L.append(hosts_train_section(cases["hosts_train"], img))
    if "autotune" in cases:
        L.append(autotune_section(cases["autotune"]))
    if "compression" in cases:
        L.append(compression_section(cases["compression"], img))
    if "scaling" in cases or "negotiation" in cases:
        L.append(scaling_section(cases.get("scaling"), cases.get("negotiation"), img))
    if "sweep" in cases:
        L.append(sweep_section(cases["sweep"], img))
    L.append(advice_section(data))
    L.append(soak_section(doc_path))
    L.append(caveats_section(data))
    with open(doc_path, "w") as f:
        f.write("\n".join(s.rstrip() + "\n" for s in L if s))
    written.insert(0, doc_path)
    return written


def case_failed(case):
    if "error" in case:
        return "**This case failed**; the error:\n\n```\n%s\n```\n" % case["error"][-1500:]
    if "skipped" in case:
        return "**Skipped**: %s\n" % case["skipped"]
    return None


def summary_section(data):
    c = data["cases"]
    rows = []
    if ok(data, "allreduce"):
        r = c["allreduce"]["resnet50"]
        b = best_of(r, R50_RAW)
        v = r["hvdlite none"]["median_ms"] / r[b]["median_ms"] if b and "hvdlite none" in r else None
        rows.append(["ResNet-50 set allreduce, hvdlite none / best raw MPI schedule (%s)" % b,
                     "<= %.2fx" % TARGETS["resnet50"], ratio(v), met(v, TARGETS["resnet50"])])
    if ok(data, "train_step"):
        mo = c["train_step"]["modes"]
        v = mo["hvdlite"]["ratio_to_nocomm"] if "hvdlite" in mo else None
        rows.append(["train step, hvdlite / no communication", "<= %.2fx" % TARGETS["train_step"],
                     ratio(v), met(v, TARGETS["train_step"])])
        for mode, value in ((IDLE_MODE, "idle"), (NORMAL_MODE, "normal")):
            if mode in mo:
                v = mo[mode]["ratio_to_nocomm"]
                rows.append(["train step, hvdlite with `HVDLITE_ENGINE_PRIORITY=%s` / no communication"
                             % value, "<= %.2fx" % TARGETS["train_step"], ratio(v),
                             met(v, TARGETS["train_step"])])
    if ok(data, "allreduce"):
        s = c["allreduce"]["small"]
        v = s["hvdlite"]["median_ms"] / s["mpi4py loop"]["median_ms"] if "mpi4py loop" in s else None
        rows.append(["100 x 4 KB, hvdlite / mpi4py loop", "<= %.1fx" % TARGETS["small"], ratio(v),
                     met(v, TARGETS["small"])])
    if ok(data, "network"):
        n = network_numbers(c["network"])
        rows.append(["emulated %s: top-k 1%% exchange speed-up over fp32" % c["network"]["rate"],
                     ">= %.0fx" % TARGETS["net_topk"], ratio(n["topk_speedup"]),
                     met(n["topk_speedup"], TARGETS["net_topk"], True)])
        rows.append(["emulated %s: fp16 exchange speed-up over fp32" % c["network"]["rate"],
                     ">= %.1fx" % TARGETS["net_fp16"], ratio(n["fp16_speedup"]),
                     met(n["fp16_speedup"], TARGETS["net_fp16"], True)])
    elif "network" in c:
        rows.append(["emulated network targets", "", "-", "not measured (%s)" % (
            c["network"].get("skipped") or "failed")])
    if not rows:
        return ""
    out = ["## Targets\n", table(["what (%d ranks unless noted)" % data["meta"].get("np", 2), "target",
                                  "measured", ""], rows, ["---", "---:", "---:", "---"])]
    out.append("\nRatios are of medians measured side by side in the same run (see Method); the "
               "absolute times drift with the machine's load, the ratios much less.\n")
    return "\n".join(out)


def method_section(data):
    m = data["meta"]
    P = m.get("profile", {})
    env = m.get("local_env", {})
    out = ["## Method\n"]
    out.append(
        "- **Machine**: %s, %s CPUs (%s), Python %s, torch %s, %s. hvdlite engine `%s`.\n"
        % (m.get("host", "?"), m.get("cpus", "?"), m.get("cpu_model", "?"), m.get("python", "?"),
           m.get("torch", "?"), " ".join(str(m.get("mpi", "?")).split()), m.get("engine_sha256", "?")))
    la = m.get("loadavg_start"), m.get("loadavg_end")
    out.append(
        "- **Load**: the machine was shared with other jobs. Load average (1, 5, 15 min) at the start "
        "%s, at the end %s; each case's load is in its section and in the JSON. Absolute times drift "
        "up to 2x with it, so every comparison below is between contenders measured in the same "
        "interleaved run.\n" % (la[0], la[1]))
    out.append(
        "- **Interleaving**: each case runs all its contenders in one MPI job, once per round, in an "
        "order that rotates every round, so a slow phase of the machine hits every contender alike. "
        "The first round is a warm-up and is not timed.\n"
        "- **Statistic**: a sample is the *slowest rank's* time for one call (one allreduce of the "
        "whole set, one training step), taken with `MPI_Allreduce(MAX)` after a barrier. Tables "
        "show the median with min and max over all samples, and ratios of medians.\n"
        "- **One engine at a time**: hvdlite's engine (and Horovod's) runs a negotiation round every "
        "cycle time even when idle; left running it would share MPI's lock and the cores with the "
        "raw MPI and gloo contenders. So an engine runs only while its own contender is timed: "
        "hvdlite is shut down for the others and restarted when its turn comes, followed by one untimed "
        "call of every contender it serves (this fills the response cache and allocates the fusion "
        "buffers, as in a training job after its first step).\n"
        "- **Threads and MPI**: `OMP_NUM_THREADS=%s` and `torch.set_num_threads(1)` per rank; ranks "
        "start through `hvdrun`; MPI settings for local runs: %s. The emulated network uses "
        "`UCX_TLS=tcp,self` so traffic really crosses the shaped link.\n"
        % (env.get("OMP_NUM_THREADS", "1"), ", ".join("`%s=%s`" % kv for kv in env.items()
                                                      if kv[0] not in ("OMP_NUM_THREADS", "PYTHONUNBUFFERED"))
           or "defaults"))
    out.append(
        "- **Iterations**: ResNet-50 %s timed rounds, small tensors %s, train step %s rounds x %s steps, "
        "kernels %s runs x %s reps; the full profile is in the JSON (`meta.profile`).\n"
        % (P.get("r50_iters"), P.get("small_iters"), P.get("train_rounds"), P.get("train_steps"),
           P.get("kernel_runs"), P.get("kernel_reps")))
    out.append("- **Horovod**: %s.\n" % m.get("horovod", "?"))
    return "".join(out)


def contender_table(results, base_names, extra_ratio=None):
    b = best_of(results, base_names)
    rows = []
    for name, r in results.items():
        row = [name, ms(r["median_ms"]), ms(r["min_ms"]), ms(r["max_ms"]),
               ratio(r["median_ms"] / results[b]["median_ms"]) if b else "-"]
        if extra_ratio:
            e = extra_ratio
            row.append(ratio(r["median_ms"] / results[e]["median_ms"]) if e in results else "-")
        pc = r.get("per_call")
        row.append("%.1f" % pc["collectives"] if pc else "")
        rows.append(row)
    headers = ["contender", "median ms", "min", "max", "x best raw"]
    if extra_ratio:
        headers.append("x " + extra_ratio)
    headers.append("MPI collectives per call")
    return table(headers, rows), b


def allreduce_section(case, img):
    out = ["## 1. ResNet-50 gradient set allreduce\n"]
    f = case_failed(case)
    if f:
        return "\n".join(out + [f])
    meta = case.get("meta", {})
    r = case["resnet50"]
    t, b = contender_table(r, R50_RAW, "torch gloo async" if "torch gloo async" in r else None)
    out.append("%d ranks on one machine, %d tensors, %.0f MB of float32, Sum; each call reduces the "
               "whole set (hvdlite: `allreduce_async` of every tensor, then `synchronize`). Load %s.\n"
               % (meta.get("ranks", 2), meta.get("resnet50_tensors", 161), meta.get("resnet50_mbytes", 102),
                  load_str(case)))
    out.append(t)
    hv = r.get("hvdlite none")
    if hv and b:
        out.append("\nThe best raw MPI schedule in this run was **%s** (%s ms); hvdlite without "
                   "compression took %s of it. \"mpi4py one buffer\" packs all 161 tensors into one "
                   "buffer, reduces it and unpacks (the packing costs two memcpys of 102 MB); \"25 MB "
                   "buckets\" does the same per bucket without overlap. On one machine the wire is "
                   "shared memory, so fp16 and top-k mostly trade memory traffic for kernel work.\n"
                   % (b, ms(r[b]["median_ms"]), ratio(hv["median_ms"] / r[b]["median_ms"])))
    out.append(img("bench_resnet50.png", bars, r, "ResNet-50 set allreduce, %d ranks" % meta.get("ranks", 2)))
    return "\n".join(out)


def small_section(case, img):
    out = ["## 3. Small tensors: 100 x 4 KB per step\n"]
    f = case_failed(case)
    if f:
        return "\n".join(out + [f])
    meta = case.get("meta", {})
    s = case["small"]
    t, b = contender_table(s, ["mpi4py loop", "mpi4py one buffer"], "mpi4py loop")
    out.append("%d ranks, same job as case 1. Load %s. The engine negotiates (the response cache makes it one bit-vector "
               "allreduce per cycle), fuses the 100 tensors and reduces them; the raw loop pays 100 MPI "
               "latencies; \"one buffer\" packs them by hand (the floor for any library).\n"
               % (meta.get("ranks", 2), load_str(case)))
    out.append(t)
    out.append("\n" + img("bench_small.png", bars, s, "100 x 4 KB allreduce, %d ranks" % meta.get("ranks", 2)))
    return "\n".join(out)


def train_section(case, img):
    out = ["## 2. Training step: %s x Linear(%s, %s)\n" % (case.get("layers", 6), case.get("width", 2048),
                                                           case.get("width", 2048))]
    f = case_failed(case)
    if f:
        return "\n".join(out + [f])
    mo = case["modes"]
    out.append("%d x Linear(%d, %d) (%.1f M parameters, %.0f MB of float32 gradients), batch %d per rank, "
               "%d ranks, %d compute thread per rank, SGD; %d rounds x %d steps per mode, interleaved. "
               "\"no communication\" is the same step with a plain optimizer: what perfect overlap "
               "would reach. Load %s.\n"
               % (case["layers"], case["width"], case["width"], case.get("params", 0) / 1e6,
                  case.get("params", 0) * 4 / 1e6, case["batch_per_rank"], case["ranks"],
                  case.get("threads_per_rank", 1), case["rounds"], case["steps_per_round"], load_str(case)))
    cpu = any("other_threads_cpu_ms" in v for v in mo.values())
    rows = [[k, ms(v["median_ms"]), ms(v["min_ms"]), ms(v["max_ms"]), ratio(v["ratio_to_nocomm"])] +
            ([ms(v.get("train_thread_cpu_ms")), ms(v.get("other_threads_cpu_ms"))] if cpu else [])
            for k, v in mo.items()]
    rows += [[k, "absent", "", "", why] + (["", ""] if cpu else []) for k, why in case.get("absent", {}).items()]
    out.append(table(["mode", "median ms", "min", "max", "x no-comm"] +
                     (["training thread CPU ms/step", "other threads CPU ms/step"] if cpu else []), rows))
    out.append(cpu_analysis(case))
    out.append("\n" + img("bench_train_step.png", bars, mo, "train step, %d ranks" % case["ranks"],
                          "ms per step (median; min-max)", list(case.get("absent", {}))))
    return "\n".join(out)


def cpu_analysis(case):
    """What bounds the overlapped step: the CPU the reduction itself needs."""
    mo = case["modes"]
    base, hv = mo.get("no communication"), mo.get("hvdlite")
    if not base or not hv or "other_threads_cpu_ms" not in hv:
        return ""
    cpus = case.get("cpus") or os.cpu_count() or 1
    threads = case["ranks"] * case.get("threads_per_rank", 1)
    gb = case.get("params", 0) * 4 / 1e9
    eng = hv["other_threads_cpu_ms"]
    bound = (hv["train_thread_cpu_ms"] + eng) / base["median_ms"]
    need = (TARGETS["train_step"] - 1) * base["median_ms"]
    text = ("\n**What bounds the step.** CPU times are per rank and step: the training thread's, "
            "and that of the process's other threads (hvdlite's engine, Horovod's background "
            "thread, gloo's workers), which is what communication costs the cores. With %d ranks x %d compute thread on %d cores, the "
            "training threads already take every core, so the engine's work cannot run beside them "
            "for free: the training thread used %s ms with hvdlite against %s ms without "
            "communication (overlap hides the rest), and the engine %s ms to reduce "
            "%.0f MB, %.1f GB/s per rank. Training-thread CPU plus engine CPU, over the "
            "no-communication step, is %.2fx: the floor for this machine, against %.2fx measured. "
            "The %.2fx target leaves %.1f ms per step for the reduction, %.1f GB/s per rank."
            % (case["ranks"], case.get("threads_per_rank", 1), cpus,
               ms(hv["train_thread_cpu_ms"]), ms(base.get("train_thread_cpu_ms")), ms(eng), gb * 1e3,
               gb / (eng / 1e3) if eng else float("nan"), bound, hv["ratio_to_nocomm"],
               TARGETS["train_step"], need, gb / (need / 1e3) if need > 0 else float("nan")))
    if threads < cpus:
        text += " Here cores were left over, so the engine could also run beside the training threads."
    if case.get("allocator") == "keep":
        text += (" Every mode ran with glibc told to keep freed blocks up to 32 MB for reuse "
                 "(`bench/train_step.py --allocator keep`, the default): with glibc's own thresholds "
                 "a step may return its freed 16 MB gradients to the kernel and fault them in again "
                 "in the next backward, ~25k page faults and 20-30 ms of the training thread, in "
                 "some modes of a run and not others (docs/torch.md). The faults column of the "
                 "script's table shows it.")
    normal = mo.get(NORMAL_MODE)
    if normal and "other_threads_cpu_ms" in normal:
        text += ("\n\nThe default engine priority, `auto`, ran the engine at idle priority here (the "
                 "job is on one host and its compute threads fill the cores); forced to `normal` "
                 "the engine took %s ms of CPU per step (training thread %s ms), %.2fx the "
                 "no-communication step. An idle-priority engine runs when a core has nothing else "
                 "to run (after backward, or on the core of a rank that finished first), in long "
                 "stretches, instead of waking in the middle of backward for every negotiation "
                 "round and every chunk a peer publishes (docs/engine.md)."
                 % (ms(normal["other_threads_cpu_ms"]), ms(normal.get("train_thread_cpu_ms")),
                    normal["ratio_to_nocomm"]))
    idle = mo.get(IDLE_MODE)
    if idle and "other_threads_cpu_ms" in idle:
        text += ("\n\nThe same reduction took the engine %s ms of CPU per step with "
                 "`HVDLITE_ENGINE_PRIORITY=idle` (training thread %s ms), %.2fx the no-communication "
                 "step: an idle-priority engine runs when a core has nothing else to run (after "
                 "backward, or on the core of a rank that finished first), in long stretches, instead "
                 "of waking in the middle of backward for every negotiation round and every chunk a "
                 "peer publishes. Use it where the training threads fill every core and nothing else "
                 "runs on the host: an idle-priority thread gets almost no CPU while other programs "
                 "keep the cores busy (docs/engine.md)."
                 % (ms(idle["other_threads_cpu_ms"]), ms(idle.get("train_thread_cpu_ms")),
                    idle["ratio_to_nocomm"]))
    return text + "\n"


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
    for k, label in kernels_mod.HEADLINE:
        if k in rows:
            r = rows[k]
            t.append([label, ms(r["median_ms"]), ms(r["best_ms"]), ms(r["cpu_best_ms"]),
                      ratio(r["ratio_best"]), ratio(r["ratio_cpu"])])
    out.append(table(["kernel", "median ms", "best ms", "CPU ms", "x memcpy (wall)", "x memcpy (CPU)"], t))
    out.append("\n" + img("bench_kernels.png", plot_kernels, case))
    return "\n".join(out)


def network_section(data, img):
    case = data["cases"]["network"]
    out = ["## 5. Emulated network\n"]
    f = case_failed(case)
    if f:
        return "\n".join(out + [f])
    n = network_numbers(case)
    out.append("Two hosts made of network namespaces with their own sshd (`tests/harness/hosts.py`), "
               "one rank each, the link shaped with `tc` to **%s**%s on both ends, `UCX_TLS=tcp,self`. "
               "Started by `hvdrun -H host1:1,host2:1` on host 1. Both ranks still share the same 2 "
               "cores, so compute is not faster than in the local cases. Load %s.\n"
               % (case["rate"], " and %s delay" % case["delay"] if case.get("delay") else "", load_str(case)))
    t, _ = contender_table(case["resnet50"], R50_RAW, "hvdlite none")
    out.append(t)
    out.append("\nExchange speed-up over fp32 (hvdlite none): fp16 **%s** (target >= %.1fx), top-k 1%% "
               "**%s** (target >= %.0fx). The fastest fp32 exchange moved the %.0f MB set at %s MB/s: "
               "the shaped link's rate (1 gbit/s is 125 MB/s before TCP/IP overhead).\n"
               % (ratio(n["fp16_speedup"]), TARGETS["net_fp16"], ratio(n["topk_speedup"]), TARGETS["net_topk"],
                  n["mbytes"], "%.0f" % n["link_MBps"] if n["link_MBps"] else "?"))
    ts = case["train_step"]
    rows = [[k, ms(v["median_ms"]), ms(v["min_ms"]), ms(v["max_ms"]), ratio(v["ratio_to_nocomm"])]
            for k, v in ts["modes"].items()]
    out.append("Training step (%d x Linear(%d), batch %d) across the link:\n"
               % (ts["layers"], ts["width"], ts["batch_per_rank"]))
    out.append(table(["mode", "median ms", "min", "max", "x no-comm"], rows))
    out.append("\n" + network_analysis(data, n))
    out.append(img("bench_network.png", plot_network, case))
    return "\n".join(out)


PHASES = [("NEGOTIATE_ALLREDUCE", "negotiate"), ("QUEUE", "queue"), ("MEMCPY_IN_FUSION_BUFFER", "copy in"),
          ("COMPRESS", "compress"), ("MPI_ALLREDUCE", "MPI allreduce"), ("MPI_ALLGATHER", "MPI allgather"),
          ("DECOMPRESS", "decompress"), ("MEMCPY_OUT_FUSION_BUFFER", "copy out")]
# Results recorded before the timeline took Horovod's phase names.
PHASES_RENAMED = {"NEGOTIATE": "NEGOTIATE_ALLREDUCE"}


def phases_per_call(r):
    return {PHASES_RENAMED.get(k, k): v for k, v in r["phases_ms_per_call"].items()}


def breakdown_table(parts):
    """parts: [(label, breakdown dict)] -> a table of phase wall time per call."""
    used = [(k, h) for k, h in PHASES
            if any(k in phases_per_call(r) for _, bd in parts for r in bd.values())]
    rows = []
    for label, bd in parts:
        for comp, r in bd.items():
            ph = phases_per_call(r)
            rows.append([label + " " + comp, ms(r["call_ms"])] + [ms(ph[k]) if k in ph else "" for k, _ in used])
    return table(["where, compression", "call ms"] + [h for _, h in used], rows)


def network_analysis(data, n):
    """What limits the speed-ups: a two-term model t = fixed work + wire bytes / link rate,
    the engine's timeline breakdown, and the kernels' own cost."""
    if not (n["none"] and n["link_MBps"]):
        return ""
    mb = n["mbytes"]
    bw = n["link_MBps"] / 1e3     # MB per ms
    wire = {"none": mb, "fp16": mb / 2, "topk": mb * 0.01 * 2}   # 2 ranks: top-k sends k (value, index) pairs
    out = ["**What limits the speed-ups.** Model each exchange as fixed work plus wire bytes over the "
           "link rate measured above (%.0f MB/s). Per rank, fp32 sends %.1f MB, fp16 %.1f MB and top-k 1%% "
           "about %.1f MB (k values and k indices, 4 + 4 bytes each, to the other rank):\n"
           % (n["link_MBps"], wire["none"], wire["fp16"], wire["topk"])]
    rows, fixed = [], {}
    for key, label in (("none", "fp32"), ("fp16", "fp16"), ("topk", "top-k 1%")):
        if not n.get(key):
            continue
        on_wire = wire[key] / bw
        fixed[key] = max(0.0, n[key] - on_wire)
        rows.append([label, ms(n[key]), ms(on_wire), ms(fixed[key])])
    out.append(table(["", "measured ms", "wire time at link rate", "the rest (compute, copies, latency)"], rows))
    out.append("")
    lim = []
    if "fp16" in fixed:
        budget = n["none"] / TARGETS["net_fp16"] - wire["fp16"] / bw
        lim.append("**fp16** halves the wire time (%s -> %s ms) and adds conversion work; its "
                   "speed-up of %s is %s the %.1fx target. It can never exceed 2x, since the bytes only "
                   "halve; %.1fx leaves fp16 %s ms for everything but the wire, and it used %s ms "
                   "(fp32: %s ms)."
                   % (ms(wire["none"] / bw), ms(wire["fp16"] / bw), ratio(n["fp16_speedup"]),
                      "above" if n["fp16_speedup"] >= TARGETS["net_fp16"] else "below", TARGETS["net_fp16"],
                      TARGETS["net_fp16"], ms(budget), ms(fixed["fp16"]), ms(fixed.get("none"))))
    if "topk" in fixed:
        need = n["none"] / TARGETS["net_topk"]
        lim.append("**top-k 1%%** puts only %s ms on the wire; the other %s ms are work on the CPU and "
                   "MPI latency, so its speed-up (%s) is set by that work, not by the link: %.0fx needs "
                   "the whole exchange under %s ms."
                   % (ms(wire["topk"] / bw), ms(fixed["topk"]), ratio(n["topk_speedup"]), TARGETS["net_topk"],
                      ms(need)))
        pc = data["cases"]["network"]["resnet50"].get("hvdlite topk 1%", {}).get("per_call", {})
        if pc.get("collectives"):
            lim.append("Compressed buckets follow the fusion threshold too: top-k ran %.0f allgathers per "
                       "call here, each paying the link's latency; a larger threshold means fewer, larger "
                       "allgathers." % pc["collectives"])
    if lim:
        out.append(" ".join(lim) + "\n")
    bd_net = data["cases"]["network"].get("breakdown")
    bd_loc = data["cases"].get("allreduce", {}).get("breakdown") if ok(data, "allreduce") else None
    bd_net = None if (bd_net and "error" in bd_net) else bd_net
    bd_loc = None if (bd_loc and "error" in bd_loc) else bd_loc
    if bd_net:
        parts = ([("local", bd_loc)] if bd_loc else []) + [("link", bd_net)]
        out.append("Where the time goes, from the engine's timeline (`bench/breakdown.py`, separate calls "
                   "recorded after the interleaved ones: wall time per call during which some tensor was "
                   "in each phase, rank 0; phases of different buckets overlap, so a row does not add up "
                   "to its call time):\n")
        out.append(breakdown_table(parts))
        out.append("")
        t = bd_net.get("topk")
        if t:
            ph = phases_per_call(t)
            out.append("Over the link, top-k's call took %s ms in this recording: compression (error feedback + "
                       "selection) %s ms, the allgather %s ms, decompression %s ms.\n"
                       % (ms(t["call_ms"]), ms(ph.get("COMPRESS")), ms(ph.get("MPI_ALLGATHER")),
                          ms(ph.get("DECOMPRESS"))))
    if ok(data, "kernels") and "topk" in fixed:
        k = data["cases"]["kernels"]
        rows_k = k["rows"]
        scale = (mb * 1e6 / 4) / k["floats"]
        try:
            comp = rows_k["top-k 0.01 + error feedback compress, 161 seg"]
            dec = rows_k["top-k 0.01 decompress (zero + scatter)"]
            add = rows_k["top-k 0.01 decompress-add (1 rank's part)"]
        except KeyError:
            comp = dec = add = None
        if comp and dec:
            kern = (comp["best_ms"] + dec["best_ms"] + add["best_ms"]) * scale
            cpu_ratio = comp["median_ms"] / comp["cpu_best_ms"] if comp["cpu_best_ms"] else None
            proj = kern + wire["topk"] / bw
            out.append("The kernels alone (case 4, one thread, best of repetitions) need %s ms for error "
                       "feedback + selection and decompression of this set; with the wire time that is "
                       "%s ms, a %s speed-up: the bound for this top-k on an otherwise idle pair of cores. "
                       "What the measured exchange adds on top is the 2 shared vCPUs (the kernels' median "
                       "wall time was %s their best CPU time in case 4, load %s), the copies into and out "
                       "of the buffers, and MPI's TCP latency and progress while both ranks compute.\n"
                       % (ms(kern), ms(proj), ratio(n["none"] / proj),
                          ratio(cpu_ratio) if cpu_ratio else "?", load_str(k)))
    st = n["steps"]
    if "no communication" in st and "hvdlite" in st:
        parts = ["fp32 %s ms" % ms(st["hvdlite"])]
        for k in st:
            if k.startswith("hvdlite ") and k != "hvdlite":
                parts.append("%s %s ms (speed-up over fp32 %s)" % (k[len("hvdlite "):], ms(st[k]),
                                                                    ratio(st["hvdlite"] / st[k])))
        out.append("**Step-time effect**: no communication %s ms; %s. On a %s link the exchange of 100 MB "
                   "of gradients dominates the step; compression moves the step toward the compute time.\n"
                   % (ms(st["no communication"]), "; ".join(parts), data["cases"]["network"]["rate"]))
    return "\n".join(out)


def scaling_section(sc, neg, img):
    out = ["## 6. Scaling and negotiation overhead\n"]
    if sc and (case_failed(sc)):
        out.append(case_failed(sc))
        sc = None
    if neg and case_failed(neg):
        out.append(case_failed(neg))
        neg = None
    if sc:
        cpus = sc.get("cpus", 2)
        out.append("Every rank count is its own MPI job; the jobs ran %d time(s) each, alternating "
                   "1, 2, 4, ..., and the samples are pooled. **With %d cores, more than %d ranks "
                   "oversubscribe** the machine: ranks then wait for a core, and times measure the "
                   "scheduler as much as the library. Load %s.\n" % (sc.get("rounds", 1), cpus, cpus, load_str(sc)))
        for key, title in (("resnet50", "ResNet-50 set allreduce, median ms (min-max)"),
                           ("train_step", "train step, median ms (min-max)")):
            by = sc[key]
            ranks = sorted(by, key=int)
            names = []
            for r in ranks:
                names += [k for k in by[r] if k not in names]
            rows = []
            for name in names:
                rows.append([name] + ["%s (%s-%s)" % (ms(by[r][name]["median_ms"]), ms(by[r][name]["min_ms"]),
                                                      ms(by[r][name]["max_ms"])) if name in by[r] else "-"
                                      for r in ranks])
            heads = ["%s rank%s%s" % (r, "s" if int(r) > 1 else "", " (oversubscribed)" if int(r) > cpus else "")
                     for r in ranks]
            out.append("%s:\n" % title)
            out.append(table(["contender"] + heads, rows))
            out.append("")
    if neg:
        cpus = neg.get("cpus", 2)
        out.append("**Negotiation overhead.** One step enqueues N tiny (4-byte) tensors with names the "
                   "engine has seen before and waits for them. With the response cache on, a cycle is one "
                   "bit-vector allreduce; with `HVDLITE_CACHE_CAPACITY=0` every cycle sends the names to "
                   "the coordinator and waits for its response list. \"mpi4py 1 allreduce\" is one raw "
                   "allreduce of 4 bytes (the floor of any step); \"rounds\" are the engine's negotiation "
                   "cycles per step. Load %s.\n" % load_str(neg))
        by = neg["by_ranks"]
        ranks = sorted(by, key=int)
        names = []
        for r in ranks:
            names += [k for k in by[r] if k not in names]
        rows = []
        for name in names:
            row = [name]
            for r in ranks:
                v = by[r].get(name)
                if not v:
                    row.append("-")
                    continue
                pc = v.get("per_call")
                row.append("%s%s" % (ms(v["median_ms"]), " (%.1f rounds)" % pc["cycles"] if pc else ""))
            rows.append(row)
        heads = ["%s ranks%s" % (r, " (oversubscribed)" if int(r) > cpus else "") for r in ranks]
        out.append(table(["ms per step (median)"] + heads, rows))
        out.append("")
        per = []
        for r in ranks:
            d = by[r]
            on = [k for k in d if k.endswith("cache on")]
            for k in on:
                off = k.replace("cache on", "cache off")
                if off in d and "mpi4py 1 allreduce" in d:
                    per.append("%s ranks, %s tensors: cache on %s ms over the raw allreduce, off %s ms"
                               % (r, k.split()[1], ms(d[k]["median_ms"] - d["mpi4py 1 allreduce"]["median_ms"]),
                                  ms(d[off]["median_ms"] - d["mpi4py 1 allreduce"]["median_ms"])))
        if per:
            out.append("Overhead per step beyond one raw allreduce: " + "; ".join(per) + ".\n")
    out.append(img("bench_scaling.png", plot_scaling, sc, neg))
    return "\n".join(out)


def sweep_section(case, img):
    out = ["## Fusion threshold and cycle time\n"]
    f = case_failed(case)
    if f:
        return "\n".join(out + [f])
    rows = case["allreduce"]["sweep"]
    out.append("hvdlite (no compression) on cases 1 and 3 for every combination of "
               "`HVDLITE_FUSION_THRESHOLD` and `HVDLITE_CYCLE_TIME`. The engine reads both at `init()`, "
               "so each visit of a setting restarts it (`hvd.shutdown()`, set the variables, "
               "`hvd.init()`), makes one untimed call of each case, then times a few calls; settings are "
               "visited in a rotating order, several rounds. Load %s.\n" % load_str(case))
    for key, title in (("resnet50", "ResNet-50 set, median ms (MPI collectives per call)"),
                       ("small", "100 x 4 KB, median ms")):
        fusions, cycles, grid = sweep_grid(rows, key)
        t = []
        for fu in fusions:
            row = [fmt_bytes(fu)]
            for c in cycles:
                g = grid.get((fu, c))
                if not g:
                    row.append("-")
                    continue
                extra = " (%.0f)" % g["resnet50_collectives_per_call"] if key == "resnet50" else ""
                row.append(ms(g[key]["median_ms"]) + extra)
            t.append(row)
        out.append("%s:\n" % title)
        out.append(table(["fusion \\ cycle"] + ["%g ms" % c for c in cycles], t))
        out.append("")
    b = sweep_best(rows)
    out.append("Best in this run: ResNet-50 set at fusion **%s**, cycle **%g ms** (%s ms); small tensors at "
               "fusion **%s**, cycle **%g ms** (%s ms).\n"
               % (fmt_bytes(b["resnet50"][0]), b["resnet50"][1], ms(b["resnet50"][2]),
                  fmt_bytes(b["small"][0]), b["small"][1], ms(b["small"][2])))
    tr = case.get("train_step")
    if tr and "modes" in tr:
        out.append("The same settings in the training step (%d x Linear(%d), %d ranks):\n"
                   % (tr["layers"], tr["width"], tr["ranks"]))
        out.append(table(["mode", "median ms", "min", "max", "x no-comm"],
                         [[k, ms(v["median_ms"]), ms(v["min_ms"]), ms(v["max_ms"]), ratio(v["ratio_to_nocomm"])]
                          for k, v in tr["modes"].items()]))
        out.append("")
    out.append(img("bench_sweep.png", plot_sweep, case))
    return "\n".join(out)


def advice_section(data):
    c = data["cases"]
    out = ["## What this means for your settings\n"]
    if ok(data, "sweep"):
        rows = c["sweep"]["allreduce"]["sweep"]
        fusions, cycles, grid = sweep_grid(rows, "resnet50")
        # Per fusion threshold: the median over cycle times of the medians (robust to one bad cell).
        per_f = {f: statistics.median([grid[(f, cy)]["resnet50"]["median_ms"] for cy in cycles if (f, cy) in grid])
                 for f in fusions}
        per_f_small = {f: statistics.median([grid[(f, cy)]["small"]["median_ms"] for cy in cycles if (f, cy) in grid])
                       for f in fusions}
        per_c = {cy: statistics.median([grid[(f, cy)]["resnet50"]["median_ms"] for f in fusions if (f, cy) in grid])
                 for cy in cycles}
        per_c_small = {cy: statistics.median([grid[(f, cy)]["small"]["median_ms"] for f in fusions if (f, cy) in grid])
                       for cy in cycles}
        bf = min(per_f, key=per_f.get)
        bc = min(per_c, key=per_c.get)
        out.append("- **Fusion threshold** (`HVDLITE_FUSION_THRESHOLD`, `hvdrun --fusion-threshold-mb`): "
                   "over all cycle times, the ResNet-50 set was fastest with %s (median %s ms; %s) and the "
                   "small tensors with %s (%s). 0 disables fusion: every tensor is its own MPI call.\n"
                   % (fmt_bytes(bf), ms(per_f[bf]),
                      ", ".join("%s %s" % (fmt_bytes(f), ms(v)) for f, v in per_f.items()),
                      fmt_bytes(min(per_f_small, key=per_f_small.get)),
                      ", ".join("%s %s" % (fmt_bytes(f), ms(v)) for f, v in per_f_small.items())))
        out.append("- **Cycle time** (`HVDLITE_CYCLE_TIME`, `--cycle-time-ms`): over all thresholds, "
                   "ResNet-50 %s; small %s (ms). New work starts a round at once, so the cycle time "
                   "mostly sets how often an idle engine negotiates: 0 makes it spin.\n"
                   % (", ".join("%g ms: %s" % (cy, ms(v)) for cy, v in per_c.items()),
                      ", ".join("%g ms: %s" % (cy, ms(v)) for cy, v in per_c_small.items())))
        del bc
        tr = c["sweep"].get("train_step", {}).get("modes", {})
        if tr:
            best = min((k for k in tr if k.startswith("hvdlite")), key=lambda k: tr[k]["median_ms"], default=None)
            if best:
                out.append("- In the training step the best setting was **%s** (%s of no communication).\n"
                           % (best, ratio(tr[best]["ratio_to_nocomm"])))
    if ok(data, "network") and ok(data, "allreduce"):
        n = network_numbers(c["network"])
        loc = c["allreduce"]["resnet50"]
        bullet = ("- **Compression by network speed**: on shared memory (one machine) fp16 took %s and "
                  "top-k 1%% %s of fp32's time; on the %s link fp16 took %s and top-k %s. "
                  % (ratio(loc["hvdlite fp16"]["median_ms"] / loc["hvdlite none"]["median_ms"]),
                     ratio(loc["hvdlite topk 1%"]["median_ms"] / loc["hvdlite none"]["median_ms"]),
                     c["network"]["rate"], ratio(1 / n["fp16_speedup"]) if n["fp16_speedup"] else "-",
                     ratio(1 / n["topk_speedup"]) if n["topk_speedup"] else "-"))
        # Break-even link rate: fixed work f_c + bytes_c / bw = f_none + bytes_none / bw.
        if n["link_MBps"]:
            bw = n["link_MBps"] / 1e3
            mb = n["mbytes"]
            fixed = {k: n[k] - b / bw for k, b in (("none", mb), ("fp16", mb / 2), ("topk", mb * 0.02)) if n.get(k)}
            txt = []
            paid_everywhere = False
            local_name = {"fp16": "hvdlite fp16", "topk": "hvdlite topk 1%"}
            for k, b in (("fp16", mb / 2), ("topk", mb * 0.02)):
                lr = loc[local_name[k]]["median_ms"] / loc["hvdlite none"]["median_ms"]
                if lr <= 1.0:
                    txt.append("%s was no slower than fp32 even on shared memory (%s), so it paid at every "
                               "link speed measured here" % ("fp16" if k == "fp16" else "top-k 1%", ratio(lr)))
                    paid_everywhere = True
                elif k in fixed and "none" in fixed and fixed[k] > fixed["none"]:
                    be = (mb - b) / (fixed[k] - fixed["none"])  # MB per ms
                    txt.append("%s pays on links slower than about %.1f GB/s (%.0f gbit/s)" % (
                        "fp16" if k == "fp16" else "top-k 1%", be, be * 8))
            breakeven = len(txt) > 0 and not all("no slower" in t for t in txt)
            if txt:
                text = "; ".join(txt)
                bullet += ("Here " + text +
                           ("; on faster links send fp32 (break-even rates from this machine's compute "
                            "costs; faster CPUs move them up). " if breakeven else ". "))
            del paid_everywhere
        bullet += ("Top-k changes the optimisation (error feedback sends the rest in later steps): check "
                   "accuracy before relying on it; fp16 is the safe first step on slow links.\n")
        out.append(bullet)
    mo = c["train_step"]["modes"] if ok(data, "train_step") else {}
    if "hvdlite" in mo and (IDLE_MODE in mo or NORMAL_MODE in mo):
        lead = "- **Engine priority** (`HVDLITE_ENGINE_PRIORITY`, `hvdrun --engine-priority`): "
        if IDLE_MODE in mo:  # a run from before auto was the default: "hvdlite" ran normal
            text = ("where the training threads fill every core of a dedicated host (CPU training, "
                    "ranks x threads = cores), `idle` made the training step %s of no communication "
                    "against %s with `normal`, the default when this ran (now `auto` chooses `idle` "
                    "on such a host)." % (ratio(mo[IDLE_MODE]["ratio_to_nocomm"]),
                                          ratio(mo["hvdlite"]["ratio_to_nocomm"])))
        else:
            text = ("the default, `auto`, runs the engine at idle priority where the job is on one "
                    "host whose cores its compute threads fill: the training step took %s of no "
                    "communication, against %s with `normal`." % (
                        ratio(mo["hvdlite"]["ratio_to_nocomm"]), ratio(mo[NORMAL_MODE]["ratio_to_nocomm"])))
        out.append(lead + text + " Use `normal` where other programs share the cores: an "
                   "idle-priority engine then waits for them.\n")
    if ok(data, "scaling"):
        out.append("- **Ranks per machine**: keep ranks <= cores. Oversubscribed ranks (more ranks than "
                   "cores) wait for the scheduler, and every collective then costs scheduler time slices.\n")
    if len(out) == 1:
        return ""
    return "\n".join(out)


def caveats_section(data):
    m = data["meta"]
    out = ["## Caveats\n"]
    la = [c.get("_loadavg", {}) for c in data["cases"].values() if isinstance(c, dict)]
    peaks = [x["end"][0] for x in la if x.get("end")] + [x["start"][0] for x in la if x.get("start")]
    if peaks:
        out.append("- The machine (%s vCPUs) was shared: the 1-minute load average ranged %.1f-%.1f during "
                   "this run. With more runnable threads than cores, every rank spends part of each call "
                   "waiting for a core; compute-heavy paths (compression, copies) and multi-rank latency "
                   "suffer most. Prefer the ratios, and rerun on a quiet machine for absolute numbers.\n"
                   % (m.get("cpus", "?"), min(peaks), max(peaks)))
    if "not installed" in str(m.get("horovod", "")):
        out.append("- Horovod was not installed, so its rows are marked absent. `bench/install_horovod.sh` "
                   "builds Horovod 0.28.1 into the venv (long compile); the suite then measures it in the "
                   "same interleaved runs (its engine runs only while it is timed, like hvdlite's).\n")
    dirty = [p for p in m.get("git_dirty_paths", []) if p.startswith(("csrc/", "hvdlite/"))] \
        if not m.get("source") else []
    if dirty:
        out.append("- The engine measured had uncommitted changes on top of commit `%s` (%s); its build is "
                   "identified by `meta.engine_sha256` in the JSON.\n" % (m.get("git_commit"), ", ".join(dirty)))
    out.append("- One machine cannot show what a real cluster's network does to latency-bound cases (small "
               "tensors, negotiation); the emulated link shapes bandwidth (and optionally delay) only.\n")
    return "\n".join(out)
