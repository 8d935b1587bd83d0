// How the engine thread waits for something another rank does (an MPI
// request to complete, a peer to publish a chunk in shared memory): see
// WaitPolicy. Stops early when the engine aborts or the timeout passes.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "common/status.h"
#include "transport/abort_signal.h"
#include "transport/wire_options.h"

namespace hvdlite {

// Calls `done()` until it reports completion: it returns true when
// finished, and may set `*error` to stop with a failure (an MPI error).
// Past the policy's spin, `idle(waited)` passes the time between two calls.
template <typename Done, typename Idle>
Status WaitUntilIdle(const WaitPolicy& policy, const AbortSignal* abort, const char* what, Done done,
                     Idle idle) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto spin = std::chrono::microseconds(policy.spin_us);
  while (true) {
    Status error;
    if (done(&error)) return error;
    const auto waited = Clock::now() - start;
    if (abort != nullptr && abort->raised()) {
      // An MPI request cannot be cancelled portably; leaving it is acceptable
      // because the engine stops using this communicator after an abort.
      return abort->ErrorIn(what);
    }
    if (policy.timeout_seconds > 0 &&
        waited > std::chrono::duration<double>(policy.timeout_seconds)) {
      char limit[32];
      std::snprintf(limit, sizeof(limit), "%g", policy.timeout_seconds);
      return Status::Error(
          ErrorKind::kTimeout,
          std::string(what) + " did not complete within HVDLITE_TIMEOUT_SECONDS=" + limit +
              " s: a peer rank has probably died, hangs, or stopped calling hvdlite");
    }
    if (waited >= spin) idle(waited);
  }
}

// The policy's own idling: a sched_yield until yield_us, then naps.
template <typename Done>
Status WaitUntil(const WaitPolicy& policy, const AbortSignal* abort, const char* what, Done done) {
  const auto yield_until = std::chrono::microseconds(policy.spin_us + policy.yield_us);
  const auto nap = std::chrono::microseconds(policy.sleep_us);
  return WaitUntilIdle(policy, abort, what, done, [&](std::chrono::steady_clock::duration waited) {
    if (waited >= yield_until) {
      std::this_thread::sleep_for(nap);
    } else {
      std::this_thread::yield();
    }
  });
}

}  // namespace hvdlite
