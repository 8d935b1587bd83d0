// The handles front ends hold: an integer per enqueued tensor, mapped to its
// Work until the front end releases it. Any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "engine/work.h"

namespace hvdlite {

class HandleTable {
 public:
  int64_t Add(std::shared_ptr<Work> work);
  // nullptr for an unknown or released handle.
  std::shared_ptr<Work> Find(int64_t handle);
  void Release(int64_t handle);

 private:
  std::mutex mutex_;
  std::unordered_map<int64_t, std::shared_ptr<Work>> works_;
  int64_t next_ = 1;
};

}  // namespace hvdlite
