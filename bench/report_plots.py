"""The report's plotting helpers (matplotlib, Agg): colours per contender,
horizontal bars with min-max whiskers, grouped bars per host layout. Each
benchmark's own plots live beside its section."""
from .report_format import ms


COLORS = {"hvdlite": "#2a7ab9", "mpi4py": "#7f7f7f", "torch": "#e08a2c", "Horovod": "#c0504d",
          "no communication": "#bbbbbb"}


def color(name):
    for k, c in COLORS.items():
        if name.startswith(k):
            return c
    return "#555555"


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
    with a dashed line at 1."""
    plt = pyplot()
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
