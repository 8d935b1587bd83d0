"""The report's section for case 11 (bench/run.py's `ddp` case): a DDP script's
train step on hvdlite's torch.distributed backend beside DDP on gloo, DDP's
reducer alone, FSDP2 on either backend, hvdlite's Horovod API and Horovod
0.28.1, on one host and between emulated hosts, with its plot and progress
headline."""
from .report_format import case_failed, ms, ratio, table
from .report_plots import plot_layout_bars

DDP_HVDLITE = "torch DDP (hvdlite)"
DDP_GLOO = "torch DDP (gloo)"
FSDP_HVDLITE = "torch FSDP2 (hvdlite)"
FSDP_GLOO = "torch FSDP2 (gloo)"
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


def tuned(label, modes):
    """The label of ``label``'s tuned mode (bench/train_step.py's ddp*-tuned) in
    ``modes``, or None."""
    return next((k for k in modes if k.startswith(label + ", bucket view")), None)


def overheads(modes, hvdlite=DDP_HVDLITE, gloo=DDP_GLOO):
    """(``hvdlite``'s overhead over no communication) / (``gloo``'s), or None (DDP
    on either backend by default)."""
    try:
        h = modes[hvdlite]["ratio_to_nocomm"] - 1
        g = modes[gloo]["ratio_to_nocomm"] - 1
    except KeyError:
        return None
    return h / g if g > 0 else None


def _shares(modes):
    """Words on DDP on hvdlite's overhead against gloo's, default and tuned DDP."""
    words = []
    share = overheads(modes)
    if share is not None:
        words.append("DDP on hvdlite's overhead: %.2f of DDP on gloo's" % share)
    th, tg = tuned(DDP_HVDLITE, modes), tuned(DDP_GLOO, modes)
    share = overheads(modes, th, tg) if th and tg else None
    if share is not None:
        words.append("tuned: %.2f" % share)
    share = overheads(modes, FSDP_HVDLITE, FSDP_GLOO)
    if share is not None:
        words.append("FSDP2 on hvdlite's: %.2f of FSDP2 on gloo's" % share)
    return " (%s)" % "; ".join(words) if words else ""


def plot_ddp(path, case):
    plot_layout_bars(path, ddp_layouts(case), "ratio_to_nocomm", NOCOMM,
                     "step / no-communication step (median)",
                     "DDP and FSDP2 train step: hvdlite's backend, gloo, the Horovod API, Horovod",
                     highlight=DDP_HVDLITE)


def ddp_section(case, img):
    L = ["## Case 11: DDP and FSDP2 on hvdlite's torch.distributed backend\n"]
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
             "nothing (what DDP's reducer costs by itself: the floor of any DDP backend), the same "
             "model under FSDP2 (`fully_shard` of every layer and of the model on a group of either "
             "backend), hvdlite's `DistributedOptimizer` and Horovod 0.28.1 (when installed), "
             "interleaved in one job per "
             "layout; the emulated hosts are case 7's (links at %s). On one host the DDP modes "
             "also run tuned: `gradient_as_bucket_view=True` (no copy of the gradients into DDP's "
             "buckets and back) and `bucket_cap_mb=16` (less left to send after backward).\n"
             % ("%d x Linear(%d, %d), batch %d per rank" % (one["layers"], one["width"], one["width"],
                                                            one["batch_per_rank"]) if "layers" in one
                else "6 x Linear(2048, 2048)", case.get("hosts", {}).get("rate", "-")))
    for lay, modes in layouts.items():
        rows = [[k, ms(v["median_ms"]), ms(v["p25_ms"]), ms(v["p75_ms"]), ratio(v["ratio_to_nocomm"])]
                for k, v in modes.items()]
        L.append("**%s** (hosts x ranks per host)%s:\n" % (lay, _shares(modes)))
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
            th = tuned(DDP_HVDLITE, modes)
            parts.append("%s: DDP on hvdlite %s no-comm%s%s" % (
                lay, ratio(modes[DDP_HVDLITE]["ratio_to_nocomm"]),
                "" if share is None else ", %.2f of gloo's overhead" % share,
                "" if th is None else ", tuned %s" % ratio(modes[th]["ratio_to_nocomm"])))
    return "; ".join(parts)
