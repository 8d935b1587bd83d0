#include "engine/handle_table.h"

#include <atomic>
#include <vector>

namespace hvdlite {

namespace {

std::atomic<int64_t> g_next_handle{1};

}  // namespace

int64_t HandleTable::Add(std::shared_ptr<Work> work) {
  const int64_t handle = g_next_handle.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mutex_);
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

int64_t HandleTable::FailPending(const Status& reason) {
  std::vector<std::shared_ptr<Work>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& kv : works_) {
      if (!kv.second->IsCompleted()) pending.push_back(kv.second);
    }
  }
  // Outside the lock: completing runs the works' listeners.
  for (auto& work : pending) work->Fail(reason);
  return static_cast<int64_t>(pending.size());
}

}  // namespace hvdlite
