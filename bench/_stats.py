"""Helpers shared by the benchmark workers (run under MPI) and the report.

Kept free of MPI and of hvdlite so that the report can import it anywhere.
"""
import os
import statistics


def summary(samples_ms):
    """median/min/max (and the samples themselves) of a list of times in ms."""
    s = sorted(float(x) for x in samples_ms)
    return {"median_ms": statistics.median(s), "min_ms": s[0], "max_ms": s[-1],
            "n": len(s), "samples_ms": [round(x, 4) for x in s]}


def rotated(items, k):
    """items rotated left by k (the interleaving order of round k)."""
    k %= max(1, len(items))
    return items[k:] + items[:k]


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
