#include "engine/engine.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "tuning/engine_priority.h"
#include "negotiation/request_validation.h"
#include "timeline/timeline_names.h"

namespace hvdlite {

namespace {

bool IsMember(const std::vector<int32_t>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

// Process-set changes split the job's communicator, which every rank reaches
// through the global set's rounds. A members-only add is matched by name
// across its members, so it needs one they share (automatic names count per
// rank), and only members submit it.
Status CheckProcessSetChange(const Request& q, int32_t set_id, int rank) {
  if (q.op != OpType::kAddProcessSet && q.op != OpType::kRemoveProcessSet) return Status::OK();
  if (set_id != 0) {
    return Status::InvalidArgument(std::string(OpTypeName(q.op)) +
                                   " is submitted to the global process set (0), not to set " +
                                   std::to_string(set_id));
  }
  if (!q.members_only) return Status::OK();
  if (q.name.empty()) {
    return Status::InvalidArgument("an add_process_set that only the members submit needs a name, the "
                                   "same on every member");
  }
  if (!IsMember(q.set_ranks, rank)) {
    return Status::InvalidArgument("rank " + std::to_string(rank) + " is not a member of the process set " +
                                   ShapeString(std::vector<int64_t>(q.set_ranks.begin(), q.set_ranks.end())) +
                                   " it adds; only the set's members submit an add made by the members alone");
  }
  return Status::OK();
}

}  // namespace

Engine::Engine(MPI_Comm user_comm, EngineOptions options)
    : user_comm_(user_comm),
      options_(std::move(options)),
      runner_(options_, &stats_, &timeline_, &device_jobs_),
      cycle_time_ms_(options_.cycle_time_ms),
      flight_(options_.flight_recorder_events) {
  runner_.SetFlightRecorder(&flight_);
}

Status Engine::StartTimeline(const std::string& path, bool mark_cycles) {
  mark_cycles_ = mark_cycles;
  // Without %r in the path only rank 0 writes, as Horovod does; with it,
  // every rank writes its own file for `python -m hvdlite.timeline merge`.
  if (path.find("%r") == std::string::npos && topology_.rank != 0) return Status::OK();
  return timeline_.Start(path, topology_.rank);
}

void Engine::StopTimeline() { timeline_.Stop(); }

Engine::~Engine() {
  Shutdown("the engine object was destroyed");
  // Process sets (and their communicators) outlive the thread so that calls
  // after a stop still get a precise error; they go with the engine, which
  // is only replaced by a new init(), while MPI is alive.
  for (int32_t id : sets_.Ids()) sets_.Remove(id);
}

void Engine::ThreadMain() {
  pthread_setname_np(pthread_self(), "hvdlite-engine");
  affinity_.Start();
  if (options_.affinity == EngineAffinityMode::kFollow) affinity_.StartFollowing(false);
  if (options_.priority != EnginePriority::kAuto) SetPriority(pthread_self(), options_.priority);
  Status s = Setup();
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    ready_ = true;
    setup_status_ = s;
    if (!s.ok()) {
      stopped_ = true;
      stopped_status_ = s;
    }
  }
  state_cv_.notify_all();
  if (!s.ok()) {
    for (int32_t id : sets_.Ids()) sets_.Remove(id);
  } else {
    Loop();
  }
  affinity_.Stop();
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    thread_done_ = true;
  }
  state_cv_.notify_all();
}

Status Engine::EndAutotuneSample(ProcessSet& global) {
  TunedSettings next;
  Status s = autotuner_->EndSample(global.transport(), &next);
  if (!s.ok()) return s;
  runner_.SetFusionThreshold(next.fusion_threshold_bytes);
  cycle_time_ms_ = next.cycle_time_ms;
  if (next.wire.ring_chunk_bytes > 0) global.transport().Tune(next.wire);
  if (!autotuner_->tuning()) autotuner_.reset();
  return Status::OK();
}

void Engine::Loop() {
  using Clock = std::chrono::steady_clock;
  // Rounds in which no rank had anything to do, in a row. After a few, the
  // engine answers its peers less often (up to 8 cycle times): an idle round
  // costs the training thread a wake-up and a collective, every cycle, for
  // the whole forward pass. New work still starts a round at once, and ranks
  // of a data-parallel job submit their first gradient at about the same time.
  int idle_rounds = 0;
  constexpr int kIdleRoundsBeforeBackoff = 4;
  auto next = Clock::now();
  while (true) {
    {
      // New work starts a round at once; otherwise a round every cycle time
      // keeps this rank answering its peers' negotiation.
      std::unique_lock<std::mutex> lock(state_mutex_);
      state_cv_.wait_until(lock, next, [this] { return shutdown_requested_ || work_pending_ || abandoned_; });
      work_pending_ = false;
    }

    affinity_.Apply();
    const auto started = Clock::now();
    bool idle = true, waiting = false;
    for (auto& set : sets_.All()) {
      // Abandoned: no further round (its peers may be gone), not even one
      // whose messages would all arrive.
      if (abort_.raised()) {
        Stop(abort_.reason());
        return;
      }
      if (!set->is_member()) continue;
      bool set_idle = false;
      if (!RunCycle(*set, set->id() == 0, &set_idle)) return;
      idle = idle && set_idle;
      waiting = waiting || set->controller().waiting();
    }
    idle_rounds = idle ? idle_rounds + 1 : 0;
    const auto cycle = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(cycle_time_ms_));
    const int backoff = std::min(std::max(idle_rounds - kIdleRoundsBeforeBackoff, 0), 3);
    // Tensors this rank announced and others have not: the ranks missing them
    // start a round the moment they submit, and rounds pair up across ranks,
    // so this rank joins the next one now instead of after its cycle time.
    next = waiting ? started : started + cycle * (1 << backoff);
  }
}

void Engine::SetComputeThreads(int threads) {
  if (options_.priority != EnginePriority::kAuto || threads <= 0) return;
  // Topology is fixed once Start() has returned; the engine thread lives
  // (and its handle is valid) while it has not stopped.
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (stopped_ || priority_chosen_) return;
  priority_chosen_ = true;
  HostLoad load;
  load.compute_threads = threads;
  load.ranks_on_host = topology_.local_size;
  load.usable_cores = UsableCores(thread_.native_handle());
  load.job_on_one_host = topology_.local_size == topology_.size;
  SetPriority(thread_.native_handle(), ResolvePriority(EnginePriority::kAuto, load));
}

void Engine::SetPriority(pthread_t thread, EnginePriority priority) {
  if (ApplyPriority(thread, priority) && priority == EnginePriority::kIdle) {
    stats_.engine_idle_priority.store(1, std::memory_order_relaxed);
    if (options_.affinity == EngineAffinityMode::kAuto) affinity_.StartFollowing(true);
  }
}

bool Engine::RunCycle(ProcessSet& set, bool is_global, bool* idle) {
  if (reset_compression_.exchange(false)) runner_.ResetCompression();
  std::vector<Request> requests = set.queue().PopNewRequests();
  bool shutdown = false;
  std::string reason;
  if (is_global) {
    std::lock_guard<std::mutex> lock(state_mutex_);
    shutdown = shutdown_requested_;
    reason = shutdown_reason_;
    if (timeline_.active() && mark_cycles_) timeline_.MarkCycle();
  }
  if (timeline_.active()) {
    for (const auto& q : requests) timeline_.Begin(TimelineRow(q), NegotiatePhase(q));
  }
  ResponseList responses;
  Status s = set.controller().Negotiate(std::move(requests), shutdown, reason, &responses);
  if (!s.ok()) {
    Stop(s);
    return false;
  }
  if (flight_.enabled()) RecordRound(set, responses);
  *idle = responses.idle;
  if (!responses.stall_error.empty()) {
    Stop(Status::Error(ErrorKind::kStall, responses.stall_error));
    return false;
  }
  if (responses.shutdown) {
    std::string text;
    for (size_t i = 0; i < responses.shutdown_ranks.size(); ++i) {
      if (i) text += "; ";
      text += "rank " + std::to_string(responses.shutdown_ranks[i]) + " " +
              responses.shutdown_reasons[i];
    }
    Stop(Status::Error(ErrorKind::kShutdown, "hvdlite has shut down: " + text));
    return false;
  }
  const bool sample_ended = is_global && autotuner_ && autotuner_->Record(responses.responses);
  // Process-set changes run alone, in order; everything else goes to the
  // runner, which fuses what it can.
  std::vector<Response> batch;
  auto flush = [&]() -> bool {
    if (batch.empty()) return true;
    Status r = runner_.RunAll(set, batch);
    batch.clear();
    if (!r.ok()) Stop(r);
    return r.ok();
  };
  for (auto& response : responses.responses) {
    if (response.kind == Response::Kind::kCollective &&
        (response.op() == OpType::kAddProcessSet || response.op() == OpType::kRemoveProcessSet)) {
      if (!flush()) return false;
      s = ChangeProcessSets(set, response);
      if (!s.ok()) {
        Stop(s);
        return false;
      }
    } else {
      batch.push_back(std::move(response));
    }
  }
  if (!flush()) return false;
  if (sample_ended) {
    s = EndAutotuneSample(set);
    if (!s.ok()) {
      Stop(s);
      return false;
    }
  }
  return true;
}

Status Engine::ChangeProcessSets(ProcessSet& global, const Response& response) {
  const Request& agreed = response.request;
  const bool member = IsMember(agreed.set_ranks, topology_.rank);
  // Every rank applies every change, in the coordinator's order, so set ids
  // agree; of a members-only add, the other ranks have no request to finish
  // (nor may they finish one of theirs that has its name).
  const bool submitted = !agreed.members_only || member;
  TensorEntry entry;
  const bool mine = submitted && global.queue().Take(response.name(), &entry);
  if (submitted && !mine) {
    return Status::Error(ErrorKind::kInternal, "process set request vanished from the queue");
  }
  const std::string row = TimelineRow(agreed);
  if (mine) {
    timeline_.End(row, NegotiatePhase(agreed));
    timeline_.Begin(row, OperationPhase(agreed));
  }
  if (response.op() == OpType::kAddProcessSet) {
    const std::vector<int32_t>& ranks = agreed.set_ranks;
    MPI_Comm comm = MPI_COMM_NULL;
    // Blocking, but every rank reaches it at the same point of the same round.
    if (MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, topology_.rank, &comm) != MPI_SUCCESS) {
      Status s = Status::Error(ErrorKind::kMpi, "MPI_Comm_split for a new process set failed");
      if (mine) {
        timeline_.End(row, OperationPhase(agreed));
        entry.work->Fail(s);
      }
      return s;
    }
    const int32_t id = sets_.NextId();
    sets_.Add(std::make_shared<ProcessSet>(id, ranks, comm, topology_.HostsOf(ranks), options_, &stats_,
                                           &abort_));
    if (mine) entry.work->value = id;
  } else {
    const int32_t id = response.request.target_set;
    auto removed = sets_.Remove(id);
    if (removed) {
      Status gone = Status::Error(ErrorKind::kShutdown,
                                  "process set " + std::to_string(id) + " was removed");
      for (auto& pending : removed->queue().Close(gone)) pending.work->Fail(gone);
    }
  }
  if (mine) {
    timeline_.End(row, OperationPhase(agreed));
    entry.work->Finish();
  }
  return Status::OK();
}

Status Engine::Enqueue(EnqueueArgs args, int64_t* handle) {
  auto set = sets_.Get(args.process_set);
  if (!set && !stopped_status().ok()) return stopped_status();
  if (!set) {
    return Status::InvalidArgument("there is no process set with id " +
                                   std::to_string(args.process_set) +
                                   " (never added, or removed); add it with add_process_set()");
  }
  if (!set->is_member()) {
    std::string ranks;
    for (size_t i = 0; i < set->ranks().size(); ++i) ranks += (i ? ", " : "") + std::to_string(set->ranks()[i]);
    return Status::InvalidArgument("rank " + std::to_string(topology_.rank) +
                                   " is not a member of process set " + std::to_string(set->id()) +
                                   " (ranks [" + ranks + "]); only members may submit to it");
  }
  Request& q = args.request;
  Status s = CheckProcessSetChange(q, set->id(), topology_.rank);
  if (s.ok()) s = CompleteRequest(&q, set->size());
  if (s.ok()) s = ValidateRequest(q, set->size());
  if (!s.ok()) return s;
  // Bad input is reported as such even when the engine has stopped.
  s = stopped_status();
  if (!s.ok()) return s;
  if (q.device && !device_jobs_.enabled()) {
    return Status::InvalidArgument(
        "a device tensor was submitted, but no device executor runs in this process (the framework "
        "adapter starts one for its GPU tensors; hvdlite.torch does)");
  }
  if (q.name.empty()) {
    q.name = set->NextAutoName(q.op);
    q.auto_named = true;
  }
  q.rank = set->rank();

  TensorEntry entry;
  entry.request = std::move(q);
  entry.input = args.input;
  entry.output = args.output;
  entry.output_bytes = args.output_bytes;
  entry.work = std::make_shared<Work>(entry.request.op, entry.request.name);
  entry.enqueued = std::chrono::steady_clock::now();
  auto work = entry.work;
  if (flight_.enabled()) {
    FlightNote note(FlightEventKind::kEnqueued);
    note.name = &entry.request.name;
    note.op = static_cast<int>(entry.request.op);
    note.dtype = static_cast<int>(entry.request.dtype);
    note.bytes = NumElements(entry.request.shape) * static_cast<int64_t>(DataTypeSize(entry.request.dtype));
    note.process_set = set->id();
    flight_.Record(note);
  }
  s = set->queue().Add(std::move(entry));
  if (!s.ok()) return s;
  *handle = handles_.Add(std::move(work));
  affinity_.NewWork();
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    wake = !work_pending_;  // later tensors of a burst need no wake-up call
    work_pending_ = true;
  }
  if (wake) state_cv_.notify_all();
  return Status::OK();
}

}  // namespace hvdlite
