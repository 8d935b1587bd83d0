// What ranks tell the coordinator (Request) and what it tells them back
// (Response), plus a compact byte encoding for sending both over MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace hvdlite {

struct CompressionSpec {
  CompressionType type = CompressionType::kNone;
  double topk_ratio = 0.0;
  bool error_feedback = false;

  bool operator==(const CompressionSpec& o) const {
    return type == o.type && topk_ratio == o.topk_ratio && error_feedback == o.error_feedback;
  }
  bool operator!=(const CompressionSpec& o) const { return !(*this == o); }
  std::string ToString() const;
};

// The metadata of one tensor submitted by one rank.
struct Request {
  int32_t rank = 0;
  OpType op = OpType::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root_rank = 0;
  std::vector<int64_t> splits;  // alltoall: rows sent to each rank; add_process_set: ranks
  CompressionSpec compression;
};

// One rank's message of a negotiation round.
struct RequestList {
  std::vector<Request> requests;
  bool shutdown = false;
  std::string shutdown_reason;
};

// The coordinator's decision for one tensor (or, later, a fused group).
struct Response {
  enum class Kind : int32_t { kCollective = 0, kError = 1 };
  Kind kind = Kind::kCollective;
  OpType op = OpType::kAllreduce;
  std::vector<std::string> names;
  std::string error;
  DataType dtype = DataType::kFloat32;
  // allgather: first dimension of every rank; alltoall: the size x size
  // matrix of splits (row = sender); reducescatter: rows per rank.
  std::vector<int64_t> sizes;
  // Metadata of the tensor as submitted (by the lowest submitting rank), so a
  // rank that has joined can take part without having submitted it.
  Request tmpl;
  // False when decided while some rank had joined: such a response depends
  // on who joined and must not enter the response cache.
  bool cacheable = true;
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
