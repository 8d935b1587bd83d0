// C API: the device-tensor path (ops/device_jobs.h), driven by a front end's
// executor thread.
#include <cstring>
#include <string>

#include "api/c_api.h"
#include "api/runtime.h"

using hvdlite::ErrorKind;
using hvdlite::Status;
namespace api = hvdlite::api;

extern "C" {

int hvd_device_enable(const char* backend) {
  auto engine = api::CurrentEngine();
  if (!engine) return -api::LastErrorKind();
  if (backend == nullptr || *backend == '\0') {
    return api::SetError(ErrorKind::kInvalidArgument, "hvd_device_enable needs a backend name");
  }
  engine->device_jobs().Enable(backend);
  return 0;
}

char* hvd_device_next_job(double timeout_seconds, int* status) {
  auto engine = api::CurrentEngine();
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
  auto engine = api::CurrentEngine();
  if (!engine) return -1;
  const Status s = error_kind == 0 ? Status::OK()
                                   : Status::Error(static_cast<ErrorKind>(error_kind),
                                                   message ? message : "the device collective failed");
  return engine->device_jobs().Finish(job_id, s) ? 0 : -1;
}

}  // extern "C"
