// Adasum allreduces agreed in one round, of one dtype: planned into buckets
// up to the fusion threshold (bucket_planner.h), each one AdasumReducer run
// over the set's wire (never shared memory's sum: Adasum is not element-wise).
// 16-bit floats are combined in float32 and rounded once at the end.
#pragma once

#include <vector>

#include "adasum/adasum_reducer.h"
#include "ops/operation_context.h"
#include "process_set/process_set.h"

namespace hvdlite {

class AdasumOperation {
 public:
  explicit AdasumOperation(OperationContext* ctx) : ctx_(ctx) {}

  // Completes every entry's handle on success; non-OK: the wire failed.
  Status Run(ProcessSet& set, const std::vector<TensorEntry*>& entries);

 private:
  Status RunBucket(ProcessSet& set, const std::vector<TensorEntry*>& bucket);

  OperationContext* ctx_;
  AdasumReducer reducer_;
};

}  // namespace hvdlite
