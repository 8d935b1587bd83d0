#include "api/runtime.h"

#include <pthread.h>

#include <atomic>
#include <utility>

namespace hvdlite {
namespace api {
namespace {

std::atomic<bool> g_in_forked_child{false};
thread_local std::string t_last_error;
thread_local int t_last_error_kind = 0;

void OnForkChild() {
  g_in_forked_child = true;
  // The child has no engine thread; keep the object alive forever so nothing
  // tries to join or shut it down from here.
  new std::shared_ptr<Engine>(std::move(runtime().engine));
}

}  // namespace

Runtime& runtime() {
  static Runtime* r = new Runtime();
  return *r;
}

void InstallEngine(Runtime& rt, std::unique_ptr<Engine> engine) {
  if (!rt.abandoned.ok()) rt.abandoned_engines.push_back(std::move(rt.engine));
  rt.engine = std::move(engine);
  rt.shut_down_locally = false;
  rt.abandoned = Status::OK();
  rt.stuck = false;
}

void InstallForkHandler() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, OnForkChild); });
}

bool InForkedChild() { return g_in_forked_child; }

int ForkedChildError() {
  return SetError(ErrorKind::kInvalidArgument,
                  "hvdlite cannot be used in a process forked after hvdlite.init(): the child has "
                  "no engine thread. Use the 'spawn' start method, or call init() before forking "
                  "only in processes that use hvdlite");
}

int SetError(const Status& s) {
  t_last_error = s.message();
  t_last_error_kind = static_cast<int>(s.kind());
  return -static_cast<int>(s.kind());
}

int SetError(ErrorKind kind, const std::string& message) {
  return SetError(Status::Error(kind, message));
}

const char* LastError() { return t_last_error.c_str(); }
int LastErrorKind() { return t_last_error_kind; }

std::shared_ptr<Engine> CurrentEngine(bool quiet) {
  if (g_in_forked_child) {
    if (!quiet) ForkedChildError();
    return nullptr;
  }
  Runtime& rt = runtime();
  std::lock_guard<std::timed_mutex> lock(rt.mutex);
  if (!rt.engine || rt.shut_down_locally) {
    if (quiet) return nullptr;
    if (!rt.abandoned.ok()) {
      // The training thread's next call says that a peer was lost, as its
      // pending ones did, and what to do.
      SetError(rt.abandoned.kind(),
               rt.abandoned.message() + (rt.stuck ? "; its engine thread is stuck in MPI: restart this process"
                                                  : "; start a new engine with hvdlite.init(comm=...)"));
    } else {
      SetError(ErrorKind::kNotInitialized,
               rt.shut_down_locally ? "hvdlite has been shut down on this rank; call hvdlite.init() again first"
                                    : "hvdlite is not initialised; call hvdlite.init() first");
    }
    return nullptr;
  }
  return rt.engine;
}

// In a forked child the mutex may have been held by a thread that does not
// exist there, so the child never takes it.
std::shared_ptr<Engine> EngineOfHandles() {
  if (g_in_forked_child) return nullptr;
  std::lock_guard<std::timed_mutex> lock(runtime().mutex);
  return runtime().engine;
}

std::shared_ptr<Work> FindWork(int64_t handle) {
  std::shared_ptr<Engine> engine = EngineOfHandles();
  return engine ? engine->FindWork(handle) : nullptr;
}

int UnknownHandle() {
  if (g_in_forked_child) return ForkedChildError();
  return SetError(ErrorKind::kInvalidArgument, "unknown or released handle");
}

}  // namespace api
}  // namespace hvdlite
