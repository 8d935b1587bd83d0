"""The report's section for case 12 (bench/run.py's `diloco` case, worker
bench/diloco.py): the byte-level LM trained synchronously, with top-k + DGC,
PowerSGD, DiLoCo and Streaming DiLoCo between emulated hosts, and DiLoCo's
convergence at several H on one host; its plot and progress headline."""
import math

from .report_format import case_failed, table
from .report_plots import pyplot, series_styles

SYNC = "sync"
TARGET = 1.02   # DiLoCo's final validation loss within 2 % of synchronous
RATE_BITS = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}


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


def speedup(job, r):
    """How many times sooner than synchronous ``r`` reached synchronous's final loss, or None."""
    sync = job["runs"].get(SYNC)
    if not sync or r.get("seconds_to_sync_loss") is None:
        return None
    return sync["seconds"] / r["seconds_to_sync_loss"]


def links_table(job):
    rows = [[r["label"], str(r["steps"]), "%.4f" % r["val_loss"], _x(r.get("val_loss_ratio"), 4),
             "%.1f" % r["seconds"], _time_to(r), _x(speedup(job, r), 2), _mb(r["wire_bytes"]),
             _x(r.get("bytes_ratio"), 4), _mb(r["peak_wire_bytes_per_step"])]
            for r in job["runs"].values()]
    return table(["run", "steps", "val loss", "x sync", "seconds", "time to sync's final loss",
                  "x sooner", "MB on the wire", "x sync", "peak MB per step"], rows)


# ---- the chart: which way to communicate by link speed and model size -------------------

def rate_bits(rate):
    """'100mbit' -> 1e8 (bits per second)."""
    for unit, scale in RATE_BITS.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale
    raise ValueError("unknown rate %r" % rate)


def step_models(case):
    """{run: (a, b, factor, label)} from the emulated-host jobs of two or more rates: a run's
    seconds per step fitted as a + b / rate (least squares over the rates; a the compute and
    per-step costs, b the bits it sends and waits for), and its steps to synchronous's final
    loss as a multiple of synchronous's steps (None: never reached). Needs the same runs at
    every rate."""
    jobs = {}
    for rate, res in case.get("hosts", {}).items():
        for job in res.get("layouts", {}).values():
            if "runs" in job:
                jobs[rate_bits(rate)] = job
    if len(jobs) < 2:
        return None
    rates = sorted(jobs)
    sync_steps = jobs[rates[0]]["runs"][SYNC]["steps"]
    out = {}
    for name, first in jobs[rates[0]]["runs"].items():
        if any(name not in jobs[L]["runs"] for L in rates):
            continue
        xs = [1.0 / L for L in rates]
        ys = [jobs[L]["runs"][name]["seconds"] / jobs[L]["runs"][name]["steps"] for L in rates]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        b = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs))
        a = max(1e-9, my - b * mx)
        reached = [jobs[L]["runs"][name].get("steps_to_sync_loss") for L in rates]
        factor = None if name != SYNC and None in reached else \
            (1.0 if name == SYNC else min(reached) / sync_steps)
        out[name] = (a, b, factor, first["label"])
    return out


def chart_grid(case, rates):
    """(params of each width, {run: [[time to target / sync's at P0 for each rate] per width]}):
    each run's step scaled to a width by the measured compute (a) and by the parameters (b,
    bytes proportional to the model), times its steps to the target."""
    fits = step_models(case)
    job = next(iter(hosts_results(case).values()))
    p0 = job["params"]
    widths = case["compute"]["models"]
    c0 = _compute_at(widths, p0)
    sync_a, sync_b, _, _ = fits[SYNC]
    out = {}
    for name, (a, b, factor, _) in fits.items():
        if factor is None:
            continue
        out[name] = [[factor * (a * w["seconds_per_step"] / c0 + b * w["params"] / p0 / L)
                      / (sync_a * w["seconds_per_step"] / c0 + sync_b * w["params"] / p0 / L)
                      for L in rates] for w in widths]
    return [w["params"] for w in widths], out


def _compute_at(widths, params):
    """One rank's step seconds at ``params``, log-log interpolated between measured widths."""
    pts = sorted((w["params"], w["seconds_per_step"]) for w in widths)
    for (p1, s1), (p2, s2) in zip(pts, pts[1:]):
        if p1 <= params <= p2:
            t = (math.log(params) - math.log(p1)) / (math.log(p2) - math.log(p1))
            return math.exp(math.log(s1) + t * (math.log(s2) - math.log(s1)))
    near = min(pts, key=lambda p: abs(math.log(p[0] / params)))
    return near[1] * params / near[0]


def chart_rates():
    return [10 ** (6.5 + 0.025 * i) for i in range(181)]   # ~3 Mbit/s to ~100 Gbit/s


def plot_chart(path, case):
    """Regions of the (link speed, model size) plane by the run that reaches synchronous's final
    loss soonest, with the measured points marked."""
    plt = pyplot()
    from matplotlib.colors import ListedColormap
    rates = chart_rates()
    params, grid = chart_grid(case, rates)
    fits = step_models(case)
    names = list(grid)
    styles = series_styles(["none" if n == SYNC else fits[n][3] for n in names])
    colours = [c for c, _ in styles.values()]
    best = [[min(range(len(names)), key=lambda k: grid[names[k]][i][j]) for j in range(len(rates))]
            for i in range(len(params))]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    edges_p = _edges(params)
    edges_r = _edges(rates)
    ax.pcolormesh(edges_r, edges_p, best, cmap=ListedColormap(colours), vmin=-0.5,
                  vmax=len(names) - 0.5, shading="flat", alpha=0.55)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for k, n in enumerate(names):
        ax.plot([], [], "s", color=colours[k], alpha=0.7, label=fits[n][3])
    job = next(iter(hosts_results(case).values()))
    for k, (where, j) in enumerate(hosts_results(case).items()):
        win = min((r for r in j["runs"].values() if r.get("seconds_to_sync_loss") is not None),
                  key=lambda r: r["seconds_to_sync_loss"])
        L = rate_bits(where.split()[0])
        ax.plot([L], [j["params"]], "k*", markersize=11)
        # Alternately above and below, so neighbouring rates' labels do not overlap.
        ax.annotate("measured at %s:\n%s" % (_rate_name(L), win["label"]), (L, j["params"]),
                    textcoords="offset points", xytext=(6, 8 if k % 2 == 0 else -22), fontsize=7)
    ax.set_xlabel("link speed (bits/s)", fontsize=8)
    ax.set_ylabel("model parameters", fontsize=8)
    ax.set_title("soonest to synchronous's final loss (%d ranks, compute as in the measured runs)" % job["ranks"],
                 fontsize=9)
    ax.legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _edges(values):
    """Cell edges (geometric midpoints) around log-spaced centres."""
    mids = [math.sqrt(a * b) for a, b in zip(values, values[1:])]
    first = values[0] ** 2 / mids[0] if mids else values[0] / 2
    last = values[-1] ** 2 / mids[-1] if mids else values[-1] * 2
    return [first] + mids + [last]


def chart_table(case):
    """The chart's numbers at the measured widths and a few link speeds: each run's time to
    synchronous's final loss as a multiple of synchronous's (lower is sooner)."""
    fits = step_models(case)
    rates = [1e7, 1e8, 1e9, 1e10]
    params, grid = chart_grid(case, rates)
    rows = []
    for i, p in enumerate(params):
        for j, L in enumerate(rates):
            ranked = sorted(grid, key=lambda n: grid[n][i][j])
            rows.append(["%.1f M" % (p / 1e6), _rate_name(L)] +
                        ["%.2f" % grid[n][i][j] for n in grid] + [fits[ranked[0]][3]])
    return table(["parameters", "link"] + [fits[n][3] for n in grid] + ["soonest"], rows)


def _rate_name(bits):
    return "%g Gbit/s" % (bits / 1e9) if bits >= 1e9 else "%g Mbit/s" % (bits / 1e6)


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
    """Validation loss against bytes on the wire (log) and against steps (one
    host: equal samples) or time (between hosts), one line per run, one row per
    job (one host, then each rate and layout)."""
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
            # One host compares equal samples: loss against steps; between hosts, against time.
            ax_t.plot([p[0 if where == "one host" else 1] for p in curve], [p[3] for p in curve], **kw)
        # Evaluations before the first syncs (DiLoCo's anchor still the initial model)
        # would squash the rest: the axis covers each run's last 80 % of steps.
        later = [p[3] for r in job["runs"].values() for p in r["curve"]
                 if r["curve"] and p[0] > 0.2 * r["curve"][-1][0]]
        if later:
            for ax in (ax_b, ax_t):
                ax.set_ylim(top=max(later) + 0.05 * (max(later) - min(later) or 1))
        ax_b.set_xscale("log")
        ax_b.set_xlabel("bytes one rank put on the wire (log)", fontsize=8)
        ax_t.set_xlabel("steps (every run: the same samples per step)" if where == "one host"
                        else "seconds of training (evaluations excluded)", fontsize=8)
        for ax in (ax_b, ax_t):
            ax.set_ylabel("validation loss (nats/byte)", fontsize=8)
            ax.set_title("%s, %d ranks, %d steps" % (where, job["ranks"], job["steps"]), fontsize=9)
            ax.grid(True, which="both", lw=0.3)
        ax_t.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def outer_optimizer(job):
    """DiLoCo's outer optimizer as the job ran it (results before it was recorded: unnamed)."""
    if "outer_momentum" not in job:
        return "DiLoCo's outer optimizer: hvdlite's default when it ran"
    return "DiLoCo's outer optimizer SGD lr %g, Nesterov momentum %g" % (job["outer_lr"], job["outer_momentum"])


def diloco_section(case, img):
    L = ["## Case 12: DiLoCo against compression (byte-level LM)\n"]
    failed = case_failed(case)
    if failed:
        return "\n".join(L + [failed])
    conv = case.get("convergence", {})
    if "runs" in conv:
        L.append("`examples/pytorch_lm.py` (%s parameters%s; %d x %d bytes per rank and step, AdamW with "
                 "warm-up and cosine decay; %s) on the source of Python's standard library, every run to "
                 "the same %d steps (equal samples), validation loss on held-out text. Ratios are to the "
                 "synchronous run of the same job.\n" % (
                     format(conv["params"], ","), ", model `%s`" % conv["model_args"] if conv.get("model_args")
                     else "", conv["batch_size"], conv["seq_len"], outer_optimizer(conv), conv["steps"]))
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
    if "compute" in case:
        L.append("\n**One rank's step without communication** (the chart's compute side):\n")
        L.append(table(["d_model", "parameters", "ms per step"],
                       [[str(w["d_model"]), format(w["params"], ","), "%.1f" % (1e3 * w["seconds_per_step"])]
                        for w in case["compute"]["models"]]))
        L.append("")
    if "compute" in case and step_models(case):
        L.append("**Which way to communicate, by link speed and model size.** Each run's seconds per "
                 "step fitted over the measured rates as a + b / rate (a: compute and per-step costs, "
                 "b: bits sent and waited for), scaled to each width by the measured compute (a) and "
                 "by its parameters (b), times its steps to synchronous's final loss (the xK runs; "
                 "runs that never reached it are left out). Times to the target as a multiple of "
                 "synchronous's (lower is sooner):\n")
        L.append(chart_table(case))
        L.append("")
        L.append(img("bench_diloco_chart.png", plot_chart, case))
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
