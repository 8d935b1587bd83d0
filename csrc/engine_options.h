// Engine settings, read once at init from HVDLITE_* environment variables
// (HOROVOD_* names accepted as aliases so existing job scripts keep working).
#pragma once

#include <cstdint>
#include <string>

#include "status.h"

namespace hvdlite {

// How the engine thread waits for a nonblocking MPI request: spin for a
// short while (latency), then sleep in small steps (so a waiting rank does not
// burn a core that the training thread needs).
struct WaitPolicy {
  int64_t spin_us = 50;
  int64_t sleep_us = 100;
  // Give up waiting after this long (0 = never). Protects against a peer that
  // died without telling anyone.
  double timeout_seconds = 0.0;
};

struct EngineOptions {
  double cycle_time_ms = 1.0;
  // Chosen by the sweep in docs/benchmarks.md: 4-8 MB buckets were fastest on
  // the ResNet-50 set and the train step; bigger tensors skip the copy.
  int64_t fusion_threshold_bytes = 4 * 1024 * 1024;
  int64_t cache_capacity = 1024;
  std::string timeline_path;
  bool timeline_mark_cycles = false;
  bool stall_check_enabled = true;
  double stall_check_seconds = 60.0;
  double stall_shutdown_seconds = 0.0;
  WaitPolicy wait;

  // Reads the environment; a malformed value is an error naming the variable.
  static Status FromEnvironment(EngineOptions* out);
};

}  // namespace hvdlite
