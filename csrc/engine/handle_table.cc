#include "engine/handle_table.h"

namespace hvdlite {

int64_t HandleTable::Add(std::shared_ptr<Work> work) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t handle = next_++;
  works_[handle] = std::move(work);
  return handle;
}

std::shared_ptr<Work> HandleTable::Find(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = works_.find(handle);
  return it == works_.end() ? nullptr : it->second;
}

void HandleTable::Release(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  works_.erase(handle);
}

}  // namespace hvdlite
