// Engine settings, read once at init from HVDLITE_* environment variables
// (HOROVOD_* names accepted as aliases so existing job scripts keep working).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/wire_options.h"

namespace hvdlite {

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
  // Chosen by the fusion x cycle sweeps of the full benchmark runs
  // (bench/results/2026-11-21.json; 2026-11-23-5.md): 4 MB buckets were fastest
  // in the train step; bigger tensors skip the copy.
  int64_t fusion_threshold_bytes = 4 * 1024 * 1024;
  // Tensors at least this large (capped at the fusion threshold) skip the
  // fusion buffer and are reduced straight from their own memory: copying
  // them in and out cost more than the latency fusing them saves (1-2 MB was
  // fastest on the ResNet-50 set, bench/results/2026-11-21/README.md). 0: the fusion threshold.
  int64_t direct_threshold_bytes = 1024 * 1024;
  int64_t cache_capacity = 1024;
  // Each wire's settings (wire_options.h).
  ShmOptions shm;
  RingOptions ring;
  HierarchicalOptions hierarchical;
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
  // The flight recorder (flight_recorder.h): events kept, 0 off (about 220
  // bytes each); and where a dump also goes as a file (empty: stderr only).
  int64_t flight_recorder_events = 512;
  std::string flight_recorder_dir;

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
