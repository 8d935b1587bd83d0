// How the engine stops: Stop (the engine thread fails what is pending and
// records why), Shutdown (negotiated with every rank: their engines stop
// too) and Abandon (this rank alone, without a word to any other: the
// recovery from a lost peer, where the survivors start a new engine on a
// communicator of their own while the lost rank's is never heard again).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "engine/engine.h"
#include "tuning/engine_priority.h"

namespace hvdlite {

namespace {

// How long Shutdown() lets the engine finish its last round before it stops
// waiting on peers (one of them may be gone).
constexpr double kShutdownGraceSeconds = 30.0;
// Pending tensors a stop records in the flight recorder (each takes a slot).
constexpr size_t kPendingRecorded = 16;
// The longest wait Abandon() accepts (a larger grace, infinity included, is this).
constexpr double kLongestGraceSeconds = 1e7;

}  // namespace

void Engine::Stop(const Status& stop_reason) {
  bool abandoned;
  Status reason = stop_reason;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    abandoned = abandoned_;
    // Tensors still queued fail with the reason hvdlite.abandon() was given,
    // not with the error of the wait it interrupted.
    if (abandoned) reason = abandon_status_;
  }
  size_t failed = 0;
  for (auto& set : sets_.All()) {
    for (auto& entry : set->queue().Close(reason)) {
      entry.work->Fail(reason);
      // The first few are what this rank was waiting in (their submission
      // may have left the ring long ago).
      if (++failed <= kPendingRecorded) {
        FlightNote n(FlightEventKind::kError);
        n.name = &entry.request.name;
        n.op = static_cast<int>(entry.request.op);
        n.dtype = static_cast<int>(entry.request.dtype);
        n.process_set = set->id();
        n.flag = kFlightPendingAtStop;
        n.detail = "pending when the engine stopped";
        flight_.Record(n);
      }
    }
  }
  FlightNote note(FlightEventKind::kStopped);
  note.detail = reason.message().c_str();
  note.count = static_cast<int32_t>(failed);
  note.flag = static_cast<uint8_t>(reason.kind());
  flight_.Record(note);
  // A failure leaves its record; a shutdown that failed no tensor is the
  // normal end of a job. Abandon() dumps once the thread has stopped.
  if (flight_.enabled() && !abandoned && (reason.kind() != ErrorKind::kShutdown || failed > 0)) {
    DumpFlightRecorder("the engine stopped: " + reason.message());
  }
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    stopped_ = true;
    stopped_status_ = reason;
  }
  // After the stop is visible: a device tensor submitted now gets the
  // engine's reason, not "no device executor".
  device_jobs_.Close(reason);
  state_cv_.notify_all();
}

Status Engine::stopped_status() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (stopped_) return stopped_status_;
  // Abandoned, its thread still on its way out (or stuck): stopped for
  // everyone outside.
  return abandoned_ ? abandon_status_ : Status::OK();
}

void Engine::Shutdown(const std::string& reason) {
  {
    std::unique_lock<std::mutex> lock(state_mutex_);
    if (!stopped_ && !shutdown_requested_) {
      shutdown_requested_ = true;
      shutdown_reason_ = reason;
    }
    state_cv_.notify_all();
    if (!state_cv_.wait_for(lock, std::chrono::duration<double>(kShutdownGraceSeconds),
                            [this] { return stopped_; })) {
      // A peer is not answering: stop waiting on MPI.
      abort_.Raise(Status::Error(ErrorKind::kTimeout,
                                 "the engine is shutting down and a peer rank stopped answering"));
    }
  }
  JoinThread();
  timeline_.Stop();
  dump_signal_.Stop();
}

void Engine::JoinThread() {
  std::lock_guard<std::mutex> lock(join_mutex_);
  if (thread_.joinable()) thread_.join();
}

Status Engine::Abandon(const std::string& reason, double grace_seconds) {
  RaiseAbandon(reason);
  const bool stopped = WaitForThread(grace_seconds);
  std::lock_guard<std::mutex> lock(abandon_mutex_);
  if (!stopped) {
    // The framework threads waiting for handles hear of it anyway (and the
    // executor of device jobs); the stuck thread may still touch their
    // tensors, which is one reason why this process must go.
    const Status lost = stopped_status();
    handles_.FailPending(lost);
    device_jobs_.Close(lost);
    if (!dumped_) DumpFlightRecorder("hvdlite.abandon(): the engine thread is stuck: " + reason);
    dumped_ = true;
    char grace[32];
    std::snprintf(grace, sizeof(grace), "%g", grace_seconds);
    return Status::Error(
        ErrorKind::kTimeout,
        "hvdlite.abandon(): the engine thread did not stop within " + std::string(grace) +
            " s; it is stuck in an MPI call that waits for the lost peer (such calls cannot be "
            "interrupted). Its handles have failed, but this process cannot start a new engine: "
            "it must be restarted");
  }
  if (!released_) ReleaseAbandoned();
  return Status::OK();
}

Status Engine::AbandonedError(const std::string& reason) {
  // kShutdown: front ends treat it as "a peer is lost" (HvdliteShutdownError).
  return Status::Error(ErrorKind::kShutdown, "hvdlite.abandon() was called on this rank: " + reason);
}

void Engine::RaiseAbandon(const std::string& reason) {
  Status lost;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (abandoned_) return;
    abandoned_ = true;
    abandon_status_ = AbandonedError(reason);
    lost = abandon_status_;
  }
  FlightNote note(FlightEventKind::kAbandoned);
  note.detail = reason.c_str();
  flight_.Record(note);
  {
    // The thread must run to leave. At SCHED_IDLE (engine_priority.h) on a
    // host whose cores are busy it runs seldom (4 ranks computing on 2
    // cores: 80-250 ms to stop, 10-25 ms as a normal thread).
    // (Busy: another caller joins it, which is over once it has stopped.)
    std::unique_lock<std::mutex> lock(join_mutex_, std::try_to_lock);
    if (lock.owns_lock() && thread_.joinable()) TryNormalPriority(thread_.native_handle());
  }
  // Every wait of the wires ends (with this reason), and the loop starts no
  // further round.
  abort_.Raise(lost);
  state_cv_.notify_all();
}

bool Engine::WaitForThread(double seconds) {
  if (!(seconds > 0)) seconds = 0;  // negative or NaN: look, do not wait
  seconds = std::min(seconds, kLongestGraceSeconds);
  std::unique_lock<std::mutex> lock(state_mutex_);
  return state_cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return thread_done_; });
}

void Engine::ReleaseAbandoned() {
  JoinThread();
  released_ = true;
  // Local only: shared memory unmapped, communicators and requests left to
  // MPI_Finalize (ProcessSet::Abandon).
  for (auto& set : sets_.All()) set->Abandon();
  // The thread failed what was queued or in flight before it returned; a
  // handle created meanwhile, or a device job, fails here.
  const Status lost = stopped_status();
  handles_.FailPending(lost);
  device_jobs_.Close(lost);
  timeline_.Stop();
  dump_signal_.Stop();
  if (!dumped_) DumpFlightRecorder("the engine was abandoned: " + lost.message());
  dumped_ = true;
}

}  // namespace hvdlite
