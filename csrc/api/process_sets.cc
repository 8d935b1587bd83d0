// C API: the registered process sets and this rank's place in them.
#include <algorithm>
#include <memory>
#include <string>

#include "api/c_api.h"
#include "api/runtime.h"

using hvdlite::ErrorKind;
namespace api = hvdlite::api;

namespace {

// The set with `id`, or nullptr with the error recorded.
std::shared_ptr<hvdlite::ProcessSet> FindSet(int32_t id) {
  auto engine = api::CurrentEngine();
  if (!engine) return nullptr;
  auto set = engine->process_set(id);
  if (!set) api::SetError(ErrorKind::kInvalidArgument, "no process set with id " + std::to_string(id));
  return set;
}

}  // namespace

extern "C" {

int hvd_process_set_ids(int32_t* ids, int32_t capacity) {
  auto engine = api::CurrentEngine();
  if (!engine) return -1;
  auto all = engine->process_set_ids();
  const int n = std::min<int>(capacity, static_cast<int>(all.size()));
  std::copy(all.begin(), all.begin() + n, ids);
  return static_cast<int>(all.size());
}

int hvd_process_set_ranks(int32_t id, int32_t* ranks, int32_t capacity) {
  auto set = FindSet(id);
  if (!set) return -1;
  const auto& r = set->ranks();
  const int n = std::min<int>(capacity, static_cast<int>(r.size()));
  std::copy(r.begin(), r.begin() + n, ranks);
  return static_cast<int>(r.size());
}

int hvd_process_set_rank(int32_t id) {
  auto set = FindSet(id);
  return set ? set->rank() : -1;
}

int hvd_process_set_size(int32_t id) {
  auto set = FindSet(id);
  return set ? set->size() : -1;
}

}  // extern "C"
