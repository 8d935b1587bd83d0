// Checks of abandoning the engine on this rank alone (engine_stop.cc,
// api/abandon.cc): the abort signal keeps its first reason and ends a wait
// that would never end, handles are unique in the process and fail once,
// and on a one-rank engine (MPI singleton, through the C API): a pending
// handle fails with kShutdown and the reason, later calls fail the same
// way, the flight recorder holds the abandonment, a second call is
// harmless, a new engine starts afterwards, and an engine thread that does
// not stop within the grace is reported stuck (then found stopped later).
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/c_api.h"
#include "api/runtime.h"
#include "engine/engine.h"
#include "engine/handle_table.h"
#include "transport/abort_signal.h"
#include "transport/waiter.h"

#include "check.h"

using namespace hvdlite;
using hvdlite_test::RunTests;
using Clock = std::chrono::steady_clock;

namespace {

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void TestAbortSignalKeepsFirstReason() {
  AbortSignal abort;
  CHECK(!abort.raised(), "raised before Raise");
  abort.Raise(Status::Error(ErrorKind::kShutdown, "first"));
  abort.Raise(Status::Error(ErrorKind::kTimeout, "second"));
  CHECK(abort.raised(), "not raised");
  CHECK(abort.reason().kind() == ErrorKind::kShutdown && abort.reason().message() == "first",
        "reason %d %s", static_cast<int>(abort.reason().kind()), abort.reason().message().c_str());
  const Status in = abort.ErrorIn("MPI_Ibcast");
  CHECK(in.kind() == ErrorKind::kShutdown && in.message() == "MPI_Ibcast abandoned: first", "%s",
        in.message().c_str());
}

void TestWaitEndsOnAbort() {
  AbortSignal abort;
  WaitPolicy policy;  // the engine's default: spin, then yield, for up to a second
  std::thread raiser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    abort.Raise(Status::Error(ErrorKind::kShutdown, "rank 3 lost"));
  });
  const auto start = Clock::now();
  Status s = WaitUntil(policy, &abort, "MPI_Igather(negotiation)", [](Status*) { return false; });
  const double waited = SecondsSince(start);
  raiser.join();
  CHECK(s.kind() == ErrorKind::kShutdown, "kind %d", static_cast<int>(s.kind()));
  CHECK(Contains(s.message(), "MPI_Igather(negotiation)") && Contains(s.message(), "rank 3 lost"), "%s",
        s.message().c_str());
  CHECK(waited < 1.0, "the wait ended %.3f s after it began (the abort came at 0.05 s)", waited);
}

void TestHandlesUniqueAndFailedOnce() {
  HandleTable a, b;
  auto done = std::make_shared<Work>(OpType::kAllreduce, "done");
  auto pending = std::make_shared<Work>(OpType::kAllreduce, "pending");
  const int64_t h1 = a.Add(done), h2 = a.Add(pending), h3 = b.Add(std::make_shared<Work>(OpType::kBroadcast, "x"));
  CHECK(h1 != h2 && h1 != h3 && h2 != h3, "handles %lld %lld %lld", static_cast<long long>(h1),
        static_cast<long long>(h2), static_cast<long long>(h3));
  CHECK(!b.Find(h1) && !a.Find(h3), "a table finds another table's handle");
  done->Finish();
  const int64_t failed = a.FailPending(Status::Error(ErrorKind::kShutdown, "gone"));
  CHECK(failed == 1, "%lld failed", static_cast<long long>(failed));
  CHECK(done->status().ok(), "a finished work was failed: %s", done->status().message().c_str());
  CHECK(pending->IsCompleted() && pending->status().message() == "gone", "pending: %s",
        pending->status().message().c_str());
}

// What hvd_init does after Engine::Start (hvd_init itself is in c_api.cc,
// which the test programs do not link).
bool StartEngine() {
  std::unique_ptr<Engine> engine;
  Status s = Engine::Start(MPI_COMM_WORLD, &engine);
  CHECK(s.ok(), "Engine::Start: %s", s.message().c_str());
  if (!s.ok()) return false;
  api::Runtime& rt = api::runtime();
  std::lock_guard<std::timed_mutex> lock(rt.mutex);
  api::InstallEngine(rt, std::move(engine));
  return true;
}

// A device allreduce: its job waits for an executor that never takes it,
// so its handle stays pending. Returns the handle or the negated ErrorKind.
int64_t SubmitDeviceAllreduce(const std::string& name) {
  static float token = 0;
  const int64_t shape[1] = {4};
  hvd_tensor_request r{};
  r.op = HVD_OP_ALLREDUCE;
  r.name = name.c_str();
  r.dtype = HVD_DTYPE_FLOAT32;
  r.ndim = 1;
  r.shape = shape;
  r.input = &token;
  r.reduce_op = HVD_REDUCE_SUM;
  r.prescale = r.postscale = 1.0;
  r.device = 1;
  return hvd_enqueue(&r);
}

int64_t PendingDeviceAllreduce(const std::string& name) {
  const int64_t handle = SubmitDeviceAllreduce(name);
  CHECK(handle > 0, "hvd_enqueue: %s", api::LastError());
  return handle;
}

std::string HandleError(int64_t handle, int* kind) {
  char text[512] = {0};
  *kind = hvd_handle_error(handle, text, sizeof(text));
  return text;
}

void TestAbandonFailsPendingHandles() {
  if (!StartEngine()) return;
  CHECK(hvd_device_enable("gloo") == 0, "hvd_device_enable: %s", api::LastError());
  const int64_t handle = PendingDeviceAllreduce("grad.0");
  CHECK(hvd_wait(handle, 0.2) == 0, "the device allreduce completed without an executor");

  const auto start = Clock::now();
  CHECK(hvd_abandon("rank 1 lost (unit test)", 2.0) == 0, "hvd_abandon: %s", api::LastError());
  std::printf("abandon took %.1f ms\n", 1e3 * SecondsSince(start));
  CHECK(hvd_poll(handle) == 1, "the pending handle did not complete");
  int kind = 0;
  const std::string error = HandleError(handle, &kind);
  CHECK(kind == HVD_ERROR_SHUTDOWN && Contains(error, "rank 1 lost (unit test)"), "handle: %d %s", kind,
        error.c_str());

  const int64_t refused = SubmitDeviceAllreduce("grad.1");
  CHECK(refused == -HVD_ERROR_SHUTDOWN && Contains(api::LastError(), "rank 1 lost (unit test)") &&
            Contains(api::LastError(), "hvdlite.init("),
        "enqueue after the abandon: %lld %s", static_cast<long long>(refused), api::LastError());
  CHECK(!api::CurrentEngine() && api::LastErrorKind() == HVD_ERROR_SHUTDOWN, "no engine after the abandon: %s",
        api::LastError());

  std::vector<char> json(1 << 20);
  CHECK(hvd_flight_recorder_json(json.data(), static_cast<int64_t>(json.size())) > 0, "%s", api::LastError());
  const std::string record(json.data());
  CHECK(Contains(record, "\"kind\":\"abandoned\",\"detail\":\"rank 1 lost (unit test)\""),
        "no abandoned event in the flight recorder:\n%s", record.c_str());

  const auto again = Clock::now();
  CHECK(hvd_abandon("another reason", 2.0) == 0, "second hvd_abandon: %s", api::LastError());
  CHECK(SecondsSince(again) < 0.5, "the second hvd_abandon took %.3f s", SecondsSince(again));
  CHECK(SubmitDeviceAllreduce("grad.2") < 0 && Contains(api::LastError(), "rank 1 lost (unit test)"),
        "the first reason did not stay: %s", api::LastError());

  // A new engine: the old handle is unknown to it, its own collectives run.
  // (The next test's start replaces it, shutting it down.)
  if (!StartEngine()) return;
  CHECK(hvd_poll(handle) < 0, "the new engine knows the abandoned engine's handle");
  const int64_t shape[1] = {3};
  float in[3] = {1, 2, 3}, out[3] = {0, 0, 0};
  const int64_t h = hvd_enqueue_allreduce("after", HVD_DTYPE_FLOAT32, 1, shape, in, out, HVD_REDUCE_SUM, 1.0, 1.0,
                                          HVD_COMPRESSION_NONE, 0.0, 0, 0, 0);
  CHECK(h > 0 && hvd_wait(h, 10.0) == 1 && HandleError(h, &kind).empty() && kind == 0, "allreduce: %s",
        api::LastError());
  CHECK(out[0] == 1 && out[1] == 2 && out[2] == 3, "allreduce gave %g %g %g", out[0], out[1], out[2]);
}

void TestStuckThreadReported() {
  if (!StartEngine()) return;
  CHECK(hvd_device_enable("gloo") == 0, "hvd_device_enable: %s", api::LastError());
  const int64_t handle = PendingDeviceAllreduce("slow");
  // The engine thread fails the job as it stops and runs this listener:
  // held there, it does not stop within the grace.
  std::atomic<bool> release{false};
  auto work = api::FindWork(handle);
  work->OnCompletion([&release] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  const int rc = hvd_abandon("rank 2 lost (unit test)", 0.2);
  CHECK(rc == -HVD_ERROR_TIMEOUT && Contains(api::LastError(), "stuck") &&
            Contains(api::LastError(), "restarted"),
        "hvd_abandon of a held thread: %d %s", rc, api::LastError());
  int kind = 0;
  const std::string error = HandleError(handle, &kind);
  CHECK(kind == HVD_ERROR_SHUTDOWN && Contains(error, "rank 2 lost (unit test)"), "handle: %d %s", kind,
        error.c_str());
  CHECK(SubmitDeviceAllreduce("refused") < 0 && Contains(api::LastError(), "restart this process"),
        "a call after a stuck abandon: %s", api::LastError());

  release = true;
  CHECK(hvd_abandon("rank 2 lost (unit test)", 5.0) == 0, "hvd_abandon once the thread went on: %s",
        api::LastError());
  api::Runtime& rt = api::runtime();
  std::lock_guard<std::timed_mutex> lock(rt.mutex);
  CHECK(!rt.stuck, "still marked stuck after the thread stopped");
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const int rc = RunTests({{"abort signal keeps the first reason", TestAbortSignalKeepsFirstReason},
                           {"a wait ends on abort", TestWaitEndsOnAbort},
                           {"handles unique, failed once", TestHandlesUniqueAndFailedOnce},
                           {"abandon fails pending handles", TestAbandonFailsPendingHandles},
                           {"a stuck engine thread is reported", TestStuckThreadReported}});
  MPI_Finalize();
  return rc;
}
