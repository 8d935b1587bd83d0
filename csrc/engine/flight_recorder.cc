#include "engine/flight_recorder.h"

#include <algorithm>
#include <cstring>

#include "common/json_text.h"

namespace hvdlite {

namespace {

constexpr size_t kLastDecisions = 5;

// Copies `s` into `dst` (NUL-terminated); a name too long keeps its end,
// which tells "model.layer3.weight" from "model.layer4.weight".
template <size_t N>
void CopyKeepingEnd(char (&dst)[N], const char* s, size_t n) {
  if (n < N) {
    std::memcpy(dst, s, n);
    dst[n] = 0;
    return;
  }
  std::memcpy(dst, "...", 3);
  std::memcpy(dst + 3, s + n - (N - 4), N - 4);
  dst[N - 1] = 0;
}

// A detail keeps its start (an error message says what failed first).
template <size_t N>
void CopyKeepingStart(char (&dst)[N], const char* s) {
  size_t n = std::strlen(s);
  if (n >= N) n = N - 1;
  std::memcpy(dst, s, n);
  dst[n] = 0;
}

void AppendField(std::string* out, const char* key, const char* value) {
  *out += ",\"";
  *out += key;
  *out += "\":";
  AppendQuoted(out, value, std::strlen(value));
}

void AppendField(std::string* out, const char* key, int64_t value) {
  *out += ",\"";
  *out += key;
  *out += "\":";
  AppendInt(out, value);
}

}  // namespace

const char* FlightEventKindName(FlightEventKind kind) {
  switch (kind) {
    case FlightEventKind::kEnqueued: return "enqueued";
    case FlightEventKind::kDecided: return "decided";
    case FlightEventKind::kCollectiveStart: return "collective_start";
    case FlightEventKind::kCollectiveEnd: return "collective_end";
    case FlightEventKind::kError: return "error";
    case FlightEventKind::kPeerLost: return "peer_lost";
    case FlightEventKind::kStopped: return "stopped";
    case FlightEventKind::kDump: return "dump";
    case FlightEventKind::kAbandoned: return "abandoned";
  }
  return "?";
}

FlightRecorder::FlightRecorder(int64_t capacity) : slots_(static_cast<size_t>(std::max<int64_t>(capacity, 0))) {}

void FlightRecorder::Record(const FlightNote& note) {
  if (slots_.empty()) return;
  const int64_t now = FlightNow();
  std::lock_guard<std::mutex> lock(mutex_);
  FlightEvent& e = slots_[(next_seq_ - 1) % slots_.size()];
  e.seq = next_seq_++;
  e.t_ns = now;
  e.kind = note.kind;
  e.bytes = note.bytes;
  e.process_set = note.process_set;
  e.peer = note.peer;
  e.count = note.count;
  e.op = static_cast<int8_t>(note.op);
  e.dtype = static_cast<int8_t>(note.dtype);
  e.flag = note.flag;
  if (note.name) {
    CopyKeepingEnd(e.name, note.name->data(), note.name->size());
  } else {
    e.name[0] = 0;
  }
  if (note.detail) {
    CopyKeepingStart(e.detail, note.detail);
  } else {
    e.detail[0] = 0;
  }
}

std::vector<FlightEvent> FlightRecorder::Snapshot(uint64_t* dropped) const {
  std::vector<FlightEvent> out;
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t recorded = next_seq_ - 1;
  const uint64_t kept = std::min<uint64_t>(recorded, slots_.size());
  if (dropped) *dropped = recorded - kept;
  out.reserve(kept);
  for (uint64_t seq = recorded - kept + 1; seq <= recorded; ++seq) out.push_back(slots_[(seq - 1) % slots_.size()]);
  return out;
}

std::string FlightRecorder::EventJson(const FlightEvent& e) {
  std::string out = "{\"seq\":";
  AppendInt(&out, static_cast<int64_t>(e.seq));
  AppendField(&out, "t_ns", e.t_ns);
  AppendField(&out, "kind", FlightEventKindName(e.kind));
  if (e.name[0]) AppendField(&out, "name", e.name);
  if (e.op >= 0) AppendField(&out, "op", OpTypeName(static_cast<OpType>(e.op)));
  if (e.dtype >= 0) AppendField(&out, "dtype", DataTypeName(static_cast<DataType>(e.dtype)));
  if (e.bytes) AppendField(&out, "bytes", e.bytes);
  if (e.process_set >= 0) AppendField(&out, "process_set", e.process_set);
  if (e.count) AppendField(&out, "count", e.count);
  if (e.peer >= 0) AppendField(&out, "peer", e.peer);
  switch (e.kind) {
    case FlightEventKind::kDecided:
      AppendField(&out, "how", e.flag ? "cache" : "negotiated");
      break;
    case FlightEventKind::kCollectiveEnd:
      out += e.flag ? ",\"ok\":false" : ",\"ok\":true";
      break;
    default:
      break;
  }
  if (e.detail[0]) AppendField(&out, "detail", e.detail);
  out += "}";
  return out;
}

FlightSummary FlightRecorder::Summarize(const std::vector<FlightEvent>& events) {
  FlightSummary s;
  const FlightEvent* open = nullptr;           // a collective started and not finished
  int32_t open_left = 0;                       // its tensors not finished yet (one end per bucket)
  std::vector<const FlightEvent*> waiting;     // submitted, not yet decided
  std::vector<const FlightEvent*> decisions;
  for (const FlightEvent& e : events) {
    switch (e.kind) {
      case FlightEventKind::kEnqueued:
        waiting.push_back(&e);
        break;
      case FlightEventKind::kDecided: {
        auto it = std::find_if(waiting.begin(), waiting.end(), [&](const FlightEvent* w) {
          return w->process_set == e.process_set && std::strcmp(w->name, e.name) == 0;
        });
        if (it != waiting.end()) waiting.erase(it);
        decisions.push_back(&e);
        break;
      }
      case FlightEventKind::kCollectiveStart:
        open = &e;
        open_left = std::max(e.count, 1);
        break;
      case FlightEventKind::kCollectiveEnd:
        open_left -= std::max(e.count, 1);
        if (e.flag || open_left <= 0) open = nullptr;
        break;
      case FlightEventKind::kError: {
        // Still waiting when the engine stopped: where this rank was, even
        // when its submission has left the ring.
        if (e.flag != kFlightPendingAtStop) break;
        const bool seen = std::any_of(waiting.begin(), waiting.end(), [&](const FlightEvent* w) {
          return w->process_set == e.process_set && std::strcmp(w->name, e.name) == 0;
        });
        if (!seen) waiting.push_back(&e);
        break;
      }
      case FlightEventKind::kPeerLost: {
        const bool seen = std::any_of(s.lost.begin(), s.lost.end(),
                                      [&](const FlightSummary::Lost& l) { return l.rank == e.peer && l.why == e.detail; });
        if (!seen) s.lost.push_back({e.peer, e.detail});
        break;
      }
      default:
        break;
    }
  }
  const FlightEvent* in = open ? open : (waiting.empty() ? nullptr : waiting.front());
  if (in) {
    s.in_phase = open ? "collective" : "negotiation";
    s.in_tensor = in->name;
    s.in_op = in->op >= 0 ? OpTypeName(static_cast<OpType>(in->op)) : "";
    s.in_transport = open ? in->detail : "";
    s.in_tensors = open ? in->count : static_cast<int>(waiting.size());
  }
  const size_t first = decisions.size() > kLastDecisions ? decisions.size() - kLastDecisions : 0;
  for (size_t i = first; i < decisions.size(); ++i) {
    s.last_decisions.push_back(std::string(decisions[i]->name) + (decisions[i]->flag ? " (cache)" : " (negotiated)"));
  }
  return s;
}

}  // namespace hvdlite
