// Engine settings, read once at init from HVDLITE_* environment variables
// (HOROVOD_* names accepted as aliases so existing job scripts keep working).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace hvdlite {

// How the engine thread waits for a nonblocking MPI request. MPI moves data
// only while it is tested, so a waiting thread that sleeps stalls the
// transfer (a 1 MB allreduce took 5x longer with 100 us naps between tests);
// one that spins takes the core from the training thread. So it spins
// briefly (latency), then tests with a sched_yield in between, which runs
// any other thread that wants this core (backward, another rank) and comes
// straight back when none does; only a wait longer than yield_us (a peer
// that is far behind, or gone) drops to sleeping in sleep_us steps.
struct WaitPolicy {
  int64_t spin_us = 10;
  int64_t yield_us = 1000000;
  int64_t sleep_us = 100;
  // Give up waiting after this long (0 = never). Protects against a peer that
  // died without telling anyone.
  double timeout_seconds = 0.0;
};

// How the kernel schedules the engine thread against the training threads
// (engine_priority.h explains why it matters). kIdle runs the engine only on
// a core nothing else wants (after backward, or beside it on a spare core);
// kBatch keeps its fair share but never preempts a running thread when it
// wakes; kAuto is kIdle where the job runs on one host whose cores its
// compute threads fill, kNormal elsewhere.
enum class EnginePriority { kNormal, kBatch, kIdle, kAuto };

// Where the engine thread may run (engine_affinity.h): kFollow pins it to the
// core of a thread waiting for its work, kNone leaves it to the kernel, kAuto
// follows where the engine runs at idle priority.
enum class EngineAffinityMode { kAuto, kFollow, kNone };

struct EngineOptions {
  double cycle_time_ms = 1.0;
  // Chosen by the sweep in docs/benchmarks.md: 4-8 MB buckets were fastest on
  // the ResNet-50 set and the train step; bigger tensors skip the copy.
  int64_t fusion_threshold_bytes = 4 * 1024 * 1024;
  // Tensors at least this large (capped at the fusion threshold) skip the
  // fusion buffer and are reduced straight from their own memory: copying
  // them in and out cost more than the latency fusing them saves (1-2 MB was
  // fastest on the ResNet-50 set, docs/benchmarks.md). 0: the fusion threshold.
  int64_t direct_threshold_bytes = 1024 * 1024;
  int64_t cache_capacity = 1024;
  // Reduce through shared memory when every rank of a process set is on this
  // host (transport/shm/shm_collectives.h); otherwise, or when off, MPI.
  bool shm_allreduce = true;
  int64_t shm_chunk_bytes = 128 * 1024;
  // Chunks in each rank's ring: how far a rank may run ahead of a peer that
  // is not scheduled (its core busy with backward) before it has to wait.
  int64_t shm_slots = 16;
  // A setting that is on, off, or chosen from the layout of the ranks.
  enum class Choice { kAuto, kOn, kOff };
  // Whether the shared-memory allreduce writes its slots with streaming
  // (cache-bypassing) stores; kAuto: measured while the job runs
  // (transport/shm/slot_store_choice.h). A rank's own choice: the bytes are
  // the same either way.
  Choice shm_streaming_stores = Choice::kAuto;
  // Between hosts: large allreduces take a pipelined ring over MPI
  // point-to-point (transport/ring/ring_transport.h). kAuto: when a process set
  // spans more than one host.
  Choice ring = Choice::kAuto;
  int64_t ring_threshold_bytes = 1024 * 1024;
  int64_t ring_chunk_bytes = 512 * 1024;
  int64_t ring_window = 4;  // chunks in flight each way
  // Several ranks per host: reduce inside the host first, ring between hosts
  // (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE). kAuto and kOn: whenever the
  // ring runs and every host has the same number (> 1) of the set's ranks;
  // it beat MPI there (4 hosts x 2 ranks: 0.84x, docs/benchmarks.md).
  Choice hierarchical_allreduce = Choice::kAuto;
  // The same layouts: large allgathers gather across hosts by local rank,
  // then inside the host (transport/ring/hierarchical_allgather.h; Horovod's
  // HOROVOD_HIERARCHICAL_ALLGATHER). kAuto and kOn: wherever the allreduce
  // is hierarchical.
  Choice hierarchical_allgather = Choice::kAuto;
  // Hierarchical: the in-host phases and the ring pipeline over pieces of
  // this size (transport/ring/hierarchical_allreduce.h).
  int64_t hierarchical_piece_bytes = 4 * 1024 * 1024;
  // Autotune (autotuner.h): while the job trains, try fusion thresholds and
  // cycle times and keep the fastest. A setting the user gave is not tuned.
  struct Autotune {
    bool enabled = false;
    std::string log_path;         // CSV of every sample, written by rank 0
    int64_t warmup_samples = 3;   // discarded at the start (caches, allocation)
    int64_t steps_per_sample = 10;
    int64_t samples_per_setting = 2;
    bool tune_fusion = true;      // false when FUSION_THRESHOLD was set
    bool tune_cycle = true;       // false when CYCLE_TIME was set
  } autotune;
  std::string timeline_path;
  bool timeline_mark_cycles = false;
  bool stall_check_enabled = true;
  double stall_check_seconds = 60.0;
  double stall_shutdown_seconds = 0.0;
  WaitPolicy wait;
  EnginePriority priority = EnginePriority::kAuto;
  EngineAffinityMode affinity = EngineAffinityMode::kAuto;

  // Reads the environment; a malformed value is an error naming the variable.
  static Status FromEnvironment(EngineOptions* out);

  // The settings every rank must share because they decide what goes on the
  // wire (bucket plans, response-cache slots, chunk and piece sizes): with
  // different values ranks would run different collectives. The engine
  // broadcasts rank 0's at init and every rank adopts them.
  std::vector<int64_t> SharedSettings() const;
  // Takes rank 0's SharedSettings(); returns the variable names whose value
  // this rank had set differently (for a warning).
  std::vector<std::string> AdoptSharedSettings(const std::vector<int64_t>& root);
};

// Collective over `comm`: every rank adopts rank 0's SharedSettings(), and a
// rank whose own differed says so on stderr.
Status ShareSettingsOfRoot(MPI_Comm comm, int rank, EngineOptions* options);

}  // namespace hvdlite
