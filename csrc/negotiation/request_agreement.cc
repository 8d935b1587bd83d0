#include "negotiation/request_agreement.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "negotiation/op_rules.h"

namespace hvdlite {

namespace {

// "[2, 3] on ranks 0, 2; [2, 4] on rank 1"
template <typename F>
std::string DescribeByRank(const std::vector<Request>& by_rank, F value_of) {
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> order;
  for (const auto& q : by_rank) {
    std::string v = value_of(q);
    if (!groups.count(v)) order.push_back(v);
    groups[v].push_back(q.rank);
  }
  std::ostringstream out;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& ranks = groups[order[i]];
    if (i) out << "; ";
    out << order[i] << " on rank" << (ranks.size() > 1 ? "s " : " ");
    for (size_t j = 0; j < ranks.size(); ++j) out << (j ? ", " : "") << ranks[j];
  }
  return out.str();
}

template <typename F>
bool AllSame(const std::vector<Request>& by_rank, F value_of) {
  for (size_t r = 1; r < by_rank.size(); ++r) {
    if (!(value_of(by_rank[r]) == value_of(by_rank[0]))) return false;
  }
  return true;
}

std::vector<int64_t> TrailingDims(const Request& q) {
  return q.shape.empty() ? std::vector<int64_t>{}
                         : std::vector<int64_t>(q.shape.begin() + 1, q.shape.end());
}

std::string Num(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

std::string Mismatched(const std::string& name, const char* field, const std::string& values) {
  return std::string("Mismatched ") + field + " for tensor '" + name + "': " + values +
         ". Every rank must submit the same name with the same " + field + ".";
}

// The shape rules of the operation: the whole shape, or all but the first dimension.
std::string ShapeMismatch(const std::vector<Request>& q, const OpRules& rules) {
  if (rules.whole_shape && !AllSame(q, [](const Request& x) { return x.shape; })) {
    return Mismatched(q[0].name, "shape", DescribeByRank(q, [](const Request& x) { return ShapeString(x.shape); }));
  }
  if (rules.trailing_shape) {
    if (!AllSame(q, [](const Request& x) { return x.shape.size(); })) {
      return Mismatched(q[0].name, "number of dimensions", DescribeByRank(q, [](const Request& x) {
                        return std::to_string(x.shape.size());
                      }));
    }
    if (!AllSame(q, TrailingDims)) {
      return Mismatched(q[0].name, "trailing dimensions (all but the first must agree)",
                      DescribeByRank(q, [](const Request& x) {
                        return ShapeString(TrailingDims(x));
                      }));
    }
  }
  return "";
}

// A reduction's op, scale factors and compression.
std::string ReductionMismatch(const std::vector<Request>& q) {
  if (!AllSame(q, [](const Request& x) { return x.reduce_op; })) {
    return Mismatched(q[0].name, "reduce op", DescribeByRank(q, [](const Request& x) {
                      return std::string(ReduceOpName(x.reduce_op));
                    }));
  }
  if (!AllSame(q, [](const Request& x) { return x.prescale; })) {
    return Mismatched(q[0].name, "prescale_factor",
                    DescribeByRank(q, [](const Request& x) { return Num(x.prescale); }));
  }
  if (!AllSame(q, [](const Request& x) { return x.postscale; })) {
    return Mismatched(q[0].name, "postscale_factor",
                    DescribeByRank(q, [](const Request& x) { return Num(x.postscale); }));
  }
  if (!AllSame(q, [](const Request& x) { return x.compression; })) {
    return Mismatched(q[0].name, "compression", DescribeByRank(q, [](const Request& x) {
                      return x.compression.ToString();
                    }));
  }
  return "";
}

std::string RanksString(const std::vector<int32_t>& ranks) {
  return ShapeString(std::vector<int64_t>(ranks.begin(), ranks.end()));
}

// add_process_set: the ranks, who submits it, and (members only) that every
// submitter is a member: a non-member has no part in the set's add.
std::string AddMismatch(const std::vector<Request>& q) {
  if (!AllSame(q, [](const Request& x) { return x.set_ranks; })) {
    return Mismatched(q[0].name, "process set ranks",
                      DescribeByRank(q, [](const Request& x) { return RanksString(x.set_ranks); }));
  }
  if (!AllSame(q, [](const Request& x) { return x.members_only; })) {
    return Mismatched(q[0].name, "submitters of add_process_set", DescribeByRank(q, [](const Request& x) {
                      return std::string(x.members_only ? "members only" : "all ranks");
                    }));
  }
  if (!q[0].members_only) return "";
  std::string outsiders;
  for (const auto& x : q) {
    if (!std::binary_search(x.set_ranks.begin(), x.set_ranks.end(), x.rank)) {
      outsiders += (outsiders.empty() ? "" : ", ") + std::to_string(x.rank);
    }
  }
  if (outsiders.empty()) return "";
  return "add_process_set of '" + q[0].name + "': ranks [" + outsiders +
         "] submitted it but are not members of the new process set " + RanksString(q[0].set_ranks) +
         "; only its members submit an add made by the members alone";
}

}  // namespace

std::string FindMismatch(const std::vector<Request>& q) {
  if (!AllSame(q, [](const Request& x) { return x.op; })) {
    return Mismatched(q[0].name, "operation", DescribeByRank(q, [](const Request& x) {
                      return std::string(OpTypeName(x.op));
                    }));
  }
  if (!AllSame(q, [](const Request& x) { return x.dtype; })) {
    return Mismatched(q[0].name, "dtype", DescribeByRank(q, [](const Request& x) {
                      return std::string(DataTypeName(x.dtype));
                    }));
  }
  if (!AllSame(q, [](const Request& x) { return x.device; })) {
    return Mismatched(q[0].name, "device", DescribeByRank(q, [](const Request& x) {
                      return std::string(x.device ? "device memory" : "host memory");
                    }));
  }
  const OpType op = q[0].op;
  const OpRules& rules = RulesFor(op);
  std::string mismatch = ShapeMismatch(q, rules);
  if (mismatch.empty() && rules.reduces) mismatch = ReductionMismatch(q);
  if (!mismatch.empty()) return mismatch;
  if (rules.has_root && !AllSame(q, [](const Request& x) { return x.root_rank; })) {
    return Mismatched(q[0].name, "root rank", DescribeByRank(q, [](const Request& x) {
                      return std::to_string(x.root_rank);
                    }));
  }
  if (op == OpType::kAddProcessSet) {
    mismatch = AddMismatch(q);
    if (!mismatch.empty()) return mismatch;
  }
  if (op == OpType::kRemoveProcessSet && !AllSame(q, [](const Request& x) { return x.target_set; })) {
    return Mismatched(q[0].name, "process set", DescribeByRank(q, [](const Request& x) {
                      return std::to_string(x.target_set);
                    }));
  }

  return "";
}

}  // namespace hvdlite
