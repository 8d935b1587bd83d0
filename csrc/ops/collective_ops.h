// The collectives other than allreduce, one tensor at a time: allgather,
// broadcast, alltoall and reducescatter (with compression where asked). Each
// takes what negotiation decided (the rows per rank, the splits matrix) from
// the response, allocates results whose size depends on other ranks, and
// runs on the set's wire (the process set's transport).
#pragma once

#include "ops/operation_context.h"
#include "transport/transport.h"

namespace hvdlite {

Status RunAllgather(OperationContext& ctx, Transport& wire, TensorEntry& entry, const Response& response);
Status RunBroadcast(OperationContext& ctx, Transport& wire, TensorEntry& entry);
Status RunAlltoall(OperationContext& ctx, Transport& wire, TensorEntry& entry, const Response& response);
Status RunReducescatter(OperationContext& ctx, Transport& wire, TensorEntry& entry,
                        const Response& response);

}  // namespace hvdlite
