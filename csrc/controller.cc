#include "controller.h"

#include <map>
#include <sstream>

namespace hvdlite {

namespace {

constexpr int kCoordinator = 0;
// Word 0 of the negotiation vector. Bits mean "this rank is quiet"; the
// bitwise AND over ranks is then "every rank is quiet".
constexpr uint64_t kQuietBit = 1;

// "[2, 3] on ranks 0, 2; [2, 4] on rank 1"
template <typename F>
std::string DescribeByRank(const std::vector<Request>& by_rank, F value_of) {
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> order;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    std::string v = value_of(by_rank[r]);
    if (!groups.count(v)) order.push_back(v);
    groups[v].push_back(static_cast<int>(r));
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

}  // namespace

Status Controller::Negotiate(const RequestList& mine, ResponseList* out) {
  *out = ResponseList();
  const bool quiet = mine.requests.empty() && !mine.shutdown;
  uint64_t word = quiet ? kQuietBit : 0;
  Status s = mpi_->BitwiseAnd(&word, 1);
  if (!s.ok() || (word & kQuietBit)) return s;

  std::vector<std::vector<uint8_t>> gathered;
  s = mpi_->GatherBytes(Serialize(mine), kCoordinator, &gathered);
  if (!s.ok()) return s;
  std::vector<uint8_t> reply;
  if (mpi_->rank() == kCoordinator) {
    std::vector<RequestList> all;
    all.reserve(gathered.size());
    for (const auto& bytes : gathered) all.push_back(DeserializeRequestList(bytes.data(), bytes.size()));
    reply = Serialize(Coordinate(all));
  }
  s = mpi_->BroadcastBytes(&reply, kCoordinator);
  if (!s.ok()) return s;
  *out = DeserializeResponseList(reply.data(), reply.size());
  return Status::OK();
}

ResponseList Controller::Coordinate(const std::vector<RequestList>& all) {
  ResponseList result;
  const int size = static_cast<int>(all.size());
  for (int r = 0; r < size; ++r) {
    if (all[r].shutdown) {
      result.shutdown = true;
      result.shutdown_ranks.push_back(r);
      result.shutdown_reasons.push_back(all[r].shutdown_reason);
    }
  }
  if (result.shutdown) return result;

  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> ready;
  for (int r = 0; r < size; ++r) {
    for (const Request& q : all[r].requests) {
      auto it = table_.find(q.name);
      if (it == table_.end()) {
        Pending p;
        p.by_rank.resize(size);
        p.present.assign(size, false);
        p.first_seen = now;
        it = table_.emplace(q.name, std::move(p)).first;
      }
      Pending& p = it->second;
      if (p.present[r]) continue;  // TensorQueue refuses in-flight duplicates
      p.by_rank[r] = q;
      p.by_rank[r].rank = r;
      p.present[r] = true;
      if (++p.count == size) ready.push_back(q.name);
    }
  }
  for (const auto& name : ready) {
    result.responses.push_back(Decide(table_[name]));
    table_.erase(name);
  }
  return result;
}

Response Controller::Decide(const Pending& pending) const {
  const auto& q = pending.by_rank;
  const Request& first = q[0];
  Response response;
  response.op = first.op;
  response.dtype = first.dtype;
  response.names.push_back(first.name);

  auto mismatch = [&](const char* field, const std::string& values) {
    response.kind = Response::Kind::kError;
    response.error = std::string("Mismatched ") + field + " for tensor '" + first.name +
                     "': " + values +
                     ". Every rank must submit the same name with the same " + field + ".";
    return response;
  };

  if (!AllSame(q, [](const Request& x) { return x.op; })) {
    return mismatch("operation", DescribeByRank(q, [](const Request& x) {
                      return std::string(OpTypeName(x.op));
                    }));
  }
  if (!AllSame(q, [](const Request& x) { return x.dtype; })) {
    return mismatch("dtype", DescribeByRank(q, [](const Request& x) {
                      return std::string(DataTypeName(x.dtype));
                    }));
  }
  const OpType op = first.op;
  const bool whole_shape = op == OpType::kAllreduce || op == OpType::kBroadcast ||
                           op == OpType::kReducescatter;
  const bool trailing_shape = op == OpType::kAllgather || op == OpType::kAlltoall;
  if (whole_shape && !AllSame(q, [](const Request& x) { return x.shape; })) {
    return mismatch("shape", DescribeByRank(q, [](const Request& x) { return ShapeString(x.shape); }));
  }
  if (trailing_shape) {
    if (!AllSame(q, [](const Request& x) { return x.shape.size(); })) {
      return mismatch("number of dimensions", DescribeByRank(q, [](const Request& x) {
                        return std::to_string(x.shape.size());
                      }));
    }
    if (!AllSame(q, TrailingDims)) {
      return mismatch("trailing dimensions (all but the first must agree)",
                      DescribeByRank(q, [](const Request& x) {
                        return ShapeString(TrailingDims(x));
                      }));
    }
  }
  if (op == OpType::kAllreduce || op == OpType::kReducescatter) {
    if (!AllSame(q, [](const Request& x) { return x.reduce_op; })) {
      return mismatch("reduce op", DescribeByRank(q, [](const Request& x) {
                        return std::string(ReduceOpName(x.reduce_op));
                      }));
    }
    if (!AllSame(q, [](const Request& x) { return x.prescale; })) {
      return mismatch("prescale_factor",
                      DescribeByRank(q, [](const Request& x) { return Num(x.prescale); }));
    }
    if (!AllSame(q, [](const Request& x) { return x.postscale; })) {
      return mismatch("postscale_factor",
                      DescribeByRank(q, [](const Request& x) { return Num(x.postscale); }));
    }
    if (!AllSame(q, [](const Request& x) { return x.compression; })) {
      return mismatch("compression", DescribeByRank(q, [](const Request& x) {
                        return x.compression.ToString();
                      }));
    }
  }
  if (op == OpType::kBroadcast && !AllSame(q, [](const Request& x) { return x.root_rank; })) {
    return mismatch("root rank", DescribeByRank(q, [](const Request& x) {
                      return std::to_string(x.root_rank);
                    }));
  }
  if ((op == OpType::kAddProcessSet || op == OpType::kRemoveProcessSet) &&
      !AllSame(q, [](const Request& x) { return x.splits; })) {
    return mismatch("process set ranks",
                    DescribeByRank(q, [](const Request& x) { return ShapeString(x.splits); }));
  }

  const int64_t size = static_cast<int64_t>(q.size());
  switch (op) {
    case OpType::kAllgather:
      for (const auto& x : q) response.sizes.push_back(x.shape.empty() ? 1 : x.shape[0]);
      break;
    case OpType::kAlltoall:
      for (const auto& x : q) {
        response.sizes.insert(response.sizes.end(), x.splits.begin(), x.splits.end());
      }
      break;
    case OpType::kReducescatter: {
      const int64_t rows = first.shape.empty() ? 1 : first.shape[0];
      for (int64_t r = 0; r < size; ++r) response.sizes.push_back(rows / size + (r < rows % size));
      break;
    }
    case OpType::kAddProcessSet:
    case OpType::kRemoveProcessSet:
      response.sizes = first.splits;
      break;
    default:
      break;
  }
  return response;
}

std::vector<Controller::Stalled> Controller::StalledTensors(double min_age_seconds) const {
  std::vector<Stalled> out;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& kv : table_) {
    double age = std::chrono::duration<double>(now - kv.second.first_seen).count();
    if (age < min_age_seconds) continue;
    Stalled s;
    s.name = kv.first;
    s.seconds = age;
    for (size_t r = 0; r < kv.second.present.size(); ++r) {
      if (!kv.second.present[r]) s.missing_ranks.push_back(static_cast<int32_t>(r));
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace hvdlite
