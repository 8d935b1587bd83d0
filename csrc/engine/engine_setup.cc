// How the engine starts: MPI checked, the settings read, the engine thread
// started, and its setup on that thread (communicator, topology, the global
// process set, the timeline and autotune), agreed by every rank so that no
// rank is left waiting in init() for one whose setup failed.
#include <unistd.h>

#include <string>
#include <vector>

#include "engine/engine.h"
#include "negotiation/rank_agreement.h"

namespace hvdlite {

Status Engine::Start(MPI_Comm comm, std::unique_ptr<Engine>* out) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    return Status::InvalidArgument(
        "MPI is not initialised (or already finalised); import mpi4py's MPI before hvdlite.init()");
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    return Status::InvalidArgument(
        "MPI was initialised without MPI_THREAD_MULTIPLE; hvdlite's engine thread needs it. "
        "Leave mpi4py.rc.thread_level at its default ('multiple')");
  }
  // A bad setting is reported after the engine thread has agreed with the
  // other ranks (Setup), so a rank whose environment differs cannot leave the
  // others waiting in init().
  EngineOptions options;
  Status parsed = EngineOptions::FromEnvironment(&options);

  std::unique_ptr<Engine> engine(new Engine(comm, options));
  engine->options_status_ = parsed;
  Status s;
  engine->thread_ = std::thread(&Engine::ThreadMain, engine.get());
  {
    std::unique_lock<std::mutex> lock(engine->state_mutex_);
    engine->state_cv_.wait(lock, [&] { return engine->ready_; });
    s = engine->setup_status_;
  }
  if (!s.ok()) {
    engine->thread_.join();
    return s;
  }
  // SIGUSR1 dumps the flight recorder from here on (dump_signal.h).
  if (engine->flight_.enabled()) {
    Engine* e = engine.get();
    engine->dump_signal_.Start([e] { e->DumpFlightRecorder("SIGUSR1"); });
  }
  *out = std::move(engine);
  return Status::OK();
}

Status Engine::Setup() {
  if (MPI_Comm_dup(user_comm_, &comm_) != MPI_SUCCESS) {
    return Status::Error(ErrorKind::kMpi, "MPI_Comm_dup of the given communicator failed");
  }
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  Status found = DiscoverTopology(comm_, &topology_);
  if (found.ok()) found = ShareSettingsOfRoot(comm_, topology_.rank, &options_);
  if (found.ok()) {
    // Each rank's process id: a dump tells a peer whose process is gone
    // from one that is slow (ProbePeers).
    const int pid = static_cast<int>(getpid());
    pids_.assign(topology_.size, 0);
    if (MPI_Allgather(&pid, 1, MPI_INT, pids_.data(), 1, MPI_INT, comm_) != MPI_SUCCESS) {
      found = Status::Error(ErrorKind::kMpi, "MPI_Allgather of the ranks' process ids failed");
    }
  }
  if (!found.ok()) return found;
  runner_.UseOptions(options_);

  std::vector<int32_t> all(topology_.size);
  for (int r = 0; r < topology_.size; ++r) all[r] = r;
  sets_.Add(std::make_shared<ProcessSet>(sets_.NextId(), all, comm_, topology_.HostsOf(all), options_,
                                         &stats_, &abort_));
  Status local = options_status_;
  if (local.ok() && !options_.timeline_path.empty()) local = StartTimeline(options_.timeline_path, options_.timeline_mark_cycles);
  Status agreed = AgreeOnSetup(local);
  if (agreed.ok()) agreed = StartAutotune();
  if (!agreed.ok()) timeline_.Stop();
  return agreed;
}

Status Engine::StartAutotune() {
  // Rank 0's autotune settings and, when it tunes, its starting cycle time
  // (the fusion threshold is rank 0's already: ShareSettingsOfRoot).
  EngineOptions::Autotune& a = options_.autotune;
  double shared[7] = {static_cast<double>(a.enabled), static_cast<double>(a.warmup_samples),
                      static_cast<double>(a.steps_per_sample), static_cast<double>(a.samples_per_setting),
                      static_cast<double>(a.tune_fusion), static_cast<double>(a.tune_cycle),
                      options_.cycle_time_ms};
  Status shared_ok = ShareRootValues(comm_, shared, 7, "the autotune settings");
  if (!shared_ok.ok()) return shared_ok;
  a.enabled = shared[0] != 0;
  if (!a.enabled) return Status::OK();
  a.warmup_samples = static_cast<int64_t>(shared[1]);
  a.steps_per_sample = static_cast<int64_t>(shared[2]);
  a.samples_per_setting = static_cast<int64_t>(shared[3]);
  a.tune_fusion = shared[4] != 0;
  a.tune_cycle = shared[5] != 0;
  options_.cycle_time_ms = shared[6];
  WireSettings wire;
  const bool tunable = sets_.Get(0)->transport().GetWireSettings(&wire);
  autotuner_ = std::make_unique<Autotuner>(options_, topology_.rank, tunable ? &wire : nullptr);
  runner_.SetFusionThreshold(autotuner_->settings().fusion_threshold_bytes);
  cycle_time_ms_ = autotuner_->settings().cycle_time_ms;
  return Status::OK();
}

Status Engine::AgreeOnSetup(const Status& local) {
  // Every rank learns whether init() failed anywhere: otherwise a rank whose
  // setting or timeline path was bad raises while the others start engines
  // and wait in their first collective for it forever.
  std::vector<std::string> errors;
  Status agreed = AgreeOnStatus(comm_, local, &errors);
  if (!agreed.ok()) return agreed;
  if (!local.ok()) return local;
  std::string others;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    others += (others.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + errors[r];
  }
  if (others.empty()) return Status::OK();
  return Status::InvalidArgument("hvdlite.init() failed on another rank, so it fails here too (" +
                                 others + ")");
}

}  // namespace hvdlite
