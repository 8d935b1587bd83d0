// The one engine object of a process: owns the background thread that does
// all of hvdlite's MPI work (its life: setup, the loop of rounds, shutdown
// or abandonment), the process sets and their changes, and the table of
// handles.
#pragma once

#include <pthread.h>

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tuning/autotuner.h"
#include "tuning/engine_affinity.h"
#include "engine/dump_signal.h"
#include "engine/engine_options.h"
#include "engine/engine_stats.h"
#include "engine/flight_recorder.h"
#include "engine/handle_table.h"
#include "ops/operations.h"
#include "process_set/process_set.h"
#include "timeline/timeline.h"
#include "process_set/topology.h"
#include "transport/abort_signal.h"
#include "engine/work.h"

namespace hvdlite {

// What a framework thread hands to the engine for one tensor.
struct EnqueueArgs {
  Request request;      // name may be empty: the engine then picks one
  int32_t process_set = 0;
  const void* input = nullptr;
  void* output = nullptr;  // allreduce/broadcast: caller-owned, same shape as input
  // allgather/reducescatter/alltoall: the bytes of a caller-owned `output`
  // (0: none), used when the result is exactly that long.
  int64_t output_bytes = 0;
};

class Engine {
 public:
  // Duplicates `comm`, starts the thread and waits until it is ready.
  static Status Start(MPI_Comm comm, std::unique_ptr<Engine>* out);
  ~Engine();

  Status Enqueue(EnqueueArgs args, int64_t* handle);
  std::shared_ptr<Work> FindWork(int64_t handle) { return handles_.Find(handle); }
  void ReleaseWork(int64_t handle) { handles_.Release(handle); }
  // Work::Wait for a framework thread; may keep the engine on its core
  // meanwhile (HVDLITE_ENGINE_AFFINITY, engine_affinity.h).
  bool Wait(Work& work, double timeout_seconds) { return affinity_.Wait(work, timeout_seconds); }

  // Asks every rank's engine to stop (negotiated), fails what is pending and
  // joins the thread. Safe to call more than once.
  void Shutdown(const std::string& reason);
  // Stops the engine on this rank alone, when a peer is lost and the
  // survivors go on without it (engine_stop.cc): no message to any rank,
  // no MPI call that could wait for one. Every pending handle fails with
  // kShutdown and a text that holds `reason`; the thread is joined if it
  // stops within `grace_seconds`, else a kTimeout error says it is stuck in
  // MPI (this process must then be restarted). Any thread; safe to call more
  // than once (the first reason stays; a later call waits for the thread
  // again). The object must be kept, never destroyed, afterwards: MPI may
  // still complete requests the thread left pending into its memory.
  Status Abandon(const std::string& reason, double grace_seconds);
  // The error of an engine abandoned for `reason`: its handles', and (api/)
  // every later call's until the next init.
  static Status AbandonedError(const std::string& reason);
  // The reason the engine stopped; OK while it runs.
  Status stopped_status();

  const Topology& topology() const { return topology_; }
  std::shared_ptr<ProcessSet> process_set(int32_t id) { return sets_.Get(id); }
  std::vector<int32_t> process_set_ids() { return sets_.Ids(); }
  const EngineOptions& options() const { return options_; }
  EngineStats& stats() { return stats_; }
  // Runtime timeline control; the file is written by this rank.
  Status StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline();
  // Where the device executor takes its jobs (c_api: hvd_device_*).
  DeviceJobQueue& device_jobs() { return device_jobs_; }
  // Clears error-feedback residuals (applied by the engine thread).
  void ResetCompressionState() { reset_compression_ = true; }
  // The framework's compute threads per rank (its adapter reports them):
  // with HVDLITE_ENGINE_PRIORITY=auto the first report picks the engine
  // thread's policy, once (a lowered priority cannot be raised back without
  // privilege; engine_priority.h).
  void SetComputeThreads(int threads);

  // The flight recorder's dump (engine_flight.cc): a header line (where this
  // rank was, whom it lost, its last decisions) and one JSON line per event.
  // Any thread, also while the engine thread is stuck; `reason` says why.
  std::string FlightRecorderText(const std::string& reason);
  // Writes that dump: one summary line on stderr, the JSON lines on stderr
  // marked for hvdrun when it reads them (HVDLITE_RANK_REPORTS), and to a
  // file under HVDLITE_FLIGHT_RECORDER_DIR when set.
  void DumpFlightRecorder(const std::string& reason);
  FlightRecorder& flight() { return flight_; }

 private:
  Engine(MPI_Comm user_comm, EngineOptions options);

  void ThreadMain();
  Status Setup();
  // Allgathers every rank's setup outcome; fails on all ranks if any failed.
  Status AgreeOnSetup(const Status& local);
  void Loop();
  // One negotiation + execution round on `set`. Returns false to stop;
  // `*idle`: no rank of the set had anything to do.
  bool RunCycle(ProcessSet& set, bool is_global, bool* idle);
  // Every rank tunes with rank 0's autotune settings (sample boundaries must
  // fall in the same round everywhere).
  Status StartAutotune();
  // A sample of the autotuner ended in this round of the global set.
  Status EndAutotuneSample(ProcessSet& global);
  Status ChangeProcessSets(ProcessSet& global, const Response& response);
  void Stop(const Status& reason);
  // The engine thread has returned; joins it (once, whichever thread asks).
  void JoinThread();
  // Abandon's steps (engine_stop.cc).
  void RaiseAbandon(const std::string& reason);
  bool WaitForThread(double seconds);
  void ReleaseAbandoned();
  // The flight recorder's view of a negotiated round.
  void RecordRound(ProcessSet& set, const ResponseList& responses);
  // Local peers whose process is gone or stopped, as the dump finds them.
  std::vector<FlightSummary::Lost> ProbePeers();
  void SetPriority(pthread_t thread, EnginePriority priority);

  MPI_Comm user_comm_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  EngineOptions options_;
  Status options_status_;  // a malformed HVDLITE_* setting, reported after AgreeOnSetup
  Topology topology_;
  EngineStats stats_;
  EngineAffinity affinity_{&stats_};
  Timeline timeline_;
  DeviceJobQueue device_jobs_{&timeline_};
  ProcessSetTable sets_;
  OperationRunner runner_;
  std::unique_ptr<Autotuner> autotuner_;  // while HVDLITE_AUTOTUNE searches
  double cycle_time_ms_;                  // the autotuner may change it
  std::atomic<bool> reset_compression_{false};
  std::atomic<bool> mark_cycles_{false};
  bool priority_chosen_ = false;  // under state_mutex_

  std::thread thread_;
  std::mutex join_mutex_;
  AbortSignal abort_;  // every wait of the wires polls it

  std::mutex state_mutex_;
  std::condition_variable state_cv_;
  bool ready_ = false;
  bool stopped_ = false;
  Status setup_status_;
  Status stopped_status_;
  bool shutdown_requested_ = false;
  bool work_pending_ = false;  // set by Enqueue: start the next round now
  std::string shutdown_reason_;
  bool thread_done_ = false;   // ThreadMain returned
  bool abandoned_ = false;     // Abandon() was called
  Status abandon_status_;      // what Abandon() fails the handles with
  std::mutex abandon_mutex_;   // one caller of Abandon() releases the engine
  bool released_ = false;      // under abandon_mutex_: ReleaseAbandoned() ran
  bool dumped_ = false;        // under abandon_mutex_: the flight recorder was dumped

  HandleTable handles_;
  FlightRecorder flight_;
  std::vector<int> pids_;  // every rank's process id (Setup), for ProbePeers
  // Last: its thread dumps the members above, so it stops first.
  DumpSignal dump_signal_;
};

}  // namespace hvdlite
