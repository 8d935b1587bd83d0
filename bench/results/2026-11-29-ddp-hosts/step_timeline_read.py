"""Where the 4 x 1 train step went, from step_timeline.py's marks and timelines (hvd: the
Horovod API) or its marks alone (gloo: DDP on gloo): per step, the optimizer after the last
allreduce, the time from the step's start until every rank had submitted its first gradient
(the last layer's weight; the slowest rank's forward and first backward), and the
allreduces from then to the last one's end (the link's part).

    python step_timeline_read.py DIR RANKS            # hvd-R.json(.gz) and marks-R.json
    python step_timeline_read.py --gloo DIR RANKS     # marks-R.json of its gloo mode
"""
import gzip
import json
import os
import statistics
import sys


def timeline(path):
    """The first gradient's submissions and agreements, and the last one's ends (wall clock)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        text = f.read().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    start = [e["args"]["start_time_since_epoch_in_micros"] for e in events if e.get("name") == "process_name"][0]
    # rows are "allreduce.<module index>.weight": the highest index is the last layer
    layers = {int(name.split(".")[-2]): name for name in rows.values()
              if name.endswith(".weight") and name.split(".")[-2].isdigit()}
    first, last = layers[max(layers)], layers[min(layers)]
    out = {"submitted": [], "agreed": [], "ended": []}
    for e in events:
        row, t = rows.get(e.get("tid"), ""), (start + e.get("ts", 0)) / 1e6
        if row == first and e.get("name") == "NEGOTIATE_ALLREDUCE":
            out["submitted" if e["ph"] == "B" else "agreed"].append(t)
        if row == last and e.get("name") == "ALLREDUCE" and e["ph"] == "E":
            out["ended"].append(t)
    return out


def hvdlite_steps(folder, ranks):
    """Per step: (began, each rank's forward end, each rank's submission, agreed, ended, optimizer)."""
    def path(r):
        plain = "%s/hvd-%d.json" % (folder, r)
        return plain if os.path.exists(plain) else plain + ".gz"
    lines = [timeline(path(r)) for r in range(ranks)]
    marks = [json.load(open("%s/marks-%d.json" % (folder, r))) for r in range(ranks)]
    for step in range(len(marks[0])):
        def after(key, r):
            return min(t for t in lines[r][key] if t > marks[r][step][1] - 0.01)
        yield (max(m[step][0] for m in marks), [m[step][1] for m in marks],
               [after("submitted", r) for r in range(ranks)],
               max(after("agreed", r) for r in range(ranks)), max(after("ended", r) for r in range(ranks)),
               max(m[step][3] - m[step][2] for m in marks))


def gloo_steps(folder, ranks):
    """The same from the gloo script's bucket records (bucket 0 launched = submitted)."""
    marks = [json.load(open("%s/marks-%d.json" % (folder, r))) for r in range(ranks)]
    for step in range(len(marks[0])):
        launched = [min(b[1] for b in m[step][4] if b[0] == 0) for m in marks]
        yield (max(m[step][0] for m in marks), [m[step][1] for m in marks], launched, max(launched),
               max(max(b[2] for b in m[step][4]) for m in marks), max(m[step][3] - m[step][2] for m in marks))


def main():
    gloo = sys.argv[1] == "--gloo"
    folder, ranks = sys.argv[1 + gloo], int(sys.argv[2 + gloo])
    steps = list((gloo_steps if gloo else hvdlite_steps)(folder, ranks))
    parts = {k: [] for k in ("optimizer", "until every rank submitted", "allreduces", "step")}
    print("| step | optimizer ms | forward done (ranks) | first gradient submitted (ranks) "
          "| until every rank submitted ms | allreduces ms | step ms |")
    print("| ---: | ---: | --- | --- | ---: | ---: | ---: |")
    for i in range(4, len(steps) - 1):   # the first 4 warm up
        began, forward, submitted, agreed, ended, optimizer = steps[i]
        step = steps[i + 1][0] - began
        for key, value in zip(parts, (optimizer, agreed - began, ended - agreed, step)):
            parts[key].append(value * 1e3)
        print("| %d | %.0f | %s | %s | %.0f | %.0f | %.0f |" % (
            i, optimizer * 1e3, " ".join("%.0f" % ((f - began) * 1e3) for f in forward),
            " ".join("%.0f" % ((s - began) * 1e3) for s in submitted), (agreed - began) * 1e3,
            (ended - agreed) * 1e3, step * 1e3))
    print("medians: " + ", ".join("%s %.0f ms" % (k, statistics.median(v)) for k, v in parts.items()))


if __name__ == "__main__":
    main()
