"""The report's plotting helpers (matplotlib, Agg): colours per contender,
a colour and a marker per compressor, horizontal bars with min-max whiskers,
grouped bars per host layout. Each benchmark's own plots live beside its
section."""
import itertools

from .report_format import ms


COLORS = {"hvdlite": "#2a7ab9", "mpi4py": "#7f7f7f", "torch": "#e08a2c", "Horovod": "#c0504d",
          "no communication": "#bbbbbb"}


def color(name):
    for k, c in COLORS.items():
        if name.startswith(k):
            return c
    return "#555555"


# One colour and one marker per compressor, the same in every plot: a series
# reads the same from plot to plot, and the marker still tells it apart where
# colours do not (print, colour vision).
COMPRESSOR_STYLES = {  # compressor: (colour, marker)
    "none": ("#1f77b4", "o"),
    "fp16": ("#ff7f0e", "s"),
    "bf16": ("#d62728", "^"),
    "top-k": ("#2ca02c", "v"),
    "DGC": ("#8c564b", "D"),
    "PowerSGD": ("#9467bd", "P"),
}
# Series that are no compressor take these in turn, MPI's in greys; none
# repeats a compressor's colour or marker, and no two share a colour (the
# later ones reuse a marker in a darker colour: nine series of case 11).
MPI_STYLES = [("#4d4d4d", "X"), ("#8c8c8c", "*"), ("#c4c4c4", "h")]
OTHER_STYLES = [("#17becf", "<"), ("#bcbd22", ">"), ("#e377c2", "p"), ("#e6c700", "H"),
                ("#000000", "d"), ("#637939", "8"), ("#7b4173", "<"), ("#843c39", ">"),
                ("#393b79", "p")]


def compressor(name):
    """The compressor a series stands for ("none", "fp16", "bf16", "top-k",
    "DGC", "PowerSGD"), or None. Names as the benchmarks write them:
    "top-k 0.1% + DGC", "hvdlite topk 1%", "PowerSGD r2", "hvdlite powersgd r4",
    and "none", "hvdlite" or "hvdlite none" for the uncompressed default;
    hvdlite with a setting changed ("hvdlite none RING_ALLREDUCE=0") is none
    of them."""
    low = name.lower()
    if "dgc" in low:  # top-k with momentum correction: a method of its own
        return "DGC"
    for key, family in (("powersgd", "PowerSGD"), ("top-k", "top-k"), ("topk", "top-k"),
                        ("bf16", "bf16"), ("fp16", "fp16")):
        if key in low:
            return family
    return "none" if low in ("none", "hvdlite", "hvdlite none") else None


def series_styles(names):
    """{name: (colour, marker)} for the series of one plot: a compressor's
    own style, the others one each from MPI_STYLES / OTHER_STYLES in order."""
    styles, mpi, other = {}, itertools.cycle(MPI_STYLES), itertools.cycle(OTHER_STYLES)
    for name in names:
        family = compressor(name)
        if family:
            styles[name] = COMPRESSOR_STYLES[family]
        else:
            styles[name] = next(mpi) if name.startswith("mpi4py") else next(other)
    return styles


def bar_and_marker(colour, marker):
    """A legend handle drawn as the bar's colour with the series' marker on it."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    return (Patch(facecolor=colour), Line2D([], [], ls="none", marker=marker, color=colour,
                                             markeredgecolor="#222222", markersize=6))


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def bars(path, results, title, xlabel="ms (median; whiskers: min-max)", absent=()):
    plt = pyplot()
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


def plot_layout_bars(path, by_layout, key, skip, ylabel, title, label=None, highlight=None):
    """Grouped bars: one group per layout, one bar per contender of
    by_layout[layout] (a {name: summary} dict) but `skip`, height summary[key],
    with a dashed line at 1. Each series has its colour and, on top of each
    bar, its marker (series_styles); `highlight` gets a black outline."""
    from matplotlib.legend_handler import HandlerTuple
    plt = pyplot()
    layouts = list(by_layout)
    names = [n for n in dict.fromkeys(n for lay in layouts for n in by_layout[lay]) if n != skip]
    styles = series_styles(names)
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    width = 0.8 / max(1, len(names))
    handles, labels = [], []
    for i, name in enumerate(names):
        colour, marker = styles[name]
        # A layout without this contender leaves its place empty.
        vals = [by_layout[lay].get(name, {}).get(key, float("nan")) for lay in layouts]
        xs = [x + i * width for x in range(len(layouts))]
        outlined = name == highlight
        ax.bar(xs, vals, width, color=colour, edgecolor="#000000" if outlined else colour,
               linewidth=1.2 if outlined else 0)
        ax.plot(xs, vals, ls="none", marker=marker, color=colour, markeredgecolor="#222222",
                markersize=6, zorder=3)
        handles.append(bar_and_marker(colour, marker))
        labels.append(label(name) if label else name)
    ax.axhline(1.0, color="#333333", lw=0.8, ls="--")
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(layouts))])
    ax.set_xticklabels(["%s hosts x ranks" % lay for lay in layouts], fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend
    ax.legend(handles, labels, handler_map={tuple: HandlerTuple(ndivide=None)}, fontsize=6, ncol=2,
              loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
