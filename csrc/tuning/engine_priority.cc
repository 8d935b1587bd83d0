#include "tuning/engine_priority.h"

#include <sched.h>

#include <cstdio>
#include <cstring>

namespace hvdlite {

EnginePriority ResolvePriority(EnginePriority requested, const HostLoad& load) {
  if (requested != EnginePriority::kAuto) return requested;
  if (!load.job_on_one_host || load.compute_threads <= 0) return EnginePriority::kNormal;
  const long demand = static_cast<long>(load.compute_threads) * load.ranks_on_host;
  return demand >= load.usable_cores ? EnginePriority::kIdle : EnginePriority::kNormal;
}

bool ApplyPriority(pthread_t thread, EnginePriority priority) {
  if (priority == EnginePriority::kNormal || priority == EnginePriority::kAuto) return true;
  const int policy = priority == EnginePriority::kIdle ? SCHED_IDLE : SCHED_BATCH;
  sched_param param{};  // priority 0: the only one these policies take
  const int err = pthread_setschedparam(thread, policy, &param);
  if (err != 0) {
    std::fprintf(stderr, "hvdlite: HVDLITE_ENGINE_PRIORITY: could not change the engine thread's "
                 "scheduling policy to %s (%s); it runs as a normal thread\n",
                 PriorityName(priority), std::strerror(err));
    return false;
  }
  return true;
}

void TryNormalPriority(pthread_t thread) {
  int policy = SCHED_OTHER;
  sched_param param{};
  if (pthread_getschedparam(thread, &policy, &param) != 0 || policy == SCHED_OTHER) return;
  param.sched_priority = 0;
  pthread_setschedparam(thread, SCHED_OTHER, &param);
}

int UsableCores(pthread_t thread) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (pthread_getaffinity_np(thread, sizeof(set), &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

const char* PriorityName(EnginePriority priority) {
  switch (priority) {
    case EnginePriority::kNormal: return "normal";
    case EnginePriority::kBatch: return "batch";
    case EnginePriority::kIdle: return "idle";
    case EnginePriority::kAuto: return "auto";
  }
  return "?";
}

}  // namespace hvdlite
