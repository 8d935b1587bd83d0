// The async handle behind every enqueued collective: completed once by the
// engine thread (success or error), waited on by any number of user threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/common.h"
#include "common/status.h"

namespace hvdlite {

// A result buffer the engine allocates when the output size is only known
// after negotiation (allgather, alltoall, reducescatter). 64-byte aligned so
// frameworks can wrap it without a copy (TF requires it).
class OutputBuffer {
 public:
  OutputBuffer() = default;
  ~OutputBuffer();
  OutputBuffer(const OutputBuffer&) = delete;
  OutputBuffer& operator=(const OutputBuffer&) = delete;

  // Returns false when memory could not be allocated.
  bool Allocate(size_t bytes);
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // Hands the memory to the caller, who frees it with FreeOutput().
  void* Release();

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

void* AllocateAligned(size_t bytes);
void FreeAligned(void* p);

class Work {
 public:
  Work(OpType op, std::string name) : op_(op), name_(std::move(name)) {}

  bool IsCompleted();
  // Blocks until completed or until timeout_seconds passes (< 0: forever).
  // Returns whether it completed.
  bool Wait(double timeout_seconds);
  Status status();

  void Finish();
  void Fail(const Status& status);
  // Runs `listener` once when the work completes: on the completing (engine)
  // thread, or at once on this thread if it has completed already. Listeners
  // must be quick and must not call into the engine (they hand the news to
  // a thread of their own).
  void OnCompletion(std::function<void()> listener);

  OpType op() const { return op_; }
  const std::string& name() const { return name_; }

  // Results, written by the engine thread before Finish().
  OutputBuffer output;
  std::vector<int64_t> output_shape;
  std::vector<int64_t> received_splits;
  int64_t value = 0;  // e.g. the id of a new process set

 private:
  void Complete(const Status& status);

  OpType op_;
  std::string name_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool completed_ = false;
  Status status_;
  std::vector<std::function<void()>> listeners_;
};

}  // namespace hvdlite
