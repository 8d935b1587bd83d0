// The engine's side of the flight recorder: what a negotiated round adds to
// it, and its dump, which runs on whatever thread asks (the dump signal's,
// a framework thread through the C API, the engine thread when it stops)
// and touches only what does not change after setup plus the recorder.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "common/json_text.h"
#include "engine/engine.h"

namespace hvdlite {

namespace {

// A line on stderr that starts with this is one line of a dump, for hvdrun
// (launcher/output.py); the rank wrapper prefixes it like any other output.
constexpr const char* kFlightMark = "@hvdlite-flight@ ";

// The ranks a stall error names as missing: the controller words it
// "... but not by ranks [1, 3]" (controller.cc, InspectStalls).
std::vector<int> MissingRanks(const std::string& stall_error) {
  std::vector<int> ranks;
  const std::string key = "but not by ranks [";
  size_t at = stall_error.find(key);
  if (at == std::string::npos) return ranks;
  const char* p = stall_error.c_str() + at + key.size();
  while (*p && *p != ']') {
    char* end = nullptr;
    const long r = std::strtol(p, &end, 10);
    if (end == p) break;
    ranks.push_back(static_cast<int>(r));
    p = end;
    while (*p == ',' || *p == ' ') ++p;
  }
  return ranks;
}

// "R" running, "S" sleeping, ..., "" when the process is gone.
std::string ProcessState(int pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return "";
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (!close || close[1] != ' ' || !close[2]) return "?";
  return std::string(1, close[2]);
}

void WriteAll(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

int64_t WallNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

void Engine::RecordRound(ProcessSet& set, const ResponseList& responses) {
  for (const Response& r : responses.responses) {
    FlightNote n(FlightEventKind::kDecided);
    n.name = &r.request.name;
    n.op = static_cast<int>(r.op());
    n.dtype = static_cast<int>(r.request.dtype);
    n.process_set = set.id();
    n.flag = r.from_cache ? 1 : 0;
    if (r.kind == Response::Kind::kError) n.detail = "refused: the ranks' requests do not match";
    flight_.Record(n);
  }
  const int me = set.rank();
  const int members = static_cast<int>(set.ranks().size());
  for (size_t i = 0; i < responses.shutdown_ranks.size(); ++i) {
    const int r = responses.shutdown_ranks[i];
    if (r == me || r < 0 || r >= members) continue;
    FlightNote n(FlightEventKind::kPeerLost);
    n.peer = set.ranks()[r];
    n.process_set = set.id();
    const std::string why = "left hvdlite: " + responses.shutdown_reasons[i];
    n.detail = why.c_str();
    flight_.Record(n);
  }
  if (!responses.stall_error.empty()) {
    for (int r : MissingRanks(responses.stall_error)) {
      if (r == me || r < 0 || r >= members) continue;
      FlightNote n(FlightEventKind::kPeerLost);
      n.peer = set.ranks()[r];
      n.process_set = set.id();
      n.detail = "the stall inspector gave up waiting for it to submit a tensor";
      flight_.Record(n);
    }
  }
}

std::vector<FlightSummary::Lost> Engine::ProbePeers() {
  std::vector<FlightSummary::Lost> lost;
  const int me = topology_.rank;
  for (int r = 0; r < static_cast<int>(pids_.size()); ++r) {
    // Only a peer on this host can be looked at; a process id elsewhere means nothing here.
    if (r == me || topology_.host_of_rank[r] != topology_.host_of_rank[me] || pids_[r] <= 0) continue;
    const std::string state = ProcessState(pids_[r]);
    std::string why;
    if (state.empty() || state == "Z" || state == "X") {
      why = "its process " + std::to_string(pids_[r]) + " is gone (it died or was killed)";
    } else if (state == "T" || state == "t") {
      why = "its process " + std::to_string(pids_[r]) + " is stopped (SIGSTOP or a debugger)";
    }
    if (!why.empty()) lost.push_back({r, why});
  }
  return lost;
}

std::string Engine::FlightRecorderText(const std::string& reason) {
  // Peers found gone go into the ring too, so that a later dump still names them.
  for (const auto& l : ProbePeers()) {
    FlightNote n(FlightEventKind::kPeerLost);
    n.peer = l.rank;
    n.process_set = 0;
    n.detail = l.why.c_str();
    flight_.Record(n);
  }
  uint64_t dropped = 0;
  const std::vector<FlightEvent> events = flight_.Snapshot(&dropped);
  const FlightSummary s = FlightRecorder::Summarize(events);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);

  std::string out = "{\"flight_recorder\":\"header\",\"rank\":";
  AppendInt(&out, topology_.rank);
  out += ",\"size\":";
  AppendInt(&out, topology_.size);
  out += ",\"host\":" + JsonQuote(host) + ",\"pid\":";
  AppendInt(&out, static_cast<int64_t>(getpid()));
  // Cut so that the line stays one atomic write through the rank wrapper.
  out += ",\"reason\":" + JsonQuote(reason.substr(0, 400)) + ",\"events\":";
  AppendInt(&out, static_cast<int64_t>(events.size()));
  out += ",\"dropped\":";
  AppendInt(&out, static_cast<int64_t>(dropped));
  out += ",\"capacity\":";
  AppendInt(&out, options_.flight_recorder_events);
  // Both clocks now: a reader turns each event's steady t_ns into wall time
  // and can merge the ranks of several hosts.
  out += ",\"mono_ns\":";
  AppendInt(&out, FlightNow());
  out += ",\"wall_ns\":";
  AppendInt(&out, WallNs());
  out += ",\"stopped\":" + JsonQuote(stopped_status().message().substr(0, 400));
  out += ",\"in\":";
  if (s.in_phase.empty()) {
    out += "null";
  } else {
    out += "{\"phase\":" + JsonQuote(s.in_phase) + ",\"op\":" + JsonQuote(s.in_op) +
           ",\"tensor\":" + JsonQuote(s.in_tensor) + ",\"transport\":" + JsonQuote(s.in_transport) +
           ",\"tensors\":";
    AppendInt(&out, s.in_tensors);
    out += "}";
  }
  out += ",\"lost\":[";
  for (size_t i = 0; i < s.lost.size(); ++i) {
    out += i ? ",{\"rank\":" : "{\"rank\":";
    AppendInt(&out, s.lost[i].rank);
    out += ",\"why\":" + JsonQuote(s.lost[i].why) + "}";
  }
  out += "],\"last_decisions\":[";
  for (size_t i = 0; i < s.last_decisions.size(); ++i) out += (i ? "," : "") + JsonQuote(s.last_decisions[i]);
  out += "]}\n";
  for (const FlightEvent& e : events) out += FlightRecorder::EventJson(e) + "\n";
  return out;
}

void Engine::DumpFlightRecorder(const std::string& reason) {
  if (!flight_.enabled()) return;
  FlightNote asked(FlightEventKind::kDump);
  asked.detail = reason.c_str();
  flight_.Record(asked);
  const std::string text = FlightRecorderText(reason);
  const FlightSummary s = FlightRecorder::Summarize(flight_.Snapshot());

  // One line for a person reading the rank's log.
  std::string line = "[hvdlite] flight recorder, rank " + std::to_string(topology_.rank) + " (" + reason + "): ";
  if (s.in_phase.empty()) {
    line += "no collective in flight";
  } else if (s.in_phase == "collective") {
    line += "in " + s.in_op + " of '" + s.in_tensor + "' on " + s.in_transport;
    if (s.in_tensors > 1) line += " (with " + std::to_string(s.in_tensors - 1) + " more tensors)";
  } else {
    line += "waiting in negotiation for " + s.in_op + " of '" + s.in_tensor + "'";
    if (s.in_tensors > 1) line += " (and " + std::to_string(s.in_tensors - 1) + " more tensors)";
  }
  for (const auto& l : s.lost) line += "; lost rank " + std::to_string(l.rank) + ": " + l.why;
  if (!s.last_decisions.empty()) {
    line += "; last decided:";
    for (size_t i = 0; i < s.last_decisions.size(); ++i) line += (i ? ", " : " ") + s.last_decisions[i];
  }
  line += "\n";

  std::string out = line;
  const char* reports = std::getenv("HVDLITE_RANK_REPORTS");
  if (reports && std::string(reports) == "1") {
    // hvdrun reads these and keeps them out of the job's output.
    size_t begin = 0;
    while (begin < text.size()) {
      const size_t end = text.find('\n', begin);
      out += kFlightMark;
      out.append(text, begin, end - begin + 1);
      begin = end + 1;
    }
  }
  WriteAll(2, out);
  if (!options_.flight_recorder_dir.empty()) {
    const std::string path = options_.flight_recorder_dir + "/flight-recorder.rank" +
                             std::to_string(topology_.rank) + ".jsonl";
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      WriteAll(fd, text);
      close(fd);
    } else {
      WriteAll(2, "[hvdlite] flight recorder: cannot write " + path + ": " + std::strerror(errno) + "\n");
    }
  }
}

}  // namespace hvdlite
