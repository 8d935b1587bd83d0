// The handles front ends hold: an integer per enqueued tensor, mapped to its
// Work until the front end releases it. Any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/status.h"
#include "engine/work.h"

namespace hvdlite {

class HandleTable {
 public:
  // Handles are unique in the process, not only in this table: a handle of an
  // engine that stopped (shut down, abandoned) is unknown to the next engine,
  // never mistaken for one of its own.
  int64_t Add(std::shared_ptr<Work> work);
  // nullptr for an unknown or released handle.
  std::shared_ptr<Work> Find(int64_t handle);
  void Release(int64_t handle);
  // Fails every work not yet completed with `reason`; returns how many.
  int64_t FailPending(const Status& reason);

 private:
  std::mutex mutex_;
  std::unordered_map<int64_t, std::shared_ptr<Work>> works_;
};

}  // namespace hvdlite
