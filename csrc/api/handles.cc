// C API: waiting for a handle and reading its outcome.
#include <algorithm>
#include <cstring>
#include <memory>

#include "api/c_api.h"
#include "api/runtime.h"

using hvdlite::Engine;
using hvdlite::ErrorKind;
using hvdlite::Status;
namespace api = hvdlite::api;

extern "C" {

int hvd_poll(int64_t handle) {
  auto work = api::FindWork(handle);
  if (!work) return api::UnknownHandle();
  return work->IsCompleted() ? 1 : 0;
}

int hvd_wait(int64_t handle, double timeout_seconds) {
  std::shared_ptr<Engine> engine = api::EngineOfHandles();
  auto work = engine ? engine->FindWork(handle) : nullptr;
  if (!work) return api::UnknownHandle();
  return engine->Wait(*work, timeout_seconds) ? 1 : 0;
}

int hvd_wait_release(int64_t handle, double timeout_seconds) {
  std::shared_ptr<Engine> engine = api::EngineOfHandles();
  auto work = engine ? engine->FindWork(handle) : nullptr;
  if (!work) return api::UnknownHandle();
  if (!engine->Wait(*work, timeout_seconds)) return 0;
  if (!work->status().ok()) return 2;
  engine->ReleaseWork(handle);
  return 1;
}

int hvd_on_completion(int64_t handle, hvd_completion_callback callback, void* arg) {
  auto work = api::FindWork(handle);
  if (!work) return api::UnknownHandle();
  if (callback == nullptr) return api::SetError(ErrorKind::kInvalidArgument, "callback is NULL");
  work->OnCompletion([callback, handle, arg] { callback(handle, arg); });
  return 0;
}

int hvd_handle_error(int64_t handle, char* buffer, int64_t length) {
  auto work = api::FindWork(handle);
  if (!work) return api::UnknownHandle();
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
  auto work = api::FindWork(handle);
  if (!work) return api::UnknownHandle();
  const int ndim = static_cast<int>(work->output_shape.size());
  if (ndim > max_dims) return api::SetError(ErrorKind::kInvalidArgument, "too many dimensions");
  std::copy(work->output_shape.begin(), work->output_shape.end(), shape);
  *nbytes = static_cast<int64_t>(work->output.bytes());
  *data = work->output.Release();
  return ndim;
}

int hvd_handle_received_splits(int64_t handle, int64_t* splits, int32_t count) {
  auto work = api::FindWork(handle);
  if (!work) return api::UnknownHandle();
  const int n = std::min<int>(count, static_cast<int>(work->received_splits.size()));
  std::copy(work->received_splits.begin(), work->received_splits.begin() + n, splits);
  return static_cast<int>(work->received_splits.size());
}

int64_t hvd_handle_value(int64_t handle) {
  auto work = api::FindWork(handle);
  return work ? work->value : -1;
}

void hvd_release(int64_t handle) {
  std::shared_ptr<Engine> engine = api::EngineOfHandles();
  if (engine) engine->ReleaseWork(handle);
}

void hvd_free_output(void* data) { hvdlite::FreeAligned(data); }

}  // extern "C"
