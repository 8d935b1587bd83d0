// The collectives other than allreduce, one tensor at a time: allgather,
// broadcast, alltoall and reducescatter (with compression where asked). Each
// takes what negotiation decided (the rows per rank, the splits matrix) from
// the response, allocates results whose size depends on other ranks, and
// runs on the set's wire.
#pragma once

#include "ops/operation_context.h"
#include "process_set/process_set.h"

namespace hvdlite {

Status RunAllgather(OperationContext& ctx, ProcessSet& set, TensorEntry& entry, const Response& response);
Status RunBroadcast(OperationContext& ctx, ProcessSet& set, TensorEntry& entry);
Status RunAlltoall(OperationContext& ctx, ProcessSet& set, TensorEntry& entry, const Response& response);
Status RunReducescatter(OperationContext& ctx, ProcessSet& set, TensorEntry& entry,
                        const Response& response);

}  // namespace hvdlite
