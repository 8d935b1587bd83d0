// Element-wise allreduces agreed in one round, with one dtype, op and
// compression: planned into buckets (bucket_planner.h), and pipelined, so
// bucket i+1 is packed (or compressed) while bucket i is on the wire, and
// bucket i is unpacked while i+1 is. Tensors at least the direct threshold
// go on the wire from their own buffers, with no copy. Where the set spans
// several hosts with several ranks each, compressed buckets are summed
// exactly inside each host and compressed only between hosts
// (host_compressed_allreduce.h).
#pragma once

#include <vector>

#include "ops/host_compressed_allreduce.h"
#include "ops/operation_context.h"
#include "process_set/process_set.h"

namespace hvdlite {

class AllreducePipeline {
 public:
  explicit AllreducePipeline(OperationContext* ctx) : ctx_(ctx) {}

  // Completes every entry's handle on success; a non-OK result means the
  // wire can no longer be trusted (the caller fails what is left).
  Status Run(ProcessSet& set, const std::vector<TensorEntry*>& entries);

 private:
  struct Bucket;
  // `in_flight`: the previous bucket's wire work, nudged between copies.
  Status Prepare(ProcessSet& set, Bucket& bucket, TransportWork* in_flight);
  Status Start(ProcessSet& set, Bucket& bucket);
  Status Finish(ProcessSet& set, Bucket& bucket, TransportWork* in_flight);
  // A tensor beyond one wire call: scaled in place and reduced in pieces.
  Status RunChunked(ProcessSet& set, TensorEntry& entry);

  OperationContext* ctx_;
  HostCompressedAllreduce across_hosts_;
};

}  // namespace hvdlite
