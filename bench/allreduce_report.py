"""The report's sections for bench/allreduce.py: case 1 (the ResNet-50 set),
case 3 (100 small tensors), the fusion x cycle sweep, and the scaling model
with the negotiation runs, with their plots and progress headlines."""
from .report_format import R50_RAW, best_of, case_failed, fmt_bytes, load_str, ms, ratio, table
from .report_plots import bars, pyplot


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


def plot_sweep(path, sw):
    plt = pyplot()
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


def plot_scaling(path, sc, neg):
    plt = pyplot()
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


def allreduce_headline(res):
    r, s = res["resnet50"], res["small"]
    b = best_of(r, R50_RAW)
    parts = ["ResNet-50: hvdlite none %s, fp16 %s, topk %s (best raw %s %s ms)" % (
        ratio(r["hvdlite none"]["median_ms"] / r[b]["median_ms"]),
        ratio(r["hvdlite fp16"]["median_ms"] / r[b]["median_ms"]),
        ratio(r["hvdlite topk 1%"]["median_ms"] / r[b]["median_ms"]), b, ms(r[b]["median_ms"]))]
    parts.append("small: hvdlite %s of mpi4py loop" %
                 ratio(s["hvdlite"]["median_ms"] / s["mpi4py loop"]["median_ms"]))
    return "; ".join(parts)


def sweep_headline(res):
    b = sweep_best(res["allreduce"]["sweep"])
    return "best ResNet-50: fusion %s cycle %s ms; best small: fusion %s cycle %s ms" % (
        fmt_bytes(b["resnet50"][0]), b["resnet50"][1], fmt_bytes(b["small"][0]), b["small"][1])
