"""Reads, merges, summarises and draws hvdlite timeline files (Chrome trace event JSON).

Each rank writes its own file (``HVDLITE_TIMELINE=/tmp/tl-%r.json``) in the
JSON array format: ``[`` and then one event per line, the closing ``]`` only
after a clean stop. Rows and phases are named as in Horovod's timeline (a row
``allreduce.<tensor>``, phases ``NEGOTIATE_ALLREDUCE``, ``ALLREDUCE``, ...),
and event times count from the ``start_time_since_epoch_in_micros`` in the
process metadata. ``merge`` joins the per-rank files into one trace with a
process per rank on a common clock; ``stragglers`` says which rank keeps the
others waiting in negotiation; ``plot`` draws each rank's phases over a few
steps, the rank that entered each negotiation last marked.

    python -m hvdlite.timeline merge -o merged.json /tmp/tl-0.json /tmp/tl-1.json
    python -m hvdlite.timeline merge -o merged.json '/tmp/tl-%r.json' --ranks 4
    python -m hvdlite.timeline merge -o merged.json '/tmp/tl-*.json'
    python -m hvdlite.timeline summarize merged.json
    python -m hvdlite.timeline stragglers merged.json
    python -m hvdlite.timeline plot -o step.png merged.json --steps 5-6

Only the standard library is used (``plot`` imports matplotlib when it
draws), so the tool runs where the trace is looked at, not only where hvdlite
is installed (``python timeline.py ...``).
"""
import argparse
import glob
import json
import os
import re
import sys

__all__ = ["load", "start_time_us", "merge", "summarize", "stragglers", "plot_data", "plot"]

# Phases that mean "this rank is ready and waits for the others":
# NEGOTIATE_ALLREDUCE, NEGOTIATE_ALLGATHER, ... (plain NEGOTIATE in files
# written before the timeline took Horovod's names).
NEGOTIATE_PREFIX = "NEGOTIATE_"
_NEGOTIATE_BEFORE = "NEGOTIATE"
# Process metadata: the wall-clock time (microseconds since the UNIX epoch)
# the file's event times count from.
START_TIME_KEY = "start_time_since_epoch_in_micros"
LAG_COUNTER = "negotiate lateness (ms)"
_META_PROCESS = ("process_name", "process_sort_index", "process_labels")


def _load(path):
    """Returns (events, truncated) for a per-rank or merged trace file.

    A file cut by a kill is an array without its ``]``, maybe ending in half
    an event: every whole event up to the cut is kept.
    """
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        return list(data.get("traceEvents", [])), False
    if isinstance(data, list):
        return data, False
    start = text.find("[")
    if start < 0 or text[:start].strip():
        raise ValueError(f"{path}: not a Chrome trace (expected a JSON array or object)")
    decoder = json.JSONDecoder()
    events, pos, n = [], start + 1, len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "]":
            break
        try:
            event, pos = decoder.raw_decode(text, pos)
        except ValueError:
            break  # the partial last event of a killed writer
        if isinstance(event, dict):
            events.append(event)
    return events, True


def load(path):
    """The list of trace events in ``path``; tolerates a missing final ``]``
    and a trailing partial event (a rank killed while writing)."""
    return _load(path)[0]


def start_time_us(events):
    """When the timeline of ``events`` started, in microseconds since the UNIX
    epoch: an event's ``ts`` counts from it. 0 for files without the key
    (written before it existed: their ``ts`` are epoch microseconds already)."""
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            start = (e.get("args") or {}).get(START_TIME_KEY)
            if isinstance(start, (int, float)):
                return start
    return 0


def _on_epoch_clock(events):
    """``events`` with ``ts`` in microseconds since the epoch, so files of
    different ranks (each counting from its own start) line up."""
    start = start_time_us(events)
    if not start:
        return events
    out = []
    for e in events:
        if isinstance(e.get("ts"), (int, float)):
            e = dict(e, ts=e["ts"] + start)
        out.append(e)
    return out


def _is_negotiate(name):
    return name.startswith(NEGOTIATE_PREFIX) or name == _NEGOTIATE_BEFORE


def _file_rank(events, default):
    counts = {}
    for e in events:
        pid = e.get("pid")
        if isinstance(pid, int):
            counts[pid] = counts.get(pid, 0) + 1
    if not counts:
        return default
    return max(counts, key=lambda p: (counts[p], -p))


def _pid_key(pid):
    # Ranks in numeric order; anything else (a foreign trace's pids) after them.
    return (0, pid, "") if isinstance(pid, int) else (1, 0, str(pid))


def _natural_key(path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def expand_inputs(inputs, ranks=None):
    """Paths from the command line: plain paths, glob patterns, or one
    ``%r`` pattern with ``ranks``."""
    paths = []
    for item in inputs:
        if "%r" in item:
            if ranks is None:
                raise ValueError(f"{item!r} has %r: give the number of ranks with --ranks N")
            paths.extend(item.replace("%r", str(r)) for r in range(ranks))
        elif any(c in item for c in "*?["):
            found = sorted(glob.glob(item), key=_natural_key)
            if not found:
                raise ValueError(f"no file matches {item!r}")
            paths.extend(found)
        else:
            paths.append(item)
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ValueError("missing timeline file(s): " + ", ".join(missing))
    return paths


class _Rank:
    """One process of the trace: its pid (rank), label, events, origin."""

    def __init__(self, pid, label, events, truncated, path):
        self.pid, self.label, self.events = pid, label, events
        self.truncated, self.path = truncated, path


def _per_rank(paths):
    """[_Rank], one per process found; a merged file contributes one per pid
    in it. Two files claiming the same rank (say two runs' rank-0 files) are
    both kept under distinct pids and labelled with their file names. Event
    times are put on the epoch clock."""
    out, used = [], set()
    for i, path in enumerate(paths):
        events, truncated = _load(path)
        pids = {e.get("pid") for e in events if "pid" in e}
        if len(pids) > 1:  # already merged: split it back into its ranks
            groups = {}
            for e in events:
                groups.setdefault(e.get("pid"), []).append(e)
            for pid in sorted(groups, key=_pid_key):
                label = next((str((e.get("args") or {}).get("name")) for e in groups[pid]
                              if e.get("ph") == "M" and e.get("name") == "process_name"),
                             f"rank {pid}")
                out.append(_Rank(pid, label, _on_epoch_clock(groups[pid]), truncated, path))
                used.add(pid)
            continue
        events = _on_epoch_clock(events)
        rank = _file_rank(events, i)
        label = f"rank {rank}"
        if rank in used:
            label = f"rank {rank} ({os.path.basename(path)})"
            rank = max([r for r in used if isinstance(r, int)] + [len(paths) - 1]) + 1
        used.add(rank)
        out.append(_Rank(rank, label, events, truncated, path))
    return out


def _rows(events):
    """tid -> row (tensor) name, from thread_name metadata."""
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e.get("tid")] = (e.get("args") or {}).get("name", str(e.get("tid")))
    return names


def _negotiate_begins(ranked):
    """{tensor: [(ts, rank)]} for the Begin of each NEGOTIATE_<OP> phase."""
    begins = {}
    for r in ranked:
        names = _rows(r.events)
        for e in r.events:
            if e.get("ph") == "B" and _is_negotiate(str(e.get("name", ""))):
                tensor = names.get(e.get("tid"), str(e.get("tid")))
                begins.setdefault(tensor, []).append((e["ts"], r.pid))
    return begins


def _rounds(begins, nranks):
    """Splits one tensor's negotiation begins (all ranks) into rounds: a rank
    cannot negotiate a tensor again before every rank negotiated it once
    (the collective needs them all), so a rank seen twice opens a new round.
    Yields complete rounds as {rank: ts}."""
    current = {}
    for ts, rank in sorted(begins):
        if rank in current:
            if len(current) == nranks:
                yield current
            current = {}
        current[rank] = ts
    if len(current) == nranks:
        yield current


def merge(paths, out_path, lag_counters=True):
    """Joins per-rank timeline files into one Chrome trace written to
    ``out_path`` and returns its ``otherData``. Every input becomes a process
    (pid = rank, named "rank N", sorted by rank); rows per tensor are kept;
    all ranks are put on one clock that starts at the earliest event (its
    wall-clock time is every process's ``start_time_since_epoch_in_micros``
    and ``otherData.epoch_offset_us``). Rows a kill left open are closed at
    the file's last event. With ``lag_counters``, a counter track per rank
    shows how late it entered each negotiation compared with the first rank:
    a straggler's graph stands out."""
    ranked = _per_rank(paths)
    all_ts = [e["ts"] for r in ranked for e in r.events
              if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    t0 = min(all_ts) if all_ts else 0
    out_events, files = [], []
    for r in ranked:
        rank, events, truncated, path = r.pid, r.events, r.truncated, r.path
        out_events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                           "args": {"name": r.label, START_TIME_KEY: t0}})
        out_events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                           "args": {"sort_index": rank if isinstance(rank, int) else 1 << 30}})
        depth, last_ts, count = {}, None, 0
        for e in events:
            if e.get("ph") == "M" and e.get("name") in _META_PROCESS:
                continue
            e = dict(e)
            e["pid"] = rank
            if "ts" in e and isinstance(e["ts"], (int, float)):
                e["ts"] = e["ts"] - t0
                last_ts = e["ts"] if last_ts is None else max(last_ts, e["ts"])
            if e.get("ph") == "B":
                depth[e.get("tid")] = depth.get(e.get("tid"), 0) + 1
            elif e.get("ph") == "E":
                depth[e.get("tid")] = depth.get(e.get("tid"), 0) - 1
            if e.get("ph") != "M":
                count += 1
            out_events.append(e)
        cut_rows = 0
        for tid, d in depth.items():
            for _ in range(max(d, 0)):
                out_events.append({"ph": "E", "pid": rank, "tid": tid, "ts": last_ts or 0,
                                   "args": {"unfinished": True}})
                cut_rows += 1
        if truncated and last_ts is not None:
            out_events.append({"name": "TRACE_CUT", "ph": "i", "s": "p", "pid": rank, "tid": 0,
                               "ts": last_ts,
                               "args": {"note": "this rank's file ends here without its closing "
                                                "bracket: the process was killed or is still "
                                                "running", "open_phases_closed": cut_rows}})
        files.append({"path": path, "rank": rank, "events": count, "truncated": truncated,
                      "open_phases_closed": cut_rows})

    nranks = len(ranked)
    rounds_total = 0
    if lag_counters and nranks > 1:
        for tensor, begins in _negotiate_begins(ranked).items():
            for rnd in _rounds(begins, nranks):
                first = min(rnd.values())
                rounds_total += 1
                for rank, ts in rnd.items():
                    out_events.append({"name": LAG_COUNTER, "ph": "C", "pid": rank, "ts": ts - t0,
                                       "args": {"ms": round((ts - first) / 1000.0, 3)}})

    other = {
        "tool": "hvdlite.timeline merge",
        "clock": "microseconds since epoch_offset_us (system_clock microseconds since the UNIX "
                 "epoch); each rank's file counts from its own start, read from the system clock: "
                 "ranks on one host share it, across hosts it is as good as NTP",
        "epoch_offset_us": t0,
        "ranks": nranks,
        "negotiation_rounds": rounds_total,
        "files": files,
    }
    _write_trace(out_events, other, out_path)
    return other


def _write_trace(events, other, out_path):
    # One event per line: diffable, greppable, and no giant single string.
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write('{"traceEvents": [\n')
        for i, e in enumerate(events):
            if i:
                f.write(",\n")
            f.write(json.dumps(e, separators=(",", ":"), ensure_ascii=False))
        f.write('\n],\n"displayTimeUnit": "ms",\n"otherData": ')
        f.write(json.dumps(other, ensure_ascii=False))
        f.write("}\n")
    os.replace(tmp, out_path)


def summarize(paths):
    """Time per phase, per rank and tensor, from B/E pairs (instant events
    are counted). Returns {rank: {"phases": {phase: {"total_us", "count"}},
    "tensors": {tensor: {phase: total_us}}, "truncated": bool}}. ``paths`` is
    one file (per-rank or merged) or a list of them."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    result = {}
    for r in _per_rank(list(paths)):
        rank, events, truncated = r.pid, r.events, r.truncated
        names = _rows(events)
        stacks, phases, tensors = {}, {}, {}
        for e in events:
            ph, tid = e.get("ph"), e.get("tid")
            if ph == "B":
                stacks.setdefault(tid, []).append((e.get("name", ""), e.get("ts", 0)))
            elif ph == "E" and stacks.get(tid):
                name, ts = stacks[tid].pop()
                dur = e.get("ts", ts) - ts
                p = phases.setdefault(name, {"total_us": 0, "count": 0})
                p["total_us"] += dur
                p["count"] += 1
                t = tensors.setdefault(names.get(tid, str(tid)), {})
                t[name] = t.get(name, 0) + dur
            elif ph in ("i", "I"):
                p = phases.setdefault(e.get("name", ""), {"total_us": 0, "count": 0})
                p["count"] += 1
        result[rank] = {"phases": phases, "tensors": tensors, "truncated": truncated}
    return result


def _straggler_rounds(ranked):
    """{tensor: [(round {rank: ts}, last rank, lag ms)]}: every complete
    negotiation round of every tensor, the rank that entered it last and by
    how much after the first."""
    out = {}
    for tensor, begins in _negotiate_begins(ranked).items():
        rounds = out.setdefault(tensor, [])
        for rnd in _rounds(begins, len(ranked)):
            last = max(rnd, key=lambda r: (rnd[r], str(r)))
            rounds.append((rnd, last, (rnd[last] - min(rnd.values())) / 1000.0))
    return out


def stragglers(paths):
    """Who enters negotiation last. ``paths``: one merged file or the
    per-rank files. Returns {"ranks": {rank: {"last": n, "lag_ms_total": x}},
    "tensors": {tensor: {"rounds", "last_rank", "last_count", "mean_lag_ms",
    "max_lag_ms"}}}, where a round is one negotiation of the tensor by all
    ranks and lag is the last rank's entry minus the first rank's."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    ranked = _per_rank(list(paths))
    nranks = len(ranked)
    ranks = {r.pid: {"last": 0, "lag_ms_total": 0.0} for r in ranked}
    tensors = {}
    if nranks < 2:
        return {"ranks": ranks, "tensors": tensors}
    for tensor, rounds in _straggler_rounds(ranked).items():
        last_by, lags = {}, []
        for _, last, lag in rounds:
            last_by[last] = last_by.get(last, 0) + 1
            lags.append(lag)
            ranks[last]["last"] += 1
            ranks[last]["lag_ms_total"] += lag
        if lags:
            top = max(last_by, key=lambda r: (last_by[r], str(r)))
            tensors[tensor] = {"rounds": len(lags), "last_rank": top, "last_count": last_by[top],
                               "mean_lag_ms": sum(lags) / len(lags), "max_lag_ms": max(lags)}
    return {"ranks": ranks, "tensors": tensors}


# ---- plot: the phases per rank over time, as a picture

# The picture's rows per rank, in this order (plot_row says which phases each
# gathers). The operation's own span (ALLREDUCE, ...) is not drawn: it only
# encloses the phases that are.
PLOT_ROWS = ("negotiate", "queue", "copy", "compress", "communicate")
_ROW_COLORS = {"negotiate": "#d9a441", "queue": "#9c9c9c", "copy": "#6bb36b",
               "compress": "#8064a2", "communicate": "#2a7ab9"}
_WIRE_PREFIXES = ("MPI_", "SHM_", "NCCL_", "GLOO_")


def plot_row(phase):
    """The picture's row for a timeline phase, or None for the phases it does
    not draw (the operation's span, ERROR, markers)."""
    if _is_negotiate(phase):
        return "negotiate"  # ready, waiting for the other ranks
    if phase == "QUEUE":
        return "queue"  # agreed, waiting behind earlier buckets
    if phase.startswith("MEMCPY_"):
        return "copy"
    if phase in ("COMPRESS", "DECOMPRESS"):
        return "compress"
    if phase.startswith(_WIRE_PREFIXES):
        return "communicate"
    return None


def _row_spans(events):
    """{row: [(begin_us, end_us)]} from one rank's B/E pairs; phases a cut
    file left open end at its last event."""
    stacks, spans, last = {}, {}, None
    for e in events:
        ts = e.get("ts")
        if e.get("ph") not in ("B", "E") or not isinstance(ts, (int, float)):
            continue
        last = ts if last is None else max(last, ts)
        stack = stacks.setdefault(e.get("tid"), [])
        if e["ph"] == "B":
            stack.append((str(e.get("name", "")), ts))
        elif stack:
            name, begin = stack.pop()
            spans.setdefault(plot_row(name), []).append((begin, ts))
    for stack in stacks.values():
        for name, begin in stack:
            spans.setdefault(plot_row(name), []).append((begin, last))
    spans.pop(None, None)
    return spans


def _union(spans):
    """Overlapping spans joined: tensors negotiate (and travel, fused) together,
    and a row shows whether the rank was in the phase at all."""
    out = []
    for begin, end in sorted(spans):
        if out and begin <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([begin, end])
    return out


def _step_starts(rounds_by_tensor):
    """When each training step began (us): a step negotiates every gradient
    once, so each round of the tensor negotiated most often (the earliest
    among equals) opens a step, at its first rank's entry."""
    best = None
    for rounds in rounds_by_tensor.values():
        starts = sorted(min(rnd.values()) for rnd, _, _ in rounds)
        if starts and (best is None or (-len(starts), starts[0]) < (-len(best), best[0])):
            best = starts
    return best or []


def _step_range(steps):
    """"3" -> (3, 3), "3-4" -> (3, 4); steps count from 1."""
    first, _, last = str(steps).partition("-")
    try:
        first, last = int(first), int(last or first)
    except ValueError:
        raise ValueError(f"--steps {steps!r}: give N or N-M (steps count from 1)") from None
    if not 1 <= first <= last:
        raise ValueError(f"--steps {steps!r}: give N or N-M with 1 <= N <= M")
    return first, last


def plot_data(paths, start_ms=None, end_ms=None, steps=None, min_lag_ms=0.0):
    """What ``plot`` draws, without drawing it. Times are ms since the trace's
    first event (as in a merged file). The window is ``start_ms``..``end_ms``
    or the training ``steps`` "N" / "N-M" (from 1; see _step_starts); the
    default is the whole trace. Returns {"window_ms": (start, end),
    "ranks": [(rank, label)], "rows": [row names with a bar in the window],
    "bars": {rank: {row: [(start_ms, length_ms)]}} (overlapping phases of one
    row joined, clipped to the window), "stragglers": [{"rank", "tensor",
    "at_ms", "lag_ms"}] (per negotiation round in the window with a lag of at
    least ``min_lag_ms``: the rank that entered last, when, how late),
    "steps": [(number, start_ms)] in the window}."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    ranked = _per_rank(list(paths))
    all_ts = [e["ts"] for r in ranked for e in r.events
              if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    t0 = min(all_ts) if all_ts else 0
    trace_end = (max(all_ts) - t0) / 1000.0 if all_ts else 0.0
    rounds = _straggler_rounds(ranked)
    step_starts = [(s - t0) / 1000.0 for s in _step_starts(rounds)]
    if steps is not None:
        if start_ms is not None or end_ms is not None:
            raise ValueError("give either --steps or --start-ms/--end-ms")
        first, last = _step_range(steps)
        if first > len(step_starts):
            raise ValueError(f"--steps {steps}: the trace has {len(step_starts)} step(s)")
        lo = step_starts[first - 1]
        hi = step_starts[last] if last < len(step_starts) else trace_end
    else:
        lo = 0.0 if start_ms is None else float(start_ms)
        hi = trace_end if end_ms is None else float(end_ms)
    if hi <= lo:
        raise ValueError(f"empty time window: {lo:g} to {hi:g} ms (the trace spans 0 to "
                         f"{trace_end:g} ms)")

    bars = {}
    for r in ranked:
        by_row = bars.setdefault(r.pid, {})
        for row, spans in _row_spans(r.events).items():
            clipped = [(max((b - t0) / 1000.0, lo), min((e - t0) / 1000.0, hi))
                       for b, e in _union(spans)]
            clipped = [(b, e - b) for b, e in clipped if e > b]
            if clipped:
                by_row[row] = clipped
    marks = []
    if len(ranked) > 1:
        for tensor, tensor_rounds in rounds.items():
            for rnd, last, lag in tensor_rounds:
                at = (rnd[last] - t0) / 1000.0
                if lo <= at < hi and lag >= min_lag_ms:
                    marks.append({"rank": last, "tensor": tensor, "at_ms": at, "lag_ms": lag})
    marks.sort(key=lambda m: (m["at_ms"], str(m["rank"])))
    return {"window_ms": (lo, hi), "ranks": [(r.pid, r.label) for r in ranked],
            "rows": [row for row in PLOT_ROWS if any(row in b for b in bars.values())],
            "bars": bars, "stragglers": marks,
            "steps": [(n, s) for n, s in enumerate(step_starts, 1) if lo <= s < hi]}


def _figure(width, height):
    """A matplotlib Figure drawn off screen; imported here so that the other
    commands need only the standard library."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("the timeline plot needs matplotlib: pip install matplotlib") from None
    return Figure(figsize=(width, height))


def plot(paths, out_path, start_ms=None, end_ms=None, steps=None, min_lag_ms=0.0, title=None):
    """Draws the trace into ``out_path`` (PNG, SVG or PDF by its name): per
    rank one row per kind of phase (negotiate, queue, copy, compress,
    communicate: those the window has) over time, a mark where a rank entered
    a negotiation round last, dashed lines where steps begin. Arguments as
    for ``plot_data``; returns its result."""
    data = plot_data(paths, start_ms, end_ms, steps, min_lag_ms)
    rows, ranks = data["rows"] or ["negotiate"], data["ranks"]
    lane = len(rows) + 1  # one empty row between ranks
    fig = _figure(10, 0.3 * lane * len(ranks) + 1.6)
    ax = fig.add_subplot()
    ticks, labels = [], []
    for i, (rank, label) in enumerate(ranks):
        for j, row in enumerate(rows):
            y = -(i * lane + j)
            ax.broken_barh(data["bars"][rank].get(row, []), (y - 0.4, 0.8),
                           facecolors=_ROW_COLORS[row], linewidth=0)
            ticks.append(y)
            labels.append(f"{label}: {row}" if j == 0 else row)
        if i:
            ax.axhline(-(i * lane) + 1, color="#cccccc", lw=0.6)
    lo, hi = data["window_ms"]
    negotiate_y = {rank: -(i * lane + rows.index("negotiate")) for i, (rank, _) in enumerate(ranks)
                   if "negotiate" in rows}
    counts = {}
    for m in data["stragglers"]:
        counts[m["rank"]] = counts.get(m["rank"], 0) + 1
    for rank, n in sorted(counts.items(), key=lambda kv: _pid_key(kv[0])):
        xs = [m["at_ms"] for m in data["stragglers"] if m["rank"] == rank]
        ax.scatter(xs, [negotiate_y.get(rank, 0)] * len(xs), marker="v", s=28, color="#c0392b",
                   edgecolors="white", linewidths=0.5, zorder=3,
                   label=f"rank {rank} entered negotiation last ({n} round{'s' * (n != 1)})")
    for n, start in data["steps"]:
        ax.axvline(start, color="#555555", lw=0.8, ls="--", zorder=0)
        ax.text(start, 1.0, f" step {n}", transform=ax.get_xaxis_transform(), fontsize=7,
                va="bottom", ha="left")
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylim(min(ticks) - 0.7, 0.7)
    ax.set_xlim(lo, hi)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("ms since the trace's first event", fontsize=8)
    ax.set_title(title or f"{len(ranks)} rank(s), {lo:.1f} to {hi:.1f} ms", fontsize=9,
                 pad=14 if data["steps"] else 6)
    bottom = 0.0
    if counts:
        bottom = 0.3 / fig.get_figheight()  # room for the legend under the axes
        fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7,
                   frameon=False)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(out_path, dpi=110)
    return data


def _print_summary(paths, top):
    summary = summarize(paths)
    for rank in sorted(summary, key=_pid_key):
        s = summary[rank]
        cut = " (file cut: killed?)" if s["truncated"] else ""
        print(f"rank {rank}{cut}")
        print(f"  {'phase':<32}{'count':>10}{'total ms':>12}{'mean us':>10}")
        for name, p in sorted(s["phases"].items(), key=lambda kv: -kv[1]["total_us"]):
            mean = p["total_us"] / p["count"] if p["count"] else 0
            print(f"  {name:<32}{p['count']:>10}{p['total_us'] / 1000:>12.3f}{mean:>10.1f}")
        busiest = sorted(s["tensors"].items(), key=lambda kv: -sum(kv[1].values()))[:top]
        if busiest:
            print(f"  top {len(busiest)} tensors by total time (ms):")
            for tensor, by_phase in busiest:
                parts = ", ".join(f"{k} {v / 1000:.3f}" for k, v in
                                  sorted(by_phase.items(), key=lambda kv: -kv[1]))
                print(f"    {tensor}: {parts}")


def _print_stragglers(paths, top):
    s = stragglers(paths)
    if len(s["ranks"]) < 2:
        print("need at least two ranks (a merged file or several per-rank files)")
        return
    if not s["tensors"]:
        print(f"no complete {NEGOTIATE_PREFIX}<OP> rounds found")
        return
    total = sum(r["last"] for r in s["ranks"].values())
    print("rank   last to negotiate     mean lag ms")
    for rank, r in sorted(s["ranks"].items(), key=lambda kv: -kv[1]["last"]):
        mean = r["lag_ms_total"] / r["last"] if r["last"] else 0.0
        print(f"{rank!s:<6} {r['last']:>6} of {total:<6} {100.0 * r['last'] / total:5.1f}%"
              f"  {mean:>10.3f}")
    print()
    print(f"{'tensor':<48} {'last rank':>9} {'of rounds':>10} {'mean lag ms':>12} {'max lag ms':>11}")
    rows = sorted(s["tensors"].items(), key=lambda kv: -kv[1]["mean_lag_ms"])
    for tensor, t in rows[:top]:
        print(f"{tensor[:48]:<48} {t['last_rank']!s:>9} {t['last_count']:>5}/{t['rounds']:<4}"
              f" {t['mean_lag_ms']:>12.3f} {t['max_lag_ms']:>11.3f}")
    if len(rows) > top:
        print(f"... {len(rows) - top} more tensors (--top N)")


def _print_plot(paths, args):
    data = plot(paths, args.output, start_ms=args.start_ms, end_ms=args.end_ms, steps=args.steps,
                min_lag_ms=args.min_lag_ms, title=args.title)
    lo, hi = data["window_ms"]
    counts = {}
    for m in data["stragglers"]:
        counts[m["rank"]] = counts.get(m["rank"], 0) + 1
    last = ", ".join(f"rank {r} {n}" for r, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    print(f"wrote {args.output}: {len(data['ranks'])} rank(s), {lo:.3f} to {hi:.3f} ms, "
          f"rows {', '.join(data['rows']) or 'none'}; last to negotiate: {last or 'no rounds'}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hvdlite.timeline",
                                     description="Merge, inspect and draw hvdlite timelines.")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="join per-rank files into one trace")
    m.add_argument("-o", "--output", required=True, help="merged trace to write")
    m.add_argument("--ranks", type=int, help="number of ranks, for a %%r pattern")
    m.add_argument("--no-lag-counters", action="store_true",
                   help="leave out the per-rank 'negotiate lateness' counter tracks")
    m.add_argument("inputs", nargs="+", help="files, glob patterns, or a %%r pattern")
    for name, help_text in (("summarize", "time per phase and per tensor"),
                            ("stragglers", "which rank enters negotiation last, per tensor")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--ranks", type=int, help="number of ranks, for a %%r pattern")
        p.add_argument("--top", type=int, default=20, help="tensors to list (default 20)")
        p.add_argument("inputs", nargs="+", help="a merged file, or per-rank files / patterns")
    p = sub.add_parser("plot", help="draw each rank's phases over time, stragglers marked "
                                    "(needs matplotlib)")
    p.add_argument("-o", "--output", required=True, help="image to write (.png, .svg or .pdf)")
    p.add_argument("--ranks", type=int, help="number of ranks, for a %%r pattern")
    p.add_argument("--steps", help="only training steps N or N-M (from 1; a step starts at each "
                                   "negotiation of the most often reduced tensor)")
    p.add_argument("--start-ms", type=float, help="window start, ms since the first event")
    p.add_argument("--end-ms", type=float, help="window end, ms since the first event")
    p.add_argument("--min-lag-ms", type=float, default=0.0,
                   help="mark only rounds whose last rank was at least this late (default 0)")
    p.add_argument("--title", help="the picture's title")
    p.add_argument("inputs", nargs="+", help="a merged file, or per-rank files / patterns")
    args = parser.parse_args(argv)
    try:
        paths = expand_inputs(args.inputs, args.ranks)
        if args.command == "merge":
            other = merge(paths, args.output, lag_counters=not args.no_lag_counters)
            cut = [f["path"] for f in other["files"] if f["truncated"]]
            print(f"wrote {args.output}: {other['ranks']} rank(s), "
                  f"{sum(f['events'] for f in other['files'])} events"
                  + (f"; cut by a kill: {', '.join(cut)}" if cut else ""))
        elif args.command == "summarize":
            _print_summary(paths, args.top)
        elif args.command == "plot":
            _print_plot(paths, args)
        else:
            _print_stragglers(paths, args.top)
    except (OSError, ValueError, ImportError) as e:
        print(f"hvdlite.timeline: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
