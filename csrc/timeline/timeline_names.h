// What the engine calls rows and phases on the timeline (timeline.h). They
// follow the layout of Horovod's timeline, so tools written for its files
// read hvdlite's: a row per tensor labelled "<op>.<name>"; on it the
// negotiation (NEGOTIATE_<OP>), then one span per operation named after it
// (ALLREDUCE, ADASUM, ALLGATHER, ..., ERROR) in which the activities nest
// (QUEUE, MEMCPY_IN_FUSION_BUFFER, MPI_ALLREDUCE, ...).
#pragma once

#include <string>

#include "negotiation/message.h"

namespace hvdlite {

// "allreduce.grad_w" for a tensor named "grad_w", as Horovod's front ends
// name tensors; the engine's own names for unnamed tensors already carry the
// op ("allreduce.noname.3") and are kept.
std::string TimelineRow(const Request& q);

// "NEGOTIATE_ALLREDUCE", "NEGOTIATE_ADASUM", "NEGOTIATE_ALLGATHER", ...
const char* NegotiatePhase(const Request& q);

// The operation's span: "ALLREDUCE", "ADASUM", "ALLGATHER", "BROADCAST", ...
const char* OperationPhase(const Request& q);

// The span of a tensor the coordinator refused (mismatched ranks).
constexpr char kErrorPhase[] = "ERROR";

// Activities inside an operation's span. Steps Horovod also has carry its
// names; hvdlite's own (shared memory, compression) have names of their own.
namespace activity {
constexpr char kQueue[] = "QUEUE";  // agreed; waiting for its turn on the wire
constexpr char kMemcpyInFusionBuffer[] = "MEMCPY_IN_FUSION_BUFFER";
constexpr char kMemcpyOutFusionBuffer[] = "MEMCPY_OUT_FUSION_BUFFER";
constexpr char kMpiAllreduce[] = "MPI_ALLREDUCE";
constexpr char kMpiAllgather[] = "MPI_ALLGATHER";  // also top-k compression's wire
constexpr char kMpiBcast[] = "MPI_BCAST";
constexpr char kMpiAlltoall[] = "MPI_ALLTOALL";
constexpr char kMpiReducescatter[] = "MPI_REDUCESCATTER";
constexpr char kMpiAdasumAllreduce[] = "MPI_ADASUM_ALLREDUCE";
constexpr char kShmAllreduce[] = "SHM_ALLREDUCE";  // one host: the sum through shared memory
constexpr char kCompress[] = "COMPRESS";           // fp16 conversion or top-k selection
constexpr char kDecompress[] = "DECOMPRESS";
}  // namespace activity

}  // namespace hvdlite
