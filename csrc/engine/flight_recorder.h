// The engine's flight recorder: a fixed ring of its most recent events
// (tensors submitted, negotiation decisions, collectives started and
// finished, errors, peers lost), so that a rank that failed or hangs can say
// what it was doing. Always on: slots are allocated once, recording copies a
// few fields into the next one under a mutex that only a dump contends, and a
// dump (engine_flight.cc) reads it from any thread, also while the engine
// thread is stuck in a wait.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/common.h"

namespace hvdlite {

enum class FlightEventKind : uint8_t {
  kEnqueued = 0,         // a framework thread submitted a tensor
  kDecided = 1,          // negotiation made it ready (flag: 1 from the response cache)
  kCollectiveStart = 2,  // a bucket of `count` tensors went on a transport (detail: which)
  kCollectiveEnd = 3,    // `count` of its tensors finished (one per fused buffer; flag: 1 failed, detail: the error)
  kError = 4,            // a tensor failed without a collective (detail: why; flag: kFlightPendingAtStop)
  kPeerLost = 5,         // `peer` left, or was found gone (detail: why)
  kStopped = 6,          // the engine stopped (detail: the reason every handle got)
  kDump = 7,             // a dump was asked for (detail: by what)
  kAbandoned = 8,        // hvdlite.abandon() stopped the engine on this rank alone (detail: its reason)
};
const char* FlightEventKindName(FlightEventKind kind);
// kError's flag for a tensor still waiting when the engine stopped.
constexpr uint8_t kFlightPendingAtStop = 2;

// One slot. Strings are cut to fit: a name keeps its end when cut (the part
// that tells tensors apart, "...layer3.weight").
struct FlightEvent {
  uint64_t seq = 0;      // 1, 2, ... in recording order
  int64_t t_ns = 0;      // steady clock
  int64_t bytes = 0;
  int32_t process_set = -1;
  int32_t peer = -1;
  int32_t count = 0;
  FlightEventKind kind = FlightEventKind::kEnqueued;
  int8_t op = -1;        // OpType, -1: none
  int8_t dtype = -1;     // DataType, -1: none
  uint8_t flag = 0;
  char name[72] = {0};
  char detail[112] = {0};
};

// What a call site records; the recorder copies it into a slot.
struct FlightNote {
  explicit FlightNote(FlightEventKind k) : kind(k) {}
  FlightEventKind kind;
  const std::string* name = nullptr;
  const char* detail = nullptr;
  int32_t process_set = -1;
  int32_t peer = -1;
  int32_t count = 0;
  int64_t bytes = 0;
  int op = -1;
  int dtype = -1;
  uint8_t flag = 0;
};

// What a dump says first: where each rank was and whom it lost.
struct FlightSummary {
  std::string in_op, in_tensor, in_phase, in_transport;  // empty: idle
  int in_tensors = 0;                                    // tensors in that bucket or round
  struct Lost {
    int rank;
    std::string why;
  };
  std::vector<Lost> lost;
  std::vector<std::string> last_decisions;  // "name (cache)" / "name (negotiated)", oldest first
};

class FlightRecorder {
 public:
  // `capacity` 0 records nothing.
  explicit FlightRecorder(int64_t capacity);

  bool enabled() const { return !slots_.empty(); }
  void Record(const FlightNote& note);
  // The events still in the ring, oldest first; `*dropped`: older ones overwritten.
  std::vector<FlightEvent> Snapshot(uint64_t* dropped = nullptr) const;

  // One JSON object per event (no newline), as in the dump's lines.
  static std::string EventJson(const FlightEvent& e);
  static FlightSummary Summarize(const std::vector<FlightEvent>& events);

 private:
  mutable std::mutex mutex_;
  std::vector<FlightEvent> slots_;
  uint64_t next_seq_ = 1;
};

// The steady clock in ns, as events record it.
inline int64_t FlightNow() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace hvdlite
