"""The report's sections for the cases between emulated hosts (bench/run.py
starts bench/allreduce.py and bench/train_step.py there): case 5 (a shaped
link, with bench/breakdown.py's timeline phases), case 7 (allreduce and
allgather between hosts) and case 9 (the train step between hosts), with
their plots and progress headlines."""
from .allreduce_report import contender_table
from .report_format import (R50_RAW, RESNET50_FLOATS, TARGETS, best_of, case_failed, load_str, ms, ok,
                            ratio, table)
from .report_plots import color, plot_layout_bars, pyplot


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


def plot_network(path, net):
    plt = pyplot()
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


def hosts_numbers(case):
    """{layout: {floor, best_mpich, best_mpich_name, hvdlite (default settings)}} in ms."""
    out = {}
    for lay, res in case.get("layouts", {}).items():
        r = res["resnet50"]
        b = best_of(r, R50_RAW)
        out[lay] = {"floor": r["wire floor"]["median_ms"], "best_mpich": r[b]["median_ms"],
                    "best_mpich_name": b, "hvdlite": r["hvdlite none"]["median_ms"]}
    return out


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
                     "Train step between emulated hosts at %s" % case.get("rate"),
                     label=lambda n: "hvdlite none" if n == "hvdlite" else n, highlight="hvdlite")


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
             "hosts share one machine's 2 cores, so layouts with more ranks also measure CPU "
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
             "bucket); PowerSGD runs over all ranks. All hosts share one machine's 2 cores, so a layout with more ranks "
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


def network_headline(res):
    n = network_numbers(res)
    return "fp32 %s ms, fp16 %s ms (%s faster), topk %s ms (%s faster)" % (
        ms(n["none"]), ms(n["fp16"]), ratio(n["fp16_speedup"]), ms(n["topk"]), ratio(n["topk_speedup"]))


def hosts_headline(res):
    return "; ".join("%s: hvdlite %s of the wire floor, %s of the best MPICH schedule" % (
        lay, ratio(n["hvdlite"] / n["floor"]), ratio(n["hvdlite"] / n["best_mpich"]))
        for lay, n in hosts_numbers(res).items())


def hosts_train_headline(res):
    return "; ".join("%s: %s" % (lay, ", ".join("%s %s" % (k, ratio(v)) for k, v in r.items()))
                     for lay, r in hosts_train_numbers(res).items()) + " (x no-comm)"
