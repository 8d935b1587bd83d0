"""Per thread name, the CPU that thread_cpu.py's samples show in two windows of each step
(steps 4-12): from the last rank's step start to the last rank's forward end, and from 50 ms
before to 350 ms after that start (the slowest rank's forward and first backward, before
the first allreduce can start); per rank and step, in ms.

    python thread_cpu_read.py DIR        # hvd-R.json(.gz) and/or gloo-R.json(.gz), R = 0..3
"""
import collections
import gzip
import json
import os
import statistics
import sys


def load(folder, mode, rank):
    path = "%s/%s-%d.json" % (folder, mode, rank)
    with (open(path) if os.path.exists(path) else gzip.open(path + ".gz", "rt")) as f:
        return json.load(f)


def cpu_between(samples, t0, t1):
    """Thread name -> CPU seconds between the samples nearest t0 and t1."""
    def at(t):
        return min(samples, key=lambda s: abs(s[0] - t))[1]
    a, b = at(t0), at(t1)
    out = collections.Counter()
    for key, seconds in b.items():
        out[key.split(":", 1)[1]] += seconds - a.get(key, 0.0)
    return out


def main():
    for mode in ("hvd", "gloo"):
        if not any(os.path.exists("%s/%s-0.json%s" % (sys.argv[1], mode, z)) for z in ("", ".gz")):
            continue
        ranks = [load(sys.argv[1], mode, r) for r in range(4)]
        forward, early, lengths, steps = collections.Counter(), collections.Counter(), [], []
        for step in range(4, 13):
            began = max(d["marks"][step][0] for d in ranks)
            forward_end = max(d["marks"][step][1] for d in ranks)
            lengths.append((forward_end - began) * 1e3)
            steps.append((max(d["marks"][step + 1][0] for d in ranks) - began) * 1e3)
            for d in ranks:
                forward.update(cpu_between(d["samples"], began, forward_end))
                early.update(cpu_between(d["samples"], began - 0.05, began + 0.35))
        per = 1e3 / (9 * 4)
        print("%s: forward window %.0f ms (median), step %.0f ms" % (mode, statistics.median(lengths),
                                                                     statistics.median(steps)))
        for name in sorted(early, key=lambda n: -early[n]):
            if early[name] > 0 or forward[name] > 0:
                print("   %-16s forward window %5.1f ms, the 400 ms around the step's start %5.1f ms" % (
                    name, forward[name] * per, early[name] * per))


if __name__ == "__main__":
    main()
