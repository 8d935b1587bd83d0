// C API: starting and stopping the engine, and where this rank stands
// (rank, size, MPI). The other groups of c_api.h's functions live beside
// this file, one concept each: abandon.cc, enqueue.cc, handles.cc,
// device_jobs.cc, process_sets.cc, compression.cc, engine_control.cc.
#include "api/c_api.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>

#include "api/runtime.h"

using hvdlite::Engine;
using hvdlite::ErrorKind;
using hvdlite::Status;
namespace api = hvdlite::api;

namespace {

template <typename F>
int WithTopology(F field) {
  auto engine = api::CurrentEngine();
  return engine ? field(engine->topology()) : -1;
}

}  // namespace

extern "C" {

int hvd_init(int64_t comm_fortran_handle) {
  api::InstallForkHandler();
  if (api::InForkedChild()) {
    return api::SetError(ErrorKind::kInvalidArgument,
                         "hvdlite.init() in a process forked from an initialised one is not supported");
  }
  api::Runtime& rt = api::runtime();
  std::lock_guard<std::timed_mutex> lock(rt.mutex);
  if (rt.engine && !rt.shut_down_locally) return 0;  // idempotent, as in Horovod
  if (rt.stuck) {
    return api::SetError(ErrorKind::kTimeout,
                         rt.abandoned.message() + "; the abandoned engine's thread is stuck in MPI, so no new "
                         "engine can start in this process: restart it");
  }
  MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(comm_fortran_handle));
  std::unique_ptr<Engine> engine;
  Status s = Engine::Start(comm, &engine);
  if (!s.ok()) return api::SetError(s);
  api::InstallEngine(rt, std::move(engine));  // an old engine's handles are unknown from here on
  return 0;
}

int hvd_shutdown(const char* reason) {
  if (api::InForkedChild()) return 0;
  std::shared_ptr<Engine> engine;
  {
    api::Runtime& rt = api::runtime();
    std::lock_guard<std::timed_mutex> lock(rt.mutex);
    if (!rt.engine || rt.shut_down_locally) return 0;
    rt.shut_down_locally = true;
    engine = rt.engine;
  }
  engine->Shutdown(reason && reason[0] ? reason : "called shutdown()");
  return static_cast<int>(engine->stopped_status().kind());
}

int hvd_is_initialized(void) { return api::CurrentEngine(/*quiet=*/true) != nullptr; }

const char* hvd_last_error(void) { return api::LastError(); }
int hvd_last_error_kind(void) { return api::LastErrorKind(); }

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

}  // extern "C"
