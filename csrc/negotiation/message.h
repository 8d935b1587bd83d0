// What ranks tell the coordinator (Request) and what it tells them back
// (Response), plus a compact byte encoding for sending both over MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/common.h"

namespace hvdlite {

// A compressor and its arguments; each kind reads the fields it has
// (compressors/registry.h) and leaves the others at their defaults.
struct CompressionSpec {
  CompressionType type = CompressionType::kNone;
  double topk_ratio = 0.0;
  bool error_feedback = false;
  // Top-k's Deep Gradient Compression decorators (0: off): the optimizer's
  // momentum, applied before selection; steps from dense to topk_ratio; the
  // largest L2 norm of a tensor's gradient on one rank.
  double momentum = 0.0;
  int64_t warmup_steps = 0;
  double clip_norm = 0.0;
  // PowerSGD: rank of the approximation, and rounds reduced dense first.
  int32_t rank = 0;
  int64_t start_iter = 0;
  // Quantization: bits per value (4 or 8), values per scale, stochastic
  // rounding (else to nearest) and the seed of its random draws.
  int32_t bits = 0;
  int64_t block_size = 0;
  bool stochastic = false;
  int64_t seed = 0;

  bool operator==(const CompressionSpec& o) const {
    return type == o.type && topk_ratio == o.topk_ratio && error_feedback == o.error_feedback &&
           momentum == o.momentum && warmup_steps == o.warmup_steps && clip_norm == o.clip_norm &&
           rank == o.rank && start_iter == o.start_iter && bits == o.bits && block_size == o.block_size &&
           stochastic == o.stochastic && seed == o.seed;
  }
  bool operator!=(const CompressionSpec& o) const { return !(*this == o); }
  std::string ToString() const;
};

// The metadata of one tensor submitted by one rank. Fields past `compression`
// belong to one kind of operation each.
struct Request {
  int32_t rank = 0;
  OpType op = OpType::kAllreduce;
  std::string name;
  // The engine named it (an unnamed call): names follow a per-kind sequence,
  // are fresh on every call, and so never enter the response cache.
  bool auto_named = false;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root_rank = 0;
  CompressionSpec compression;
  std::vector<int64_t> splits;     // alltoall: rows this rank sends to each member
  std::vector<int32_t> set_ranks;  // add_process_set: the new set's ranks, ascending
  // add_process_set: only the new set's members submit it (torch.distributed
  // creates a group on its members alone); the others learn of the set from
  // the response. Needs a name the members share.
  bool members_only = false;
  int32_t target_set = -1;         // remove_process_set: the id of the set to remove
  // The tensor lives in device memory: the engine agrees on it but a device
  // executor runs the collective (device_jobs.h). All ranks must agree.
  bool device = false;
};

// One rank's message of a negotiation round.
struct RequestList {
  std::vector<Request> requests;
  bool shutdown = false;
  std::string shutdown_reason;
};

// The coordinator's decision for one tensor.
struct Response {
  enum class Kind : int32_t { kCollective = 0, kError = 1 };
  Kind kind = Kind::kCollective;
  // The tensor as submitted (by the lowest submitting rank), so a rank that
  // has joined can take part without having submitted it.
  Request request;
  std::string error;  // kError: why the ranks' requests do not match
  // What the ranks' requests decide, per operation:
  std::vector<int64_t> rows_per_rank;  // allgather, reducescatter: each member's first dimension
  std::vector<int64_t> splits_matrix;  // alltoall: size x size rows, row = sender
  int32_t last_joined_rank = -1;       // join: the rank that joined last
  // False when decided while some rank had joined: such a response depends
  // on who joined and must not enter the response cache.
  bool cacheable = true;
  // Agreed through the response cache's bits this round, not by the
  // coordinator (not serialized: each rank knows; the flight recorder shows it).
  bool from_cache = false;

  const std::string& name() const { return request.name; }
  OpType op() const { return request.op; }
};

struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;
  std::vector<int32_t> shutdown_ranks;
  std::vector<std::string> shutdown_reasons;
  // Cached names whose metadata changed on some rank: every rank drops them.
  std::vector<std::string> invalidated;
  // Set when the stall inspector gives up: every rank stops with this error.
  std::string stall_error;
  // No rank had anything new or in flight this round (not serialized: every
  // rank computes it from the same AND).
  bool idle = false;
};

std::vector<uint8_t> Serialize(const RequestList& list);
RequestList DeserializeRequestList(const uint8_t* data, size_t size);
std::vector<uint8_t> Serialize(const ResponseList& list);
ResponseList DeserializeResponseList(const uint8_t* data, size_t size);

}  // namespace hvdlite
