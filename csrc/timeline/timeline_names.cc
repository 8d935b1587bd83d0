#include "timeline/timeline_names.h"

#include "process_set/process_set.h"

namespace hvdlite {

std::string TimelineRow(const Request& q) {
  if (AutoNameCounter(q.op, q.name) >= 0) return q.name;
  return std::string(OpTypeName(q.op)) + "." + q.name;
}

const char* NegotiatePhase(const Request& q) {
  switch (q.op) {
    case OpType::kAllreduce:
      return q.reduce_op == ReduceOp::kAdasum ? "NEGOTIATE_ADASUM" : "NEGOTIATE_ALLREDUCE";
    case OpType::kAllgather: return "NEGOTIATE_ALLGATHER";
    case OpType::kBroadcast: return "NEGOTIATE_BROADCAST";
    case OpType::kAlltoall: return "NEGOTIATE_ALLTOALL";
    case OpType::kReducescatter: return "NEGOTIATE_REDUCESCATTER";
    case OpType::kBarrier: return "NEGOTIATE_BARRIER";
    case OpType::kAddProcessSet: return "NEGOTIATE_ADD_PROCESS_SET";
    case OpType::kRemoveProcessSet: return "NEGOTIATE_REMOVE_PROCESS_SET";
    case OpType::kJoin: return "NEGOTIATE_JOIN";
  }
  return "NEGOTIATE_UNKNOWN";
}

const char* OperationPhase(const Request& q) {
  switch (q.op) {
    case OpType::kAllreduce: return q.reduce_op == ReduceOp::kAdasum ? "ADASUM" : "ALLREDUCE";
    case OpType::kAllgather: return "ALLGATHER";
    case OpType::kBroadcast: return "BROADCAST";
    case OpType::kAlltoall: return "ALLTOALL";
    case OpType::kReducescatter: return "REDUCESCATTER";
    case OpType::kBarrier: return "BARRIER";
    case OpType::kAddProcessSet: return "ADD_PROCESS_SET";
    case OpType::kRemoveProcessSet: return "REMOVE_PROCESS_SET";
    case OpType::kJoin: return "JOIN";
  }
  return "UNKNOWN";
}

}  // namespace hvdlite
