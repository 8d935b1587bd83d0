"""The report's section for case 12 (bench/run.py's `diloco` case, worker
bench/diloco.py): the byte-level LM trained synchronously, with top-k + DGC,
PowerSGD, DiLoCo and Streaming DiLoCo between emulated hosts, and DiLoCo's
convergence at several H on one host; its plot and progress headline."""
from .report_format import case_failed, table
from .report_plots import pyplot, series_styles

SYNC = "sync"
TARGET = 1.02   # DiLoCo's final validation loss within 2 % of synchronous


def _mb(b):
    return "%.1f" % (b / 1e6) if b is not None else "-"


def _x(v, digits=3):
    return ("%%.%df" % digits) % v if v is not None else "-"


def _time_to(r):
    if r.get("seconds_to_sync_loss") is not None:
        return "%.1f s (step %d)" % (r["seconds_to_sync_loss"], r["steps_to_sync_loss"])
    return "not reached (best %.4f)" % r["best_val_loss"]


def hosts_results(case):
    """{"1gbit 4x1": job result, ...} of the emulated-host jobs that ran."""
    out = {}
    for rate, res in case.get("hosts", {}).items():
        for lay, job in res.get("layouts", {}).items():
            if "runs" in job:
                out["%s %s" % (rate, lay)] = job
    return out


def links_table(job):
    rows = [[r["label"], "%.4f" % r["val_loss"], _x(r.get("val_loss_ratio"), 4), "%.1f" % r["seconds"],
             _x(r.get("seconds_ratio")), _time_to(r), _mb(r["wire_bytes"]), _x(r.get("bytes_ratio"), 4),
             _mb(r["peak_wire_bytes_per_step"])]
            for r in job["runs"].values()]
    return table(["run", "val loss", "x sync", "seconds", "x sync", "time to sync's final loss",
                  "MB on the wire", "x sync", "peak MB per step"], rows)


def convergence_table(job):
    rows = []
    for name, r in job["runs"].items():
        ratio = r.get("val_loss_ratio")
        verdict = "" if name == SYNC or ratio is None else ("within 2 %" if ratio <= TARGET else "over 2 %")
        rows.append([r["label"], "%.4f" % r["val_loss"], _x(ratio, 4), verdict, _mb(r["wire_bytes"]),
                     _x(r.get("bytes_ratio"), 4), "%.1f" % r["seconds"]])
    return table(["run", "val loss", "x sync", "target (<= 1.02)", "MB on the wire", "x sync", "seconds"],
                 rows)


def plot_diloco(path, case):
    """Validation loss against bytes on the wire (log) and against time, one
    line per run, one row per job (one host, then each rate and layout)."""
    plt = pyplot()
    jobs = ([("one host", case["convergence"])] if "runs" in case.get("convergence", {}) else []) + \
        list(hosts_results(case).items())
    fig, axes = plt.subplots(len(jobs), 2, figsize=(9, 3.3 * len(jobs)), squeeze=False)
    for (where, job), (ax_b, ax_t) in zip(jobs, axes):
        # Synchronous in the style of "none" (no compression) in every plot.
        styles = series_styles(["none" if n == SYNC else r["label"] for n, r in job["runs"].items()])
        for r, (colour, marker) in zip(job["runs"].values(), styles.values()):
            curve = r["curve"]
            if not curve:
                continue
            kw = dict(color=colour, marker=marker, markersize=4, lw=1.2, label=r["label"])
            sent = [p for p in curve if p[2] > 0]   # nothing sent yet: no place on a log axis
            ax_b.plot([p[2] for p in sent], [p[3] for p in sent], **kw)
            ax_t.plot([p[1] for p in curve], [p[3] for p in curve], **kw)
        # A first evaluation before any sync (DiLoCo's anchor is still the initial
        # model) would squash the rest: the axis starts at the runs' later points.
        later = [p[3] for r in job["runs"].values() for p in r["curve"][1:]]
        if later:
            for ax in (ax_b, ax_t):
                ax.set_ylim(top=max(later) + 0.05 * (max(later) - min(later) or 1))
        ax_b.set_xscale("log")
        ax_b.set_xlabel("bytes one rank put on the wire (log)", fontsize=8)
        ax_t.set_xlabel("seconds of training (evaluations excluded)", fontsize=8)
        for ax in (ax_b, ax_t):
            ax.set_ylabel("validation loss (nats/byte)", fontsize=8)
            ax.set_title("%s, %d ranks, %d steps" % (where, job["ranks"], job["steps"]), fontsize=9)
            ax.grid(True, which="both", lw=0.3)
        ax_t.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def diloco_section(case, img):
    L = ["## Case 12: DiLoCo against compression (byte-level LM)\n"]
    failed = case_failed(case)
    if failed:
        return "\n".join(L + [failed])
    conv = case.get("convergence", {})
    if "runs" in conv:
        L.append("`examples/pytorch_lm.py` (%s parameters%s; %d x %d bytes per rank and step, AdamW with "
                 "warm-up and cosine decay; DiLoCo's outer optimizer SGD lr 0.7, Nesterov momentum 0.9) "
                 "on the source of Python's standard library, every run to the same %d steps (equal "
                 "samples), validation loss on held-out text. Ratios are to the synchronous run of the "
                 "same job.\n" % (format(conv["params"], ","), ", model `%s`" % conv["model_args"]
                                  if conv.get("model_args") else "", conv["batch_size"], conv["seq_len"],
                                  conv["steps"]))
        L.append("**Convergence on one host** (%d ranks, no link emulation): DiLoCo at several H against "
                 "synchronous; the target is a final validation loss within 2 %% of synchronous's.\n"
                 % conv["ranks"])
        L.append(convergence_table(conv))
        L.append("")
    for where, job in hosts_results(case).items():
        L.append("**Between emulated hosts, %s** (hosts x ranks per host; %d ranks, %d steps). Bytes are "
                 "what one rank put on the wire (`hvdlite.engine_stats()`), the peak is the busiest step's; "
                 "the DGC run steps SGD with momentum (its momentum correction needs it).\n"
                 % (where, job["ranks"], job["steps"]))
        L.append(links_table(job))
        L.append("")
    for rate, res in case.get("hosts", {}).items():
        if "skipped" in res:
            L.append("Emulated hosts at %s: skipped (%s).\n" % (rate, res["skipped"]))
    L.append(img("bench_diloco.png", plot_diloco, case))
    return "\n".join(L) + "\n"


def diloco_headline(res):
    parts = []
    conv = res.get("convergence", {}).get("runs", {})
    for name, r in conv.items():
        if name != SYNC and r.get("val_loss_ratio") is not None:
            parts.append("%s %.3fx sync's loss" % (r["label"], r["val_loss_ratio"]))
    for where, job in hosts_results(res).items():
        for name, r in job["runs"].items():
            if name != SYNC and r.get("seconds_ratio") is not None:
                parts.append("%s %s: %.2fx sync's time" % (where, r["label"], r["seconds_ratio"]))
    return "; ".join(parts)
