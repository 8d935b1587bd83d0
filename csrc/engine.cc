#include "engine.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "collectives/adasum.h"
#include "timeline_names.h"

namespace hvdlite {

namespace {

// How long Shutdown() lets the engine finish its last round before it stops
// waiting on peers (one of them may be gone).
constexpr double kShutdownGraceSeconds = 30.0;

// Lowering a thread's own policy needs no privilege, so this only fails on a
// kernel without the policy; the engine then runs as a normal thread.
void ApplyPriority(EnginePriority priority) {
  if (priority == EnginePriority::kNormal) return;
  const int policy = priority == EnginePriority::kIdle ? SCHED_IDLE : SCHED_BATCH;
  sched_param param{};  // priority 0: the only one these policies take
  const int err = pthread_setschedparam(pthread_self(), policy, &param);
  if (err != 0) {
    std::fprintf(stderr, "hvdlite: HVDLITE_ENGINE_PRIORITY: could not change the engine thread's "
                 "scheduling policy (%s); it runs as a normal thread\n", std::strerror(err));
  }
}

bool IsReducing(OpType op) { return op == OpType::kAllreduce || op == OpType::kReducescatter; }

// What Adasum (collectives/adasum.h) can reduce, with Horovod's limits.
Status ValidateAdasum(const Request& q, int set_size) {
  if (q.op != OpType::kAllreduce) {
    return Status::InvalidArgument(
        "op=Adasum works only with allreduce (Horovod's reducescatter refuses it too); use Sum "
        "or Average");
  }
  if (!IsFloatingPoint(q.dtype)) {
    return Status::InvalidArgument(std::string("op=Adasum needs floating-point tensors (float16, "
                                               "bfloat16, float32, float64), not ") +
                                   DataTypeName(q.dtype) + "; cast to float32 first");
  }
  if (q.compression.type != CompressionType::kNone) {
    return Status::InvalidArgument(
        std::string("op=Adasum cannot be combined with ") + CompressionName(q.compression.type) +
        " compression: its dot products need the gradients as they are; use Compression.none");
  }
  if (!AdasumSupportsSize(set_size)) {
    return Status::InvalidArgument(
        "op=Adasum needs a power-of-2 number of ranks (1, 2, 4, 8, ...), but the process set "
        "has " + std::to_string(set_size) + "; Horovod has the same limit. Run on a power-of-2 "
        "number of ranks (or reduce over a process set of that size), or use op=Average");
  }
  return Status::OK();
}

}  // namespace

Engine::Engine(MPI_Comm user_comm, EngineOptions options)
    : user_comm_(user_comm),
      options_(std::move(options)),
      runner_(options_, &stats_, &timeline_) {}

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
  *out = std::move(engine);
  return Status::OK();
}

void Engine::ThreadMain() {
  pthread_setname_np(pthread_self(), "hvdlite-engine");
  ApplyPriority(options_.priority);
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
    return;
  }
  Loop();
}

Status Engine::Setup() {
  if (MPI_Comm_dup(user_comm_, &comm_) != MPI_SUCCESS) {
    return Status::Error(ErrorKind::kMpi, "MPI_Comm_dup of the given communicator failed");
  }
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &topology_.rank);
  MPI_Comm_size(comm_, &topology_.size);

  // Ranks on the same host share a processor name; local and cross ranks
  // follow from the list of names, without extra communicators.
  constexpr int kNameLen = MPI_MAX_PROCESSOR_NAME;
  std::vector<char> names(static_cast<size_t>(kNameLen) * topology_.size, '\0');
  std::vector<char> mine(kNameLen, '\0');
  int len = 0;
  MPI_Get_processor_name(mine.data(), &len);
  if (MPI_Allgather(mine.data(), kNameLen, MPI_CHAR, names.data(), kNameLen, MPI_CHAR, comm_) !=
      MPI_SUCCESS) {
    return Status::Error(ErrorKind::kMpi, "MPI_Allgather of host names failed");
  }
  auto host_of = [&](int r) { return std::string(names.data() + static_cast<size_t>(r) * kNameLen); };
  std::vector<int> local_rank_of(topology_.size);
  std::vector<std::string> hosts;
  topology_.host_of_rank.assign(topology_.size, 0);
  for (int r = 0; r < topology_.size; ++r) {
    int same = 0;
    for (int p = 0; p < r; ++p) same += host_of(p) == host_of(r);
    local_rank_of[r] = same;
    auto h = std::find(hosts.begin(), hosts.end(), host_of(r));
    topology_.host_of_rank[r] = static_cast<int>(h - hosts.begin());
    if (h == hosts.end()) hosts.push_back(host_of(r));
  }
  const int me = topology_.rank;
  topology_.local_rank = local_rank_of[me];
  topology_.local_size = 0;
  topology_.cross_rank = 0;
  topology_.cross_size = 0;
  for (int r = 0; r < topology_.size; ++r) {
    if (host_of(r) == host_of(me)) ++topology_.local_size;
    if (local_rank_of[r] == local_rank_of[me]) {
      if (r < me) ++topology_.cross_rank;
      ++topology_.cross_size;
    }
  }

  std::vector<int32_t> all(topology_.size);
  for (int r = 0; r < topology_.size; ++r) all[r] = r;
  sets_.Add(std::make_shared<ProcessSet>(sets_.NextId(), all, comm_, topology_.OneHost(all), options_,
                                         &stats_, &abort_));
  Status local = options_status_;
  if (local.ok() && !options_.timeline_path.empty()) local = StartTimeline(options_.timeline_path, options_.timeline_mark_cycles);
  Status agreed = AgreeOnSetup(local);
  if (!agreed.ok()) timeline_.Stop();
  return agreed;
}

bool Topology::OneHost(const std::vector<int32_t>& ranks) const {
  for (int32_t r : ranks) {
    if (host_of_rank.at(static_cast<size_t>(r)) != host_of_rank.at(static_cast<size_t>(ranks.at(0)))) {
      return false;
    }
  }
  return true;
}

Status Engine::AgreeOnSetup(const Status& local) {
  // Every rank learns whether init() failed anywhere: otherwise a rank whose
  // setting or timeline path was bad raises while the others start engines
  // and wait in their first collective for it forever.
  const std::string mine = local.ok() ? std::string() : local.message();
  const int size = topology_.size;
  int my_len = static_cast<int>(mine.size());
  std::vector<int> lens(size);
  if (MPI_Allgather(&my_len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_) != MPI_SUCCESS) {
    return Status::Error(ErrorKind::kMpi, "MPI_Allgather of the init() outcome failed");
  }
  std::vector<int> displs(size);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += lens[r];
  }
  if (total == 0) return Status::OK();
  std::vector<char> text(static_cast<size_t>(total));
  if (MPI_Allgatherv(mine.data(), my_len, MPI_CHAR, text.data(), lens.data(), displs.data(),
                     MPI_CHAR, comm_) != MPI_SUCCESS) {
    return Status::Error(ErrorKind::kMpi, "MPI_Allgatherv of the init() errors failed");
  }
  if (!local.ok()) return local;
  std::string others;
  for (int r = 0; r < size; ++r) {
    if (lens[r] == 0) continue;
    others += (others.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
              std::string(text.data() + displs[r], static_cast<size_t>(lens[r]));
  }
  return Status::InvalidArgument("hvdlite.init() failed on another rank, so it fails here too (" +
                                 others + ")");
}

void Engine::Loop() {
  using Clock = std::chrono::steady_clock;
  const auto cycle = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(options_.cycle_time_ms));
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
      state_cv_.wait_until(lock, next, [this] { return shutdown_requested_ || work_pending_; });
      work_pending_ = false;
    }

    const auto started = Clock::now();
    bool idle = true, waiting = false;
    for (auto& set : sets_.All()) {
      if (!set->is_member()) continue;
      bool set_idle = false;
      if (!RunCycle(*set, set->id() == 0, &set_idle)) return;
      idle = idle && set_idle;
      waiting = waiting || set->controller().waiting();
    }
    idle_rounds = idle ? idle_rounds + 1 : 0;
    const int backoff = std::min(std::max(idle_rounds - kIdleRoundsBeforeBackoff, 0), 3);
    // Tensors this rank announced and others have not: the ranks missing them
    // start a round the moment they submit, and rounds pair up across ranks,
    // so this rank joins the next one now instead of after its cycle time.
    next = waiting ? started : started + cycle * (1 << backoff);
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
  return flush();
}

Status Engine::ChangeProcessSets(ProcessSet& global, const Response& response) {
  TensorEntry entry;
  if (!global.queue().Take(response.name(), &entry)) {
    return Status::Error(ErrorKind::kInternal, "process set request vanished from the queue");
  }
  const std::string row = TimelineRow(entry.request);
  timeline_.End(row, NegotiatePhase(entry.request));
  timeline_.Begin(row, OperationPhase(entry.request));
  if (response.op() == OpType::kAddProcessSet) {
    const std::vector<int32_t>& ranks = response.request.set_ranks;
    const bool member = std::find(ranks.begin(), ranks.end(), topology_.rank) != ranks.end();
    MPI_Comm comm = MPI_COMM_NULL;
    // Blocking, but every rank reaches it at the same point of the same round.
    if (MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, topology_.rank, &comm) != MPI_SUCCESS) {
      Status s = Status::Error(ErrorKind::kMpi, "MPI_Comm_split for a new process set failed");
      timeline_.End(row, OperationPhase(entry.request));
      entry.work->Fail(s);
      return s;
    }
    const int32_t id = sets_.NextId();
    sets_.Add(std::make_shared<ProcessSet>(id, ranks, comm, topology_.OneHost(ranks), options_, &stats_,
                                           &abort_));
    entry.work->value = id;
  } else {
    const int32_t id = response.request.target_set;
    auto removed = sets_.Remove(id);
    if (removed) {
      Status gone = Status::Error(ErrorKind::kShutdown,
                                  "process set " + std::to_string(id) + " was removed");
      for (auto& pending : removed->queue().Close(gone)) pending.work->Fail(gone);
    }
  }
  timeline_.End(row, OperationPhase(entry.request));
  entry.work->Finish();
  return Status::OK();
}

void Engine::Stop(const Status& reason) {
  for (auto& set : sets_.All()) {
    for (auto& entry : set->queue().Close(reason)) entry.work->Fail(reason);
  }
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    stopped_ = true;
    stopped_status_ = reason;
  }
  state_cv_.notify_all();
}

Status Engine::stopped_status() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return stopped_ ? stopped_status_ : Status::OK();
}

void Engine::Shutdown(const std::string& reason) {
  {
    std::unique_lock<std::mutex> lock(state_mutex_);
    if (!stopped_ && !shutdown_requested_) {
      shutdown_requested_ = true;
      shutdown_reason_ = reason;
    }
    state_cv_.notify_all();
    if (!state_cv_.wait_for(lock, std::chrono::duration<double>(kShutdownGraceSeconds),
                            [this] { return stopped_; })) {
      abort_ = true;  // a peer is not answering: stop waiting on MPI
    }
  }
  if (thread_.joinable()) thread_.join();
  timeline_.Stop();
}

Status Engine::ValidateLocally(const EnqueueArgs& args, const ProcessSet& set) const {
  const Request& q = args.request;
  // Built only for an error message: this runs once per submitted tensor.
  auto what = [&q]() {
    return std::string(OpTypeName(q.op)) + (q.name.empty() ? std::string() : " of '" + q.name + "'");
  };
  for (int64_t d : q.shape) {
    if (d < 0) return Status::InvalidArgument(what() + ": negative dimension in shape " + ShapeString(q.shape));
  }
  if (IsReducing(q.op)) {
    if (q.dtype == DataType::kBool) {
      return Status::InvalidArgument(what() + ": bool tensors cannot be reduced; cast to uint8 or int32 first");
    }
    if (!IsValidReduceOp(static_cast<int32_t>(q.reduce_op))) {
      return Status::InvalidArgument(what() + ": unknown reduce op " +
                                     std::to_string(static_cast<int32_t>(q.reduce_op)));
    }
    if (q.reduce_op == ReduceOp::kAdasum) {
      Status s = ValidateAdasum(q, set.size());
      if (!s.ok()) return Status::InvalidArgument(what() + ": " + s.message());
    }
    if (!std::isfinite(q.prescale) || !std::isfinite(q.postscale)) {
      return Status::InvalidArgument(what() + ": prescale_factor and postscale_factor must be finite numbers");
    }
    const auto& c = q.compression;
    if (c.type == CompressionType::kTopK) {
      if (!(c.topk_ratio > 0.0 && c.topk_ratio <= 1.0)) {
        return Status::InvalidArgument(what() + ": top-k ratio must be in (0, 1], got " +
                                       std::to_string(c.topk_ratio));
      }
      if (q.dtype != DataType::kFloat32) {
        return Status::InvalidArgument(what() + ": top-k compression needs float32 tensors, not " +
                                       DataTypeName(q.dtype) +
                                       "; cast to float32 or use Compression.none / fp16");
      }
    }
    if (c.type != CompressionType::kNone && q.reduce_op != ReduceOp::kSum &&
        q.reduce_op != ReduceOp::kAverage) {
      return Status::InvalidArgument(what() + ": compression works with Sum and Average, not " +
                                     ReduceOpName(q.reduce_op));
    }
    const int64_t n = NumElements(q.shape);
    if (c.type != CompressionType::kNone && q.dtype == DataType::kFloat32 && n > INT32_MAX) {
      return Status::InvalidArgument(what() + ": compressed reductions of more than 2^31-1 "
                                     "elements are not supported; use Compression.none");
    }
    if (c.type == CompressionType::kTopK && q.dtype == DataType::kFloat32 &&
        static_cast<double>(std::ceil(c.topk_ratio * static_cast<double>(n))) * 8 > INT32_MAX) {
      // The k (value, index) pairs go out in one allgather whose count is an int.
      return Status::InvalidArgument(what() + ": top-k would put more than 2^31-1 bytes on the "
                                     "wire for this tensor; lower the ratio or split the tensor");
    }
    if ((q.dtype == DataType::kFloat16 || q.dtype == DataType::kBFloat16) && n > INT32_MAX) {
      // 16-bit floats are reduced widened to float32 in one MPI call.
      return Status::InvalidArgument(what() + ": 16-bit float reductions of more than 2^31-1 "
                                     "elements are not supported; split the tensor or use float32");
    }
  }
  const int size = set.size();
  if (q.op == OpType::kBroadcast && (q.root_rank < 0 || q.root_rank >= size)) {
    return Status::InvalidArgument(what() + ": root_rank " + std::to_string(q.root_rank) +
                                   " is out of range; it must be in [0, " + std::to_string(size) + ")");
  }
  const bool needs_rows = q.op == OpType::kAllgather || q.op == OpType::kAlltoall ||
                          q.op == OpType::kReducescatter;
  if (needs_rows && q.shape.empty()) {
    return Status::InvalidArgument(what() + ": needs a tensor with at least one dimension");
  }
  if (q.op == OpType::kAlltoall) {
    if (static_cast<int>(q.splits.size()) != size) {
      return Status::InvalidArgument(what() + ": splits has " + std::to_string(q.splits.size()) +
                                     " entries but there are " + std::to_string(size) +
                                     " ranks; give one count per rank");
    }
    int64_t total = 0;
    for (int64_t x : q.splits) {
      if (x < 0) return Status::InvalidArgument(what() + ": splits must not be negative");
      total += x;
    }
    if (total != q.shape[0]) {
      return Status::InvalidArgument(what() + ": splits sum to " + std::to_string(total) +
                                     " but the first dimension is " + std::to_string(q.shape[0]) +
                                     "; they must be equal");
    }
  }
  if (q.op == OpType::kReducescatter && q.shape[0] < size) {
    return Status::InvalidArgument(what() + ": the first dimension (" + std::to_string(q.shape[0]) +
                                   ") is smaller than the number of ranks (" + std::to_string(size) +
                                   "); every rank must receive at least one row");
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
  if (q.op == OpType::kAlltoall && q.splits.empty() && !q.shape.empty()) {
    // Default: equal parts, which needs a first dimension divisible by size.
    const int64_t size = set->size();
    if (q.shape[0] % size != 0) {
      return Status::InvalidArgument(
          "alltoall: the first dimension (" + std::to_string(q.shape[0]) +
          ") is not divisible by the number of ranks (" + std::to_string(size) +
          "); pass splits= to say how many rows go to each rank");
    }
    q.splits.assign(static_cast<size_t>(size), q.shape[0] / size);
  }
  Status s = ValidateLocally(args, *set);
  if (!s.ok()) return s;
  // Bad input is reported as such even when the engine has stopped.
  s = stopped_status();
  if (!s.ok()) return s;
  if (q.name.empty()) {
    q.name = set->NextAutoName(q.op);
    q.auto_named = true;
  }
  q.rank = set->rank();

  TensorEntry entry;
  entry.request = std::move(q);
  entry.input = args.input;
  entry.output = args.output;
  entry.work = std::make_shared<Work>(entry.request.op, entry.request.name);
  entry.enqueued = std::chrono::steady_clock::now();
  auto work = entry.work;
  s = set->queue().Add(std::move(entry));
  if (!s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(handles_mutex_);
    *handle = next_handle_++;
    handles_[*handle] = std::move(work);
  }
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    wake = !work_pending_;  // later tensors of a burst need no wake-up call
    work_pending_ = true;
  }
  if (wake) state_cv_.notify_all();
  return Status::OK();
}

std::shared_ptr<Work> Engine::FindWork(int64_t handle) {
  std::lock_guard<std::mutex> lock(handles_mutex_);
  auto it = handles_.find(handle);
  return it == handles_.end() ? nullptr : it->second;
}

void Engine::ReleaseWork(int64_t handle) {
  std::lock_guard<std::mutex> lock(handles_mutex_);
  handles_.erase(handle);
}

}  // namespace hvdlite
