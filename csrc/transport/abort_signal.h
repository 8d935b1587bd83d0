// Why the engine stopped waiting for its peers. Every wait of a wire (MPI
// requests, shared-memory counters: transport/waiter.h, shm_collectives.cc)
// polls the flag and, once it is raised, fails with the reason, so the
// engine thread leaves any wait promptly: at shutdown when a peer no longer
// answers, and when the engine is abandoned on this rank because a peer was
// lost (engine_stop.cc, both).
#pragma once

#include <atomic>
#include <mutex>
#include <string>

#include "common/status.h"

namespace hvdlite {

class AbortSignal {
 public:
  // The first reason stays: later ones change nothing.
  void Raise(const Status& reason) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (raised_.load(std::memory_order_relaxed)) return;
      reason_ = reason;
    }
    raised_.store(true, std::memory_order_release);
  }
  // Cheap enough for every turn of a spinning wait.
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  Status reason() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return reason_;
  }
  // The error a wait for `what` ends with (the reason's kind).
  Status ErrorIn(const char* what) const {
    const Status why = reason();
    return Status::Error(why.kind(), std::string(what) + " abandoned: " + why.message());
  }

 private:
  std::atomic<bool> raised_{false};
  mutable std::mutex mutex_;
  Status reason_;
};

}  // namespace hvdlite
