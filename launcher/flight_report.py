"""hvdrun's side of the engine's flight recorder: pick the ranks' dumps out of
their output, and write one report that merges them by time.

A rank's engine dumps its recorder on a failure, on SIGUSR1 and when hvdrun
asks after a rank was killed (docs/reliability.md, "Flight recorder"). Under
hvdrun each line of a dump is a stderr line of the rank that starts with
FLIGHT_MARK: a header (rank, host, both clocks, where the rank was, the ranks
it lost, its last negotiation decisions) and one JSON object per event.
"""

import json
import os
import re
import tempfile
import time

FLIGHT_MARK = "@hvdlite-flight@ "     # csrc/engine/engine_flight.cc writes it
REPORT_NAME = "flight-recorder-report.txt"
DIR_VAR = "HVDLITE_FLIGHT_RECORDER_DIR"

_FLIGHT_LINE = re.compile(rb"^\[(\d+)\]<stderr>: " + re.escape(FLIGHT_MARK.encode()))


def parse_flight_line(line):
    """(rank, dict) of a dump line as the rank wrapper relays it, else None."""
    m = _FLIGHT_LINE.match(line)
    if m is None:
        return None
    try:
        fields = json.loads(line[m.end():].decode("utf-8", "replace"))
    except ValueError:
        return None
    return (int(m.group(1)), fields) if isinstance(fields, dict) else None


class FlightDumps:
    """Every rank's dumps: the latest header, and the events of all its dumps
    (a later dump repeats what an earlier one still held: kept once, by seq)."""

    def __init__(self):
        self.headers = {}       # rank -> latest header
        self.events = {}        # rank -> {seq: event, with "wall_ns" added}
        self.expected = {}      # rank -> event lines still to come of its latest dump

    def add(self, rank, fields):
        if fields.get("flight_recorder") == "header":
            self.headers[rank] = fields
            self.expected[rank] = int(fields.get("events", 0))
            self.events.setdefault(rank, {})
            return
        header = self.headers.get(rank)
        if header is None or "seq" not in fields:
            return
        # The event's steady-clock time as wall time, so hosts merge.
        fields["wall_ns"] = header["wall_ns"] - (header["mono_ns"] - fields.get("t_ns", 0))
        self.events[rank][fields["seq"]] = fields
        self.expected[rank] = max(0, self.expected.get(rank, 0) - 1)

    def complete(self, ranks):
        """Whether each of ``ranks`` has sent a whole dump."""
        return all(r in self.headers and self.expected.get(r) == 0 for r in ranks)

    def __bool__(self):
        return bool(self.headers)

    def summary_lines(self, declared=()):
        """The report's top: the lost ranks, who declared them, and where
        every dumping rank was. ``declared``: (rank, how) that hvdrun saw end."""
        lines = []
        lost = {}   # rank -> [(by whom, why)]
        for rank, how in declared:
            lost.setdefault(rank, []).append(("hvdrun", how))
        for rank in sorted(self.headers):
            for item in self.headers[rank].get("lost", []):
                lost.setdefault(item.get("rank"), []).append(("rank %d" % rank, item.get("why", "")))
        if lost:
            for rank in sorted(lost, key=lambda r: (r is None, r)):
                whys = "; ".join("%s: %s" % (who, why) for who, why in lost[rank])
                lines.append("lost rank %s, declared by %s" % (rank, whys))
        else:
            lines.append("no rank was declared lost")
        for rank in sorted(self.headers):
            h = self.headers[rank]
            where = h.get("in")
            if not where:
                doing = "no collective in flight"
            elif where.get("phase") == "collective":
                doing = "in %s of '%s' on %s" % (where.get("op"), where.get("tensor"), where.get("transport"))
                if where.get("tensors", 1) > 1:
                    doing += " (with %d more tensors)" % (where["tensors"] - 1)
            else:
                doing = "waiting in negotiation for %s of '%s'" % (where.get("op"), where.get("tensor"))
            decisions = ", ".join(h.get("last_decisions", [])) or "none"
            lines.append("rank %d (host %s, dump: %s): %s; last decided: %s"
                         % (rank, h.get("host", "?"), h.get("reason", "?"), doing, decisions))
        return lines

    def write(self, directory, declared=()):
        """Writes the report into ``directory``; returns (path, summary lines)."""
        summary = self.summary_lines(declared)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, REPORT_NAME)
        merged = sorted(((e["wall_ns"], rank, seq, e) for rank, evs in self.events.items()
                         for seq, e in evs.items()), key=lambda x: x[:3])
        with open(path, "w") as f:
            f.write("# hvdrun flight recorder report, %s\n" % time.strftime("%Y-%m-%d %H:%M:%S"))
            for line in summary:
                f.write("# %s\n" % line)
            f.write("# %d events of ranks %s follow, merged by time (one JSON object a line)\n"
                    % (len(merged), ", ".join(str(r) for r in sorted(self.headers))))
            for _, rank, _, e in merged:
                f.write(json.dumps(dict(e, rank=rank), sort_keys=True) + "\n")
        return path, summary

    def write_report(self, opts, declared, log):
        """Writes the report (if any rank dumped) where hvdrun keeps the ranks'
        output, else in the flight recorder's directory, else in a new
        temporary one, and logs where and its summary with ``log``."""
        if not self:
            return
        directory = (opts.output_filename or opts.rank_env.get(DIR_VAR) or os.environ.get(DIR_VAR)
                     or tempfile.mkdtemp(prefix="hvdrun-flight-"))
        try:
            path, summary = self.write(directory, declared)
        except OSError as e:
            log("cannot write the flight recorder report in %s: %s" % (directory, e.strerror))
            return
        log("flight recorder report: %s" % path)
        for line in summary:
            log("flight recorder: %s" % line)
