"""The report's section for case 11 (bench/run.py's `ddp` case): a DDP script's
train step on hvdlite's torch.distributed backend beside DDP on gloo, DDP's
reducer alone, hvdlite's Horovod API and Horovod 0.28.1, on one host and
between emulated hosts, with its plot and progress headline."""
from .report_format import case_failed, ms, ratio, table
from .report_plots import plot_layout_bars

DDP_HVDLITE = "torch DDP (hvdlite)"
DDP_GLOO = "torch DDP (gloo)"
NOCOMM = "no communication"


def ddp_layouts(case):
    """{"one host": modes, "2x2": modes, ...} of the results that ran."""
    out = {}
    if "modes" in case.get("one_host", {}):
        out["1x%d" % case["one_host"]["ranks"]] = case["one_host"]["modes"]
    for lay, res in case.get("hosts", {}).get("layouts", {}).items():
        if "modes" in res:
            out[lay] = res["modes"]
    return out


def overheads(modes):
    """(DDP on hvdlite's overhead over no communication) / (DDP on gloo's), or None."""
    try:
        h = modes[DDP_HVDLITE]["ratio_to_nocomm"] - 1
        g = modes[DDP_GLOO]["ratio_to_nocomm"] - 1
    except KeyError:
        return None
    return h / g if g > 0 else None


def plot_ddp(path, case):
    plot_layout_bars(path, ddp_layouts(case), "ratio_to_nocomm", NOCOMM,
                     "step / no-communication step (median)",
                     "DDP train step: hvdlite's backend, gloo, the Horovod API, Horovod",
                     highlight=DDP_HVDLITE)


def ddp_section(case, img):
    L = ["## Case 11: DDP on hvdlite's torch.distributed backend\n"]
    failed = case_failed(case)
    if failed:
        return "\n".join(L + [failed])
    layouts = ddp_layouts(case)
    if not layouts:
        return "\n".join(L + ["No layout ran.\n"])
    first = next(iter(layouts.values()))
    one = case.get("one_host", {})
    L.append("The train step of case 2 (%s) as a DDP script: `DistributedDataParallel` on a group of "
             "backend `\"hvdlite\"` and on gloo's, DDP with a communication hook that communicates "
             "nothing (what DDP's reducer costs by itself: the floor of any DDP backend), hvdlite's "
             "`DistributedOptimizer` and Horovod 0.28.1 (when installed), interleaved in one job per "
             "layout; the emulated hosts are case 7's (links at %s).\n"
             % ("%d x Linear(%d, %d), batch %d per rank" % (one["layers"], one["width"], one["width"],
                                                            one["batch_per_rank"]) if "layers" in one
                else "6 x Linear(2048, 2048)", case.get("hosts", {}).get("rate", "-")))
    for lay, modes in layouts.items():
        rows = [[k, ms(v["median_ms"]), ms(v["p25_ms"]), ms(v["p75_ms"]), ratio(v["ratio_to_nocomm"])]
                for k, v in modes.items()]
        share = overheads(modes)
        L.append("**%s** (hosts x ranks per host)%s:\n" % (lay, "" if share is None else
                                  " (DDP on hvdlite's overhead: %.2f of DDP on gloo's)" % share))
        L.append(table(["mode", "median ms", "p25", "p75", "x no-comm"], rows))
        L.append("")
    absent = (one.get("absent") or {}) if isinstance(one, dict) else {}
    for label, why in absent.items():
        L.append("%s: %s.\n" % (label, why))
    L.append(img("bench_ddp.png", plot_ddp, case))
    return "\n".join(L) + "\n"


def ddp_headline(res):
    parts = []
    for lay, modes in ddp_layouts(res).items():
        if DDP_HVDLITE in modes:
            share = overheads(modes)
            parts.append("%s: DDP on hvdlite %s no-comm%s" % (
                lay, ratio(modes[DDP_HVDLITE]["ratio_to_nocomm"]),
                "" if share is None else ", %.2f of gloo's overhead" % share))
    return "; ".join(parts)
