// C API: submitting a tensor (hvd_tensor_request -> the engine's EnqueueArgs).
#include <string>
#include <utility>

#include "api/c_api.h"
#include "api/compression.h"
#include "api/runtime.h"

using hvdlite::DataType;
using hvdlite::ErrorKind;
using hvdlite::OpType;
using hvdlite::ReduceOp;
using hvdlite::Status;
namespace api = hvdlite::api;

namespace {

// The request's own checks; an empty string when it is well-formed.
std::string CheckRequest(const hvd_tensor_request& r) {
  if (r.op < 0 || r.op > HVD_OP_JOIN) return "unknown collective operation code";
  if (!hvdlite::IsValidDataType(r.dtype)) return "unsupported dtype code " + std::to_string(r.dtype);
  if (r.ndim < 0 || (r.ndim > 0 && r.shape == nullptr)) return "invalid shape";
  if (r.nsplits > 0 && r.splits == nullptr) return "splits is NULL with nsplits > 0";
  if (r.nset_ranks > 0 && r.set_ranks == nullptr) return "set_ranks is NULL with nset_ranks > 0";
  if (r.output_bytes < 0) return "output_bytes is negative";
  if (r.output_bytes > 0) {
    if (r.op != HVD_OP_ALLGATHER && r.op != HVD_OP_REDUCESCATTER && r.op != HVD_OP_ALLTOALL) {
      return "output_bytes is for allgather, reducescatter and alltoall";
    }
    if (r.output == nullptr) return "output_bytes without an output";
    if (r.device != 0) return "output_bytes is for host tensors";
  }
  return std::string();
}

Status ToEnqueueArgs(const hvd_tensor_request& r, hvdlite::EnqueueArgs* args) {
  const std::string error = CheckRequest(r);
  if (!error.empty()) return Status::Error(ErrorKind::kInvalidArgument, error);
  auto& q = args->request;
  if (!api::ResolveCompression(r.compression, r.topk_ratio, r.error_feedback, r.compression_config,
                               &q.compression)) {
    return Status::Error(ErrorKind::kInvalidArgument, "unknown compression code");
  }
  q.op = static_cast<OpType>(r.op);
  q.name = r.name ? r.name : "";
  q.dtype = static_cast<DataType>(r.dtype);
  q.shape.assign(r.shape, r.shape + r.ndim);
  // Horovod gathers scalars into a vector of size(): a 0-d tensor is one row.
  // Decided here so that no front door restates it.
  if (q.op == OpType::kAllgather && q.shape.empty()) q.shape.push_back(1);
  q.reduce_op = static_cast<ReduceOp>(r.reduce_op);
  q.prescale = r.prescale;
  q.postscale = r.postscale;
  q.root_rank = r.root_rank;
  if (r.nsplits > 0) q.splits.assign(r.splits, r.splits + r.nsplits);
  if (r.nset_ranks > 0) q.set_ranks.assign(r.set_ranks, r.set_ranks + r.nset_ranks);
  q.members_only = r.members_only != 0;
  if (q.op == OpType::kRemoveProcessSet) q.target_set = r.target_set;
  q.device = r.device != 0;
  args->process_set = r.process_set;
  args->input = r.input;
  args->output = r.output;
  args->output_bytes = r.output_bytes;
  return Status::OK();
}

}  // namespace

extern "C" {

int64_t hvd_enqueue(const hvd_tensor_request* r) {
  auto engine = api::CurrentEngine();
  if (!engine) return -api::LastErrorKind();
  hvdlite::EnqueueArgs args;
  Status s = ToEnqueueArgs(*r, &args);
  if (s.ok()) {
    int64_t handle = 0;
    s = engine->Enqueue(std::move(args), &handle);
    if (s.ok()) return handle;
  }
  return api::SetError(s);
}

int64_t hvd_enqueue_allreduce(const char* name, int32_t dtype, int32_t ndim, const int64_t* shape,
                              const void* input, void* output, int32_t reduce_op, double prescale,
                              double postscale, int32_t compression, double topk_ratio,
                              int32_t error_feedback, int32_t compression_config,
                              int32_t process_set) {
  hvd_tensor_request r{};
  r.op = HVD_OP_ALLREDUCE;
  r.name = name;
  r.dtype = dtype;
  r.ndim = ndim;
  r.shape = shape;
  r.input = input;
  r.output = output;
  r.reduce_op = reduce_op;
  r.prescale = prescale;
  r.postscale = postscale;
  r.compression = compression;
  r.topk_ratio = topk_ratio;
  r.error_feedback = error_feedback;
  r.compression_config = compression_config;
  r.process_set = process_set;
  return hvd_enqueue(&r);
}

}  // extern "C"
