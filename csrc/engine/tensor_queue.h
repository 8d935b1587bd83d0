// Tensors submitted by framework threads and not yet completed, keyed by
// name. The engine thread drains the new requests each cycle and takes
// entries out when the coordinator says they are ready everywhere.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "negotiation/message.h"
#include "common/status.h"
#include "engine/work.h"

namespace hvdlite {

struct TensorEntry {
  Request request;
  const void* input = nullptr;
  void* output = nullptr;  // caller-owned for allreduce and broadcast
  int64_t output_bytes = 0;  // a caller-owned output of another op (EnqueueArgs)
  std::shared_ptr<Work> work;
  std::chrono::steady_clock::time_point enqueued;
};

class TensorQueue {
 public:
  // Fails if a tensor of that name is still in flight or the queue is closed.
  Status Add(TensorEntry entry);
  std::vector<Request> PopNewRequests();
  // Removes and returns the entry; false if there is none of that name.
  bool Take(const std::string& name, TensorEntry* out);
  // Closes the queue to new work and returns everything still in it.
  std::vector<TensorEntry> Close(const Status& reason);
  size_t InFlight();

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, TensorEntry> entries_;
  std::vector<std::string> new_names_;  // submitted since the last PopNewRequests
  bool closed_ = false;
  Status closed_reason_;
};

}  // namespace hvdlite
