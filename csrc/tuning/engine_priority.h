// How the kernel schedules the engine thread against the training threads.
//
// On one host a reduction is CPU work (copies and sums in shared memory).
// Where the training threads fill every core, backward pays for it however
// it is scheduled, but not equally: at normal priority the engine wakes for
// every negotiation round and every chunk a peer publishes, preempts
// backward hundreds of times per step and runs in short slices (~1.5x the
// CPU of the same work in one stretch). At SCHED_IDLE it runs only on a core
// nothing else wants: after backward, or beside a rank that finished first.
// Between hosts the engine must drive the network while backward runs, so
// there it stays an ordinary thread.
#pragma once

#include <pthread.h>

#include "engine/engine_options.h"

namespace hvdlite {

// What kAuto decides from. compute_threads is the framework's intra-op
// threads per rank as its adapter reported it (0: not reported, e.g. NumPy
// collectives, or a GPU job whose host threads mostly wait).
struct HostLoad {
  int compute_threads = 0;
  int ranks_on_host = 1;
  int usable_cores = 1;       // the process's CPU affinity
  bool job_on_one_host = true;
};

// kAuto: kIdle when the whole job runs on this host and its compute threads
// fill the cores this rank may use (ranks x threads >= cores), else kNormal.
// Any other value is returned as given.
EnginePriority ResolvePriority(EnginePriority requested, const HostLoad& load);

// Sets `thread`'s policy. Lowering it needs no privilege; raising it back is
// refused without CAP_SYS_NICE, so the engine lowers it at most once.
// Returns false (after saying why on stderr) when the kernel refused.
bool ApplyPriority(pthread_t thread, EnginePriority priority);

// Makes `thread` an ordinary (SCHED_OTHER) thread again where the kernel
// lets it (CAP_SYS_NICE, or an RLIMIT_NICE that allows nice 0); quietly
// leaves its policy otherwise. For a thread that must run soon, whatever
// the host's load: an engine thread that has to leave (Engine::Abandon).
void TryNormalPriority(pthread_t thread);

// CPUs in `thread`'s affinity mask (at least 1).
int UsableCores(pthread_t thread);

const char* PriorityName(EnginePriority priority);

}  // namespace hvdlite
