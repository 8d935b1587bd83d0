// C API: hvd_abandon, the local stop of the recovery from a lost peer
// (Engine::Abandon). The runtime then refuses every call with the
// abandonment's error until hvd_init starts a new engine; the abandoned one
// is kept (its handles stay readable until then, its memory until exit).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "api/c_api.h"
#include "api/runtime.h"

using hvdlite::Engine;
using hvdlite::ErrorKind;
using hvdlite::Status;
namespace api = hvdlite::api;

namespace {

// As Engine::Abandon reads its grace: not negative, not endless.
std::chrono::duration<double> Grace(double seconds) {
  return std::chrono::duration<double>(seconds > 0 ? std::min(seconds, 1e7) : 0.0);
}

// The engine to abandon (nullptr: none runs), marked abandoned in the
// runtime; or an error when another call holds the runtime past the grace.
Status TakeEngine(const std::string& reason, double grace_seconds, std::shared_ptr<Engine>* out) {
  api::Runtime& rt = api::runtime();
  std::unique_lock<std::timed_mutex> lock(rt.mutex, std::defer_lock);
  if (!lock.try_lock_for(Grace(grace_seconds))) {
    // Only init() and shutdown() hold it for long: in a collective of their
    // own that the lost peer never joins.
    char grace[32];
    std::snprintf(grace, sizeof(grace), "%g", grace_seconds);
    return Status::Error(ErrorKind::kTimeout,
                         "hvdlite.abandon(): hvdlite.init() or shutdown() has been waiting in MPI for more "
                         "than " + std::string(grace) + " s (for the lost peer, most likely) and cannot be "
                         "interrupted; this process must be restarted");
  }
  if (!rt.engine) return Status::OK();
  if (rt.abandoned.ok()) rt.abandoned = Engine::AbandonedError(reason);  // the first reason stays
  rt.shut_down_locally = true;
  *out = rt.engine;
  return Status::OK();
}

}  // namespace

extern "C" {

int hvd_abandon(const char* reason, double grace_seconds) {
  if (api::InForkedChild()) return 0;  // no engine thread there
  const std::string why = reason && reason[0] ? reason : "no reason given";
  std::shared_ptr<Engine> engine;
  Status s = TakeEngine(why, grace_seconds, &engine);
  if (!s.ok()) return api::SetError(s);
  if (!engine) return 0;
  s = engine->Abandon(why, grace_seconds);
  {
    api::Runtime& rt = api::runtime();
    std::lock_guard<std::timed_mutex> lock(rt.mutex);
    // A later call may find the thread stopped after all.
    if (rt.engine == engine) rt.stuck = !s.ok();
  }
  return s.ok() ? 0 : api::SetError(s);
}

}  // extern "C"
