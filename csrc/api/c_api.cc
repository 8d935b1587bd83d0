// C API over the one Engine object of the process.
#include "api/c_api.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "compressors/compressor.h"
#include "engine/engine.h"

using hvdlite::CompressionType;
using hvdlite::DataType;
using hvdlite::Engine;
using hvdlite::ErrorKind;
using hvdlite::OpType;
using hvdlite::ReduceOp;
using hvdlite::Status;

namespace {

// The process's engine. Heap-allocated and never destroyed, so static
// destruction at exit (possibly after MPI_Finalize) never touches MPI.
struct Runtime {
  std::mutex mutex;
  std::shared_ptr<Engine> engine;
  bool shut_down_locally = false;
};

Runtime& runtime() {
  static Runtime* r = new Runtime();
  return *r;
}

std::atomic<bool> g_in_forked_child{false};

// Compressors with options, by id - kConfigBase (hvd_compression_config).
// Process-wide and append-only, outside the engine: ids stay valid across
// shutdown() and init() (elastic restarts), like the front ends that hold them.
constexpr int32_t kConfigBase = 1024;
struct CompressionConfigs {
  std::mutex mutex;
  std::vector<hvdlite::CompressionSpec> specs;
};
CompressionConfigs& compression_configs() {
  static CompressionConfigs* c = new CompressionConfigs();
  return *c;
}

// The spec a request's compression fields name; false for an unknown code or id.
bool ResolveCompression(int32_t code, double topk_ratio, int32_t error_feedback, hvdlite::CompressionSpec* out) {
  if (code >= kConfigBase) {
    CompressionConfigs& c = compression_configs();
    std::lock_guard<std::mutex> lock(c.mutex);
    const size_t index = static_cast<size_t>(code - kConfigBase);
    if (index >= c.specs.size()) return false;
    *out = c.specs[index];
    return true;
  }
  if (!hvdlite::IsValidCompression(code)) return false;
  *out = hvdlite::CompressionSpec();
  out->type = static_cast<CompressionType>(code);
  out->topk_ratio = topk_ratio;
  out->error_feedback = error_feedback != 0;
  return true;
}

thread_local std::string t_last_error;
thread_local int t_last_error_kind = 0;

int SetError(const Status& s) {
  t_last_error = s.message();
  t_last_error_kind = static_cast<int>(s.kind());
  return -static_cast<int>(s.kind());
}

int SetError(ErrorKind kind, const std::string& message) {
  return SetError(Status::Error(kind, message));
}

void OnForkChild() {
  g_in_forked_child = true;
  // The child has no engine thread; keep the object alive forever so nothing
  // tries to join or shut it down from here.
  new std::shared_ptr<Engine>(std::move(runtime().engine));
}

int ForkedChildError() {
  return SetError(ErrorKind::kInvalidArgument,
                  "hvdlite cannot be used in a process forked after hvdlite.init(): the child has "
                  "no engine thread. Use the 'spawn' start method, or call init() before forking "
                  "only in processes that use hvdlite");
}

std::shared_ptr<Engine> CurrentEngine(bool quiet = false) {
  if (g_in_forked_child) {
    if (!quiet) ForkedChildError();
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(runtime().mutex);
  if (!runtime().engine || runtime().shut_down_locally) {
    if (!quiet) {
      SetError(ErrorKind::kNotInitialized,
               runtime().shut_down_locally
                   ? "hvdlite has been shut down on this rank; call hvdlite.init() again first"
                   : "hvdlite is not initialised; call hvdlite.init() first");
    }
    return nullptr;
  }
  return runtime().engine;
}

// Handles stay readable after shutdown, until the next init. In a forked
// child the mutex may have been held by a thread that does not exist there,
// so the child never takes it.
std::shared_ptr<Engine> EngineOfHandles() {
  if (g_in_forked_child) return nullptr;
  std::lock_guard<std::mutex> lock(runtime().mutex);
  return runtime().engine;
}

std::shared_ptr<hvdlite::Work> FindWork(int64_t handle) {
  std::shared_ptr<Engine> engine = EngineOfHandles();
  return engine ? engine->FindWork(handle) : nullptr;
}

int UnknownHandle() {
  if (g_in_forked_child) return ForkedChildError();
  return SetError(ErrorKind::kInvalidArgument, "unknown or released handle");
}

template <typename F>
int WithTopology(F field) {
  auto engine = CurrentEngine();
  return engine ? field(engine->topology()) : -1;
}

}  // namespace

extern "C" {

int hvd_init(int64_t comm_fortran_handle) {
  static std::once_flag fork_handler_once;
  std::call_once(fork_handler_once, [] { pthread_atfork(nullptr, nullptr, OnForkChild); });
  if (g_in_forked_child) {
    return SetError(ErrorKind::kInvalidArgument,
                    "hvdlite.init() in a process forked from an initialised one is not supported");
  }
  std::lock_guard<std::mutex> lock(runtime().mutex);
  if (runtime().engine && !runtime().shut_down_locally) return 0;  // idempotent, as in Horovod
  MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(comm_fortran_handle));
  std::unique_ptr<Engine> engine;
  Status s = Engine::Start(comm, &engine);
  if (!s.ok()) return SetError(s);
  runtime().engine = std::move(engine);
  runtime().shut_down_locally = false;
  return 0;
}

int hvd_shutdown(const char* reason) {
  if (g_in_forked_child) return 0;
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(runtime().mutex);
    if (!runtime().engine || runtime().shut_down_locally) return 0;
    runtime().shut_down_locally = true;
    engine = runtime().engine;
  }
  engine->Shutdown(reason && reason[0] ? reason : "called shutdown()");
  return static_cast<int>(engine->stopped_status().kind());
}

int hvd_is_initialized(void) { return CurrentEngine(/*quiet=*/true) != nullptr; }

const char* hvd_last_error(void) { return t_last_error.c_str(); }
int hvd_last_error_kind(void) { return t_last_error_kind; }

int hvd_rank(void) { return WithTopology([](const auto& t) { return t.rank; }); }
int hvd_size(void) { return WithTopology([](const auto& t) { return t.size; }); }
int hvd_local_rank(void) { return WithTopology([](const auto& t) { return t.local_rank; }); }
int hvd_local_size(void) { return WithTopology([](const auto& t) { return t.local_size; }); }
int hvd_cross_rank(void) { return WithTopology([](const auto& t) { return t.cross_rank; }); }
int hvd_cross_size(void) { return WithTopology([](const auto& t) { return t.cross_size; }); }

int hvd_mpi_threads_supported(void) {
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return 0;
  MPI_Query_thread(&provided);
  return provided >= MPI_THREAD_MULTIPLE;
}

int hvd_mpi_library_version(char* buffer, int length) {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  int n = std::min(len, length - 1);
  std::memcpy(buffer, version, static_cast<size_t>(n));
  buffer[n] = '\0';
  return n;
}

int64_t hvd_enqueue(const hvd_tensor_request* r) {
  auto engine = CurrentEngine();
  if (!engine) return -t_last_error_kind;
  if (r->op < 0 || r->op > static_cast<int>(OpType::kJoin)) {
    return SetError(ErrorKind::kInvalidArgument, "unknown collective operation code");
  }
  if (!hvdlite::IsValidDataType(r->dtype)) {
    return SetError(ErrorKind::kInvalidArgument, "unsupported dtype code " + std::to_string(r->dtype));
  }
  if (r->ndim < 0 || (r->ndim > 0 && r->shape == nullptr)) {
    return SetError(ErrorKind::kInvalidArgument, "invalid shape");
  }
  hvdlite::CompressionSpec compression;
  if (!ResolveCompression(r->compression, r->topk_ratio, r->error_feedback, &compression)) {
    return SetError(ErrorKind::kInvalidArgument, "unknown compression code");
  }
  hvdlite::EnqueueArgs args;
  auto& q = args.request;
  q.op = static_cast<OpType>(r->op);
  q.name = r->name ? r->name : "";
  q.dtype = static_cast<DataType>(r->dtype);
  q.shape.assign(r->shape, r->shape + r->ndim);
  q.reduce_op = static_cast<ReduceOp>(r->reduce_op);
  q.prescale = r->prescale;
  q.postscale = r->postscale;
  q.root_rank = r->root_rank;
  // The C struct's one array means a different thing per operation.
  if (r->splits && r->nsplits > 0) {
    if (q.op == OpType::kAddProcessSet) {
      q.set_ranks.assign(r->splits, r->splits + r->nsplits);
    } else if (q.op == OpType::kRemoveProcessSet) {
      q.target_set = static_cast<int32_t>(r->splits[0]);
    } else {
      q.splits.assign(r->splits, r->splits + r->nsplits);
    }
  }
  q.compression = compression;
  args.process_set = r->process_set;
  q.device = r->device != 0;
  args.input = r->input;
  args.output = r->output;
  int64_t handle = 0;
  Status s = engine->Enqueue(std::move(args), &handle);
  if (!s.ok()) return SetError(s);
  return handle;
}

int64_t hvd_enqueue_allreduce(const char* name, int32_t dtype, int32_t ndim, const int64_t* shape,
                              const void* input, void* output, int32_t reduce_op, double prescale,
                              double postscale, int32_t compression, double topk_ratio,
                              int32_t error_feedback, int32_t process_set) {
  hvd_tensor_request r{};
  r.op = static_cast<int32_t>(OpType::kAllreduce);
  r.name = name;
  r.dtype = dtype;
  r.ndim = ndim;
  r.shape = shape;
  r.input = input;
  r.output = output;
  r.reduce_op = reduce_op;
  r.prescale = prescale;
  r.postscale = postscale;
  r.compression = compression;
  r.topk_ratio = topk_ratio;
  r.error_feedback = error_feedback;
  r.process_set = process_set;
  return hvd_enqueue(&r);
}

int hvd_poll(int64_t handle) {
  auto work = FindWork(handle);
  if (!work) return UnknownHandle();
  return work->IsCompleted() ? 1 : 0;
}

int hvd_wait(int64_t handle, double timeout_seconds) {
  std::shared_ptr<Engine> engine = EngineOfHandles();
  auto work = engine ? engine->FindWork(handle) : nullptr;
  if (!work) return UnknownHandle();
  return engine->Wait(*work, timeout_seconds) ? 1 : 0;
}

int hvd_wait_release(int64_t handle, double timeout_seconds) {
  std::shared_ptr<Engine> engine = EngineOfHandles();
  auto work = engine ? engine->FindWork(handle) : nullptr;
  if (!work) return UnknownHandle();
  if (!engine->Wait(*work, timeout_seconds)) return 0;
  if (!work->status().ok()) return 2;
  engine->ReleaseWork(handle);
  return 1;
}

int hvd_on_completion(int64_t handle, hvd_completion_callback callback, void* arg) {
  auto work = FindWork(handle);
  if (!work) return UnknownHandle();
  if (callback == nullptr) return SetError(ErrorKind::kInvalidArgument, "callback is NULL");
  work->OnCompletion([callback, handle, arg] { callback(handle, arg); });
  return 0;
}

int hvd_handle_error(int64_t handle, char* buffer, int64_t length) {
  auto work = FindWork(handle);
  if (!work) return UnknownHandle();
  Status s = work->status();
  if (buffer && length > 0) {
    size_t n = std::min<size_t>(s.message().size(), static_cast<size_t>(length - 1));
    std::memcpy(buffer, s.message().data(), n);
    buffer[n] = '\0';
  }
  return static_cast<int>(s.kind());
}

int hvd_handle_take_output(int64_t handle, void** data, int64_t* nbytes, int64_t* shape,
                           int32_t max_dims) {
  auto work = FindWork(handle);
  if (!work) return UnknownHandle();
  const int ndim = static_cast<int>(work->output_shape.size());
  if (ndim > max_dims) return SetError(ErrorKind::kInvalidArgument, "too many dimensions");
  std::copy(work->output_shape.begin(), work->output_shape.end(), shape);
  *nbytes = static_cast<int64_t>(work->output.bytes());
  *data = work->output.Release();
  return ndim;
}

int hvd_handle_received_splits(int64_t handle, int64_t* splits, int32_t count) {
  auto work = FindWork(handle);
  if (!work) return UnknownHandle();
  const int n = std::min<int>(count, static_cast<int>(work->received_splits.size()));
  std::copy(work->received_splits.begin(), work->received_splits.begin() + n, splits);
  return static_cast<int>(work->received_splits.size());
}

int64_t hvd_handle_value(int64_t handle) {
  auto work = FindWork(handle);
  return work ? work->value : -1;
}

void hvd_release(int64_t handle) {
  if (g_in_forked_child) return;
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(runtime().mutex);
    engine = runtime().engine;
  }
  if (engine) engine->ReleaseWork(handle);
}

void hvd_free_output(void* data) { hvdlite::FreeAligned(data); }

int hvd_device_enable(const char* backend) {
  auto engine = CurrentEngine();
  if (!engine) return -t_last_error_kind;
  if (backend == nullptr || *backend == '\0') {
    return SetError(ErrorKind::kInvalidArgument, "hvd_device_enable needs a backend name");
  }
  engine->device_jobs().Enable(backend);
  return 0;
}

char* hvd_device_next_job(double timeout_seconds, int* status) {
  auto engine = CurrentEngine();
  if (!engine) {
    *status = -1;
    return nullptr;
  }
  std::string text;
  *status = engine->device_jobs().Next(timeout_seconds, &text);
  if (*status != 1) return nullptr;
  char* out = static_cast<char*>(hvdlite::AllocateAligned(text.size() + 1));
  if (out == nullptr) {
    *status = -1;
    return nullptr;
  }
  std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

int hvd_device_job_done(int64_t job_id, int error_kind, const char* message) {
  auto engine = CurrentEngine();
  if (!engine) return -1;
  const Status s = error_kind == 0 ? Status::OK()
                                   : Status::Error(static_cast<ErrorKind>(error_kind),
                                                   message ? message : "the device collective failed");
  return engine->device_jobs().Finish(job_id, s) ? 0 : -1;
}

int hvd_process_set_ids(int32_t* ids, int32_t capacity) {
  auto engine = CurrentEngine();
  if (!engine) return -1;
  auto all = engine->process_set_ids();
  const int n = std::min<int>(capacity, static_cast<int>(all.size()));
  std::copy(all.begin(), all.begin() + n, ids);
  return static_cast<int>(all.size());
}

int hvd_process_set_ranks(int32_t id, int32_t* ranks, int32_t capacity) {
  auto engine = CurrentEngine();
  if (!engine) return -1;
  auto set = engine->process_set(id);
  if (!set) return SetError(ErrorKind::kInvalidArgument, "no process set with id " + std::to_string(id));
  const auto& r = set->ranks();
  const int n = std::min<int>(capacity, static_cast<int>(r.size()));
  std::copy(r.begin(), r.begin() + n, ranks);
  return static_cast<int>(r.size());
}

int hvd_process_set_rank(int32_t id) {
  auto engine = CurrentEngine();
  if (!engine) return -1;
  auto set = engine->process_set(id);
  if (!set) return SetError(ErrorKind::kInvalidArgument, "no process set with id " + std::to_string(id));
  return set->rank();
}

int hvd_process_set_size(int32_t id) {
  auto engine = CurrentEngine();
  if (!engine) return -1;
  auto set = engine->process_set(id);
  if (!set) return SetError(ErrorKind::kInvalidArgument, "no process set with id " + std::to_string(id));
  return set->size();
}

int hvd_engine_stats(int64_t* values, int32_t capacity) {
  auto engine = CurrentEngine();
  if (!engine) return -1;
  auto& st = engine->stats();
  std::vector<int64_t> all;
#define HVDLITE_STAT_VALUE(name) all.push_back(st.name.load(std::memory_order_relaxed));
  HVDLITE_STATS_FIELDS(HVDLITE_STAT_VALUE)
#undef HVDLITE_STAT_VALUE
  for (int code = 0; code < hvdlite::kMaxCompressionKinds; ++code) {
    if (hvdlite::IsValidCompression(code)) {
      all.push_back(st.wire_bytes[static_cast<size_t>(code)].load(std::memory_order_relaxed));
    }
  }
  const int n = std::min<int>(capacity, static_cast<int>(all.size()));
  std::copy(all.begin(), all.begin() + n, values);
  return static_cast<int>(all.size());
}

const char* hvd_engine_stats_names(void) {
  static const std::string names = [] {
#define HVDLITE_STAT_NAME(name) #name ","
    std::string all = HVDLITE_STATS_FIELDS(HVDLITE_STAT_NAME);
#undef HVDLITE_STAT_NAME
    for (int code = 0; code < hvdlite::kMaxCompressionKinds; ++code) {
      if (hvdlite::IsValidCompression(code)) {
        all += std::string("wire_bytes_") + hvdlite::CompressionName(static_cast<hvdlite::CompressionType>(code)) + ",";
      }
    }
    return all;
  }();
  return names.c_str();
}

int32_t hvd_compression_code(const char* name) { return hvdlite::CompressionCode(name ? name : ""); }

int32_t hvd_compression_config(int32_t kind, double topk_ratio, int32_t error_feedback, double momentum,
                               int64_t warmup_steps, double clip_norm, int32_t rank, int64_t start_iter) {
  if (!hvdlite::IsValidCompression(kind)) return SetError(ErrorKind::kInvalidArgument, "unknown compression code");
  hvdlite::CompressionSpec spec;
  spec.type = static_cast<CompressionType>(kind);
  spec.topk_ratio = topk_ratio;
  spec.error_feedback = error_feedback != 0;
  spec.momentum = momentum;
  spec.warmup_steps = warmup_steps;
  spec.clip_norm = clip_norm;
  spec.rank = rank;
  spec.start_iter = start_iter;
  // The arguments' own checks, on a float32 tensor of one element.
  const std::string error = hvdlite::CheckCompression(spec, OpType::kAllreduce, DataType::kFloat32, 1);
  if (!error.empty()) return SetError(ErrorKind::kInvalidArgument, error);
  CompressionConfigs& c = compression_configs();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (size_t i = 0; i < c.specs.size(); ++i) {
    if (c.specs[i] == spec) return kConfigBase + static_cast<int32_t>(i);
  }
  c.specs.push_back(spec);
  return kConfigBase + static_cast<int32_t>(c.specs.size() - 1);
}

int hvd_reset_compression_state(void) {
  auto engine = CurrentEngine();
  if (!engine) return -t_last_error_kind;
  engine->ResetCompressionState();
  return 0;
}

int hvd_set_compute_threads(int32_t threads) {
  auto engine = CurrentEngine();
  if (!engine) return -t_last_error_kind;
  engine->SetComputeThreads(threads);
  return 0;
}

int hvd_start_timeline(const char* path, int mark_cycles) {
  auto engine = CurrentEngine();
  if (!engine) return -t_last_error_kind;
  Status s = engine->StartTimeline(path ? path : "", mark_cycles != 0);
  return s.ok() ? 0 : SetError(s);
}

int hvd_stop_timeline(void) {
  auto engine = CurrentEngine();
  if (!engine) return -t_last_error_kind;
  engine->StopTimeline();
  return 0;
}

}  // extern "C"
