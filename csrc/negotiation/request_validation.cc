#include "negotiation/request_validation.h"

#include <climits>
#include <cmath>
#include <string>

#include "adasum/adasum_reducer.h"
#include "compressors/compressor.h"
#include "negotiation/op_rules.h"

namespace hvdlite {

namespace {

using Rule = Status (*)(const Request& q, int set_size);

Status Fail(const std::string& why) { return Status::InvalidArgument(why); }

Status NonNegativeShape(const Request& q, int) {
  for (int64_t d : q.shape) {
    if (d < 0) return Fail("negative dimension in shape " + ShapeString(q.shape));
  }
  return Status::OK();
}

Status ReduceArguments(const Request& q, int) {
  if (q.dtype == DataType::kBool) return Fail("bool tensors cannot be reduced; cast to uint8 or int32 first");
  if (!IsValidReduceOp(static_cast<int32_t>(q.reduce_op))) {
    return Fail("unknown reduce op " + std::to_string(static_cast<int32_t>(q.reduce_op)));
  }
  if (!std::isfinite(q.prescale) || !std::isfinite(q.postscale)) {
    return Fail("prescale_factor and postscale_factor must be finite numbers");
  }
  return Status::OK();
}

// What Adasum (adasum/adasum_reducer.h) can reduce, with Horovod's limits.
Status Adasum(const Request& q, int set_size) {
  if (q.reduce_op != ReduceOp::kAdasum) return Status::OK();
  if (q.device) {
    return Fail("op=Adasum runs on host memory; the front end copies device tensors to the host for "
                "it (submit a host tensor)");
  }
  if (q.op != OpType::kAllreduce) {
    return Fail("op=Adasum works only with allreduce (Horovod's reducescatter refuses it too); use Sum "
                "or Average");
  }
  if (!IsFloatingPoint(q.dtype)) {
    return Fail(std::string("op=Adasum needs floating-point tensors (float16, bfloat16, float32, "
                            "float64), not ") + DataTypeName(q.dtype) + "; cast to float32 first");
  }
  if (q.compression.type != CompressionType::kNone) {
    return Fail(std::string("op=Adasum cannot be combined with ") + CompressionName(q.compression.type) +
                " compression: its dot products need the gradients as they are; use Compression.none");
  }
  if (!AdasumSupportsSize(set_size)) {
    return Fail("op=Adasum needs a power-of-2 number of ranks (1, 2, 4, 8, ...), but the process set "
                "has " + std::to_string(set_size) + "; Horovod has the same limit. Run on a power-of-2 "
                "number of ranks (or reduce over a process set of that size), or use op=Average");
  }
  return Status::OK();
}

Status Compression(const Request& q, int) {
  const auto& c = q.compression;
  const std::string error = CheckCompression(c, q.op, q.dtype, NumElements(q.shape));
  if (!error.empty()) return Fail(error);
  if (c.type != CompressionType::kNone && q.reduce_op != ReduceOp::kSum &&
      q.reduce_op != ReduceOp::kAverage) {
    return Fail(std::string("compression works with Sum and Average, not ") + ReduceOpName(q.reduce_op));
  }
  return Status::OK();
}

// Limits of one wire call (an int count) where the engine cannot split.
Status WireLimits(const Request& q, int) {
  const int64_t n = NumElements(q.shape);
  const auto& c = q.compression;
  if (c.type != CompressionType::kNone && q.dtype == DataType::kFloat32 && n > INT32_MAX) {
    return Fail("compressed reductions of more than 2^31-1 elements are not supported; use "
                "Compression.none");
  }
  if ((q.dtype == DataType::kFloat16 || q.dtype == DataType::kBFloat16) && n > INT32_MAX) {
    // 16-bit floats are reduced widened to float32 in one call.
    return Fail("16-bit float reductions of more than 2^31-1 elements are not supported; split the "
                "tensor or use float32");
  }
  return Status::OK();
}

Status Root(const Request& q, int set_size) {
  if (q.root_rank < 0 || q.root_rank >= set_size) {
    return Fail("root_rank " + std::to_string(q.root_rank) + " is out of range; it must be in [0, " +
                std::to_string(set_size) + ")");
  }
  return Status::OK();
}

Status Rows(const Request& q, int set_size) {
  if (q.shape.empty()) return Fail("needs a tensor with at least one dimension");
  if (q.op == OpType::kReducescatter && q.shape[0] < set_size) {
    return Fail("the first dimension (" + std::to_string(q.shape[0]) +
                ") is smaller than the number of ranks (" + std::to_string(set_size) +
                "); every rank must receive at least one row");
  }
  return Status::OK();
}

Status Splits(const Request& q, int set_size) {
  if (static_cast<int>(q.splits.size()) != set_size) {
    return Fail("splits has " + std::to_string(q.splits.size()) + " entries but there are " +
                std::to_string(set_size) + " ranks; give one count per rank");
  }
  int64_t total = 0;
  for (int64_t x : q.splits) {
    if (x < 0) return Fail("splits must not be negative");
    total += x;
  }
  if (total != q.shape[0]) {
    return Fail("splits sum to " + std::to_string(total) + " but the first dimension is " +
                std::to_string(q.shape[0]) + "; they must be equal");
  }
  return Status::OK();
}

// add_process_set: the new set's ranks (the coordinator and the engine index
// by them); members_only belongs to it alone.
Status SetRanks(const Request& q, int set_size) {
  if (q.op != OpType::kAddProcessSet) {
    return q.members_only ? Fail("members_only applies to add_process_set only") : Status::OK();
  }
  if (q.set_ranks.empty()) return Fail("the new process set has no ranks");
  for (size_t i = 0; i < q.set_ranks.size(); ++i) {
    const int32_t r = q.set_ranks[i];
    if (r < 0 || r >= set_size) {
      return Fail("rank " + std::to_string(r) + " of the new process set is out of range; ranks are in [0, " +
                  std::to_string(set_size) + ")");
    }
    if (i > 0 && r <= q.set_ranks[i - 1]) return Fail("the new process set's ranks must be ascending and distinct");
  }
  return Status::OK();
}

struct Check {
  bool OpRules::*applies;  // nullptr: every operation
  Rule rule;
};

// In order: a later rule may rely on an earlier one (Splits on Rows).
const Check kChecks[] = {
    {nullptr, NonNegativeShape},      {&OpRules::reduces, ReduceArguments},
    {&OpRules::reduces, Adasum},      {&OpRules::reduces, Compression},
    {&OpRules::reduces, WireLimits},  {&OpRules::has_root, Root},
    {&OpRules::needs_rows, Rows},     {&OpRules::has_splits, Splits},
    {nullptr, SetRanks},
};

}  // namespace

Status CompleteRequest(Request* q, int set_size) {
  if (q->op == OpType::kAlltoall && q->splits.empty() && !q->shape.empty()) {
    // Default: equal parts, which needs a first dimension divisible by size.
    if (q->shape[0] % set_size != 0) {
      return Fail("alltoall: the first dimension (" + std::to_string(q->shape[0]) +
                  ") is not divisible by the number of ranks (" + std::to_string(set_size) +
                  "); pass splits= to say how many rows go to each rank");
    }
    q->splits.assign(static_cast<size_t>(set_size), q->shape[0] / set_size);
  }
  return Status::OK();
}

Status ValidateRequest(const Request& q, int set_size) {
  const OpRules& rules = RulesFor(q.op);
  for (const Check& check : kChecks) {
    if (check.applies != nullptr && !(rules.*check.applies)) continue;
    Status s = check.rule(q, set_size);
    if (!s.ok()) {
      return Status::InvalidArgument(std::string(OpTypeName(q.op)) +
                                     (q.name.empty() ? std::string() : " of '" + q.name + "'") + ": " +
                                     s.message());
    }
  }
  return Status::OK();
}

}  // namespace hvdlite
