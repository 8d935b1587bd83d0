// The process's one engine as the C API sees it, and the C API's error
// reporting (hvd_last_error). Shared by the api/*.cc files, each of which
// implements one group of c_api.h's functions.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"

namespace hvdlite {
namespace api {

// Heap-allocated and never destroyed, so static destruction at exit
// (possibly after MPI_Finalize) never touches MPI.
struct Runtime {
  // Timed: hvd_abandon() gives up on it when an init() or shutdown() stuck
  // in MPI holds it.
  std::timed_mutex mutex;
  std::shared_ptr<Engine> engine;
  bool shut_down_locally = false;
  // After hvd_abandon(): the error every call gets until the next init.
  Status abandoned;
  // Its engine thread did not stop in time: no new engine in this process.
  bool stuck = false;
  // Abandoned engines, kept until exit (Engine::Abandon says why).
  std::vector<std::shared_ptr<Engine>> abandoned_engines;
};
Runtime& runtime();
// hvd_init's last step, with rt.mutex held: `engine` becomes the running
// one. An abandoned engine it replaces is kept (Engine::Abandon says why).
void InstallEngine(Runtime& rt, std::unique_ptr<Engine> engine);

// A child forked after init() has no engine thread: every call fails there.
void InstallForkHandler();
bool InForkedChild();
int ForkedChildError();

// Record the error for hvd_last_error(); return the negated ErrorKind.
int SetError(const Status& s);
int SetError(ErrorKind kind, const std::string& message);
const char* LastError();
int LastErrorKind();

// The running engine, or nullptr with the reason recorded (unless quiet):
// after hvd_abandon(), the abandonment's error.
std::shared_ptr<Engine> CurrentEngine(bool quiet = false);
// Handles stay readable after shutdown, until the next init.
std::shared_ptr<Engine> EngineOfHandles();
std::shared_ptr<Work> FindWork(int64_t handle);
int UnknownHandle();

}  // namespace api
}  // namespace hvdlite
