// Checks of csrc/negotiation/request_validation.h: every rule, on the operations its
// rules row (op_rules.h) names and only there, with the message the user
// sees; alltoall's default splits.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "check.h"
#include "negotiation/request_validation.h"

using namespace hvdlite;

namespace {

Request Q(OpType op, std::vector<int64_t> shape = {4, 3}) {
  Request q;
  q.op = op;
  q.name = "t";
  q.shape = std::move(shape);
  if (op == OpType::kAlltoall) q.splits = {2, 2};
  return q;
}

bool Says(const Status& s, const std::string& words) {
  return !s.ok() && s.kind() == ErrorKind::kInvalidArgument && s.message().find(words) != std::string::npos;
}

struct Case {
  OpType op;
  std::function<void(Request&)> change;
  const char* words;  // nullptr: valid
};

void TestRules() {
  const OpType kAll[] = {OpType::kAllreduce, OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall,
                         OpType::kReducescatter, OpType::kBarrier, OpType::kJoin};
  for (OpType op : kAll) {
    Status s = ValidateRequest(Q(op), 2);
    CHECK(s.ok(), "a plain %s is valid: %s", OpTypeName(op), s.message().c_str());
  }
  const std::vector<Case> cases = {
      {OpType::kAllgather, [](Request& q) { q.shape = {2, -1}; }, "allgather of 't': negative dimension"},
      {OpType::kAllreduce, [](Request& q) { q.dtype = DataType::kBool; }, "bool tensors cannot be reduced"},
      {OpType::kAllgather, [](Request& q) { q.dtype = DataType::kBool; }, nullptr},
      {OpType::kAllreduce, [](Request& q) { q.reduce_op = static_cast<ReduceOp>(42); }, "unknown reduce op 42"},
      {OpType::kReducescatter, [](Request& q) { q.prescale = std::nan(""); }, "must be finite"},
      {OpType::kBroadcast, [](Request& q) { q.prescale = std::nan(""); }, nullptr},  // not a reduction
      {OpType::kAllreduce, [](Request& q) { q.reduce_op = ReduceOp::kAdasum; q.dtype = DataType::kInt32; },
       "op=Adasum needs floating-point tensors"},
      {OpType::kReducescatter, [](Request& q) { q.reduce_op = ReduceOp::kAdasum; },
       "op=Adasum works only with allreduce"},
      {OpType::kAllreduce, [](Request& q) {
         q.compression.type = CompressionType::kTopK;
         q.compression.topk_ratio = 1.5;
       }, "top-k ratio must be in (0, 1]"},
      {OpType::kAllreduce, [](Request& q) {
         q.compression.type = CompressionType::kFP16;
         q.reduce_op = ReduceOp::kMax;
       }, "compression works with Sum and Average, not Max"},
      {OpType::kAllreduce, [](Request& q) {
         q.dtype = DataType::kFloat16;
         q.shape = {int64_t{1} << 32};
       }, "16-bit float reductions of more than 2^31-1"},
      {OpType::kBroadcast, [](Request& q) { q.root_rank = 2; }, "root_rank 2 is out of range"},
      {OpType::kAllreduce, [](Request& q) { q.root_rank = 7; }, nullptr},  // no root
      {OpType::kAllgather, [](Request& q) { q.shape = {}; }, "needs a tensor with at least one dimension"},
      {OpType::kAllreduce, [](Request& q) { q.shape = {}; }, nullptr},  // 0-d allreduce
      {OpType::kReducescatter, [](Request& q) { q.shape = {1, 3}; }, "smaller than the number of ranks"},
      {OpType::kAlltoall, [](Request& q) { q.splits = {4}; }, "splits has 1 entries but there are 2 ranks"},
      {OpType::kAlltoall, [](Request& q) { q.splits = {5, -1}; }, "splits must not be negative"},
      {OpType::kAlltoall, [](Request& q) { q.splits = {1, 2}; }, "splits sum to 3 but the first dimension is 4"},
      {OpType::kAddProcessSet, [](Request& q) { q.set_ranks = {0, 1}; q.members_only = true; }, nullptr},
      {OpType::kAddProcessSet, [](Request& q) { q.set_ranks = {}; }, "the new process set has no ranks"},
      {OpType::kAddProcessSet, [](Request& q) { q.set_ranks = {0, 2}; },
       "rank 2 of the new process set is out of range"},
      {OpType::kAddProcessSet, [](Request& q) { q.set_ranks = {1, 0}; }, "must be ascending and distinct"},
      {OpType::kAddProcessSet, [](Request& q) { q.set_ranks = {1, 1}; }, "must be ascending and distinct"},
      {OpType::kAllreduce, [](Request& q) { q.members_only = true; },
       "members_only applies to add_process_set only"},
  };
  for (const Case& c : cases) {
    Request q = Q(c.op);
    c.change(q);
    Status s = ValidateRequest(q, 2);
    if (c.words == nullptr) {
      CHECK(s.ok(), "%s: unexpected error %s", OpTypeName(c.op), s.message().c_str());
    } else {
      CHECK(Says(s, c.words), "%s: want '%s', got '%s'", OpTypeName(c.op), c.words, s.message().c_str());
    }
  }
  Request adasum = Q(OpType::kAllreduce);
  adasum.reduce_op = ReduceOp::kAdasum;
  CHECK(Says(ValidateRequest(adasum, 3), "power-of-2 number of ranks"), "Adasum on 3 ranks");
  CHECK(ValidateRequest(adasum, 4).ok(), "Adasum on 4 ranks");
}

void TestDefaultSplits() {
  Request q = Q(OpType::kAlltoall, {6, 2});
  q.splits.clear();
  CHECK(CompleteRequest(&q, 3).ok() && q.splits == std::vector<int64_t>({2, 2, 2}), "equal parts");
  q.splits.clear();
  q.shape = {5, 2};
  CHECK(Says(CompleteRequest(&q, 3), "not divisible by the number of ranks"), "5 rows on 3 ranks");
  Request given = Q(OpType::kAlltoall);
  CHECK(CompleteRequest(&given, 2).ok() && given.splits == std::vector<int64_t>({2, 2}), "given splits kept");
}

}  // namespace

int main() {
  return hvdlite_test::RunTests({{"rules", TestRules}, {"default_splits", TestDefaultSplits}});
}
