// Collectives on device tensors. The engine negotiates, checks, caches and
// groups them as it does every tensor, but never touches their memory: it
// hands each agreed group to the device executor (a framework thread that
// runs it with the framework's own collectives: torch.distributed, NCCL on
// GPUs, gloo for CPU tensors in tests) as a DeviceJob, and the executor
// reports it done. Jobs leave in the order the engine agreed them, which is
// the same on every rank of a process set, so the executor's collectives
// pair up across ranks.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "negotiation/message.h"
#include "common/status.h"
#include "engine/tensor_queue.h"
#include "timeline/timeline.h"

namespace hvdlite {

struct DeviceJob {
  int64_t id = 0;
  int32_t process_set = 0;
  int32_t set_rank = 0;
  int32_t set_size = 1;
  // One allreduce group (same dtype, op and compression, up to the fusion
  // threshold) or one tensor of another collective.
  std::vector<TensorEntry> entries;
  Response response;       // what the ranks agreed (rows per rank, alltoall splits)
  std::string activity;    // timeline: "<BACKEND>_<OP>", e.g. NCCL_ALLREDUCE
};

class DeviceJobQueue {
 public:
  explicit DeviceJobQueue(Timeline* timeline) : timeline_(timeline) {}

  // A device executor runs `backend` ("nccl", "gloo"); until then device
  // tensors are refused at enqueue.
  void Enable(const std::string& backend);
  bool enabled();

  // The engine thread hands over an agreed job; fails it at once if closed.
  void Push(DeviceJob job);
  // The executor takes the next job as JSON text (see Describe): 1 with
  // *text, 0 when none came within the timeout, -1 once closed.
  int Next(double timeout_seconds, std::string* text);
  // The executor finished job `id`: completes its tensors' handles.
  // Returns false for an unknown id (already failed by Close).
  bool Finish(int64_t id, const Status& status);
  // The engine stopped: every job not finished fails with `reason`, and
  // Next returns -1 from now on.
  void Close(const Status& reason);

  // The job as the executor reads it: {"id", "op", "process_set",
  // "set_rank", "set_size", "reduce_op", "root", "compression",
  // "topk_ratio", "error_feedback", "rows", "splits", "entries": [{"token",
  // "name", "dtype", "shape", "prescale", "postscale"}]} (an allreduce job's
  // tensors may differ in their factors). "token" is the
  // address the front end passed as input (its own key for the tensor; 0 for
  // the zeros of a rank that has joined).
  static std::string Describe(const DeviceJob& job);

 private:
  void Complete(DeviceJob& job, const Status& status);

  Timeline* timeline_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string backend_;
  bool closed_ = false;
  Status closed_reason_;
  int64_t next_id_ = 1;
  std::deque<DeviceJob> waiting_;
  std::map<int64_t, DeviceJob> running_;
};

}  // namespace hvdlite
