// Checks of csrc/engine/flight_recorder: the ring keeps the last `capacity`
// events in order, a capacity of 0 records nothing, long names keep their
// end, events become valid JSON lines, and the summary finds the collective
// in flight, the tensors still in negotiation and the lost peers. Also the
// cost of one Record (printed; ASan makes it several times the real one).
// No MPI.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/flight_recorder.h"

#include "check.h"

using namespace hvdlite;
using hvdlite_test::RunTests;

namespace {

void Enqueue(FlightRecorder& f, const std::string& name) {
  FlightNote n(FlightEventKind::kEnqueued);
  n.name = &name;
  n.op = static_cast<int>(OpType::kAllreduce);
  n.dtype = static_cast<int>(DataType::kFloat32);
  n.bytes = 4000;
  n.process_set = 0;
  f.Record(n);
}

void Decide(FlightRecorder& f, const std::string& name, bool cached) {
  FlightNote n(FlightEventKind::kDecided);
  n.name = &name;
  n.op = static_cast<int>(OpType::kAllreduce);
  n.process_set = 0;
  n.flag = cached ? 1 : 0;
  f.Record(n);
}

void TestKeepsLastInOrder() {
  FlightRecorder f(8);
  for (int i = 0; i < 100; ++i) Enqueue(f, "t." + std::to_string(i));
  uint64_t dropped = 0;
  const auto events = f.Snapshot(&dropped);
  CHECK(events.size() == 8, "%zu events", events.size());
  CHECK(dropped == 92, "%llu dropped", static_cast<unsigned long long>(dropped));
  for (size_t i = 0; i < events.size(); ++i) {
    const std::string want = "t." + std::to_string(92 + i);
    CHECK(want == events[i].name, "event %zu is %s, not %s", i, events[i].name, want.c_str());
    CHECK(events[i].seq == 93 + i, "seq %llu", static_cast<unsigned long long>(events[i].seq));
    if (i) CHECK(events[i].t_ns >= events[i - 1].t_ns, "time goes back at %zu", i);
  }
}

void TestOffRecordsNothing() {
  FlightRecorder f(0);
  CHECK(!f.enabled(), "a recorder of 0 events is on");
  for (int i = 0; i < 10; ++i) Enqueue(f, "x");
  uint64_t dropped = 7;
  CHECK(f.Snapshot(&dropped).empty() && dropped == 0, "a recorder of 0 events kept some");
}

void TestLongNameKeepsItsEnd() {
  FlightRecorder f(4);
  std::string name(200, 'a');
  name += ".layer3.weight";
  Enqueue(f, name);
  const auto e = f.Snapshot()[0];
  const std::string kept = e.name;
  CHECK(kept.size() < sizeof(e.name), "not cut: %zu", kept.size());
  CHECK(kept.rfind("...", 0) == 0 && kept.find(".layer3.weight") == kept.size() - 14, "%s", kept.c_str());
}

void TestJson() {
  FlightRecorder f(4);
  const std::string name = "we\"ird\nname";
  Enqueue(f, name);
  const std::string line = FlightRecorder::EventJson(f.Snapshot()[0]);
  CHECK(line.find("\"kind\":\"enqueued\"") != std::string::npos, "%s", line.c_str());
  CHECK(line.find("\"name\":\"we\\\"ird\\nname\"") != std::string::npos, "%s", line.c_str());
  CHECK(line.find("\"op\":\"allreduce\"") != std::string::npos, "%s", line.c_str());
  CHECK(line.find("\"dtype\":\"float32\"") != std::string::npos, "%s", line.c_str());
  CHECK(line.find('\n') == std::string::npos, "%s", line.c_str());
}

void TestSummary() {
  FlightRecorder f(64);
  for (const char* n : {"a", "b", "c"}) Enqueue(f, n);
  Decide(f, "a", false);
  Decide(f, "b", true);
  FlightSummary s = FlightRecorder::Summarize(f.Snapshot());
  CHECK(s.in_phase == "negotiation" && s.in_tensor == "c" && s.in_tensors == 1, "%s %s %d", s.in_phase.c_str(),
        s.in_tensor.c_str(), s.in_tensors);
  CHECK(s.last_decisions.size() == 2 && s.last_decisions[0] == "a (negotiated)" && s.last_decisions[1] == "b (cache)",
        "decisions");

  const std::string bucket = "a";
  FlightNote start(FlightEventKind::kCollectiveStart);
  start.name = &bucket;
  start.op = static_cast<int>(OpType::kAllreduce);
  start.count = 2;
  start.detail = "SHM_ALLREDUCE";
  f.Record(start);
  FlightNote lost(FlightEventKind::kPeerLost);
  lost.peer = 2;
  lost.detail = "its process 1 is gone";
  f.Record(lost);
  f.Record(lost);  // found again by a later dump: named once
  s = FlightRecorder::Summarize(f.Snapshot());
  CHECK(s.in_phase == "collective" && s.in_tensor == "a" && s.in_transport == "SHM_ALLREDUCE" && s.in_tensors == 2,
        "%s %s %s", s.in_phase.c_str(), s.in_tensor.c_str(), s.in_transport.c_str());
  CHECK(s.lost.size() == 1 && s.lost[0].rank == 2, "%zu lost", s.lost.size());

  // Two fused buffers of one tensor each: in flight until both ended.
  FlightNote end(FlightEventKind::kCollectiveEnd);
  end.count = 1;
  f.Record(end);
  s = FlightRecorder::Summarize(f.Snapshot());
  CHECK(s.in_phase == "collective", "after one of two buffers: %s", s.in_phase.c_str());
  f.Record(end);
  s = FlightRecorder::Summarize(f.Snapshot());
  CHECK(s.in_phase == "negotiation" && s.in_tensor == "c", "after the end: %s", s.in_phase.c_str());
}

void TestPendingAtStop() {
  // The submission has left the ring; the stop's record still says where the rank waited.
  FlightRecorder f(4);
  const std::string name = "stalled";
  FlightNote pending(FlightEventKind::kError);
  pending.name = &name;
  pending.op = static_cast<int>(OpType::kAllreduce);
  pending.process_set = 0;
  pending.flag = kFlightPendingAtStop;
  f.Record(pending);
  f.Record(FlightNote(FlightEventKind::kStopped));
  const FlightSummary s = FlightRecorder::Summarize(f.Snapshot());
  CHECK(s.in_phase == "negotiation" && s.in_tensor == "stalled" && s.in_op == "allreduce", "%s %s",
        s.in_phase.c_str(), s.in_tensor.c_str());
}

void TestRecordCost() {
  FlightRecorder f(512);
  const std::string name = "model.layer3.weight";
  constexpr int kEvents = 200000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kEvents; ++i) Enqueue(f, name);
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  std::printf("record: %.0f ns per event (this build)\n", ns / kEvents);
  CHECK(f.Snapshot().size() == 512, "ring");
}

}  // namespace

int main() {
  return RunTests({{"keeps_last_in_order", TestKeepsLastInOrder},
                   {"off_records_nothing", TestOffRecordsNothing},
                   {"long_name_keeps_its_end", TestLongNameKeepsItsEnd},
                   {"json", TestJson},
                   {"summary", TestSummary},
                   {"pending_at_stop", TestPendingAtStop},
                   {"record_cost", TestRecordCost}});
}
