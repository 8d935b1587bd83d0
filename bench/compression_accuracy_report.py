"""The report's section for bench/compression_accuracy.py: accuracy against
bytes on the wire for every compressor, with its plot and progress headline."""
from .report_format import case_failed, ratio, table
from .report_plots import COMPRESSOR_STYLES, compressor, pyplot, series_styles


def plot_compression_accuracy(path, case):
    """Test accuracy against bytes per rank and step (steady state), log x;
    each compressor in its colour and marker (report_plots.COMPRESSOR_STYLES),
    each run labelled."""
    plt = pyplot()
    runs = case["runs"]
    styles = series_styles(runs)
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for label, r in runs.items():
        x, y = r["wire_bytes_per_step_last_epoch"], r["test_accuracy"]
        colour, marker = styles[label]
        ax.scatter([x], [y], s=40, color=colour, marker=marker, edgecolors="#222222", linewidths=0.5,
                   zorder=3)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
    # One legend entry per compressor present, in the styles' order.
    present = {compressor(label) for label in runs}
    for family, (colour, marker) in COMPRESSOR_STYLES.items():
        if family in present:
            ax.scatter([], [], s=40, color=colour, marker=marker, edgecolors="#222222", linewidths=0.5,
                       label=family)
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


def headline(res):
    return ", ".join("%s %.2f%% (%+.2f)" % (k, acc, d or 0) for k, (acc, d, _) in compression_numbers(res).items())
