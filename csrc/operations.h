// Turns an agreed Response into work on buffers: copies and scaling around
// the MPI call, output allocation for ops whose size depends on other ranks,
// and completion of each tensor's handle.
#pragma once

#include <vector>

#include "message.h"
#include "process_set.h"
#include "status.h"

namespace hvdlite {

class OperationRunner {
 public:
  // Completes the handle of every tensor named in `response`. A non-OK result
  // means the communicator can no longer be trusted and the engine must stop.
  Status Run(ProcessSet& set, const Response& response);

 private:
  Status Allreduce(ProcessSet& set, TensorEntry& entry);
  Status Allgather(ProcessSet& set, TensorEntry& entry, const Response& response);
  Status Broadcast(ProcessSet& set, TensorEntry& entry);
  Status Alltoall(ProcessSet& set, TensorEntry& entry, const Response& response);
  Status Reducescatter(ProcessSet& set, TensorEntry& entry, const Response& response);

  std::vector<float> widened_;  // float32 scratch for 16-bit float reductions
  std::vector<float> widened_out_;
};

}  // namespace hvdlite
