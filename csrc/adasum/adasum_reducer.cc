#include "adasum/adasum_reducer.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace hvdlite {

namespace {

constexpr int kPieceTag = 0x4144;   // halves of the tensors
constexpr int kSumsTag = 0x4145;    // dot products and squared norms

// A squared norm below this counts as zero (coefficient 1), as in Horovod:
// dividing by it could overflow.
const double kTinyNormSquared = std::sqrt(std::numeric_limits<double>::min());

double Coefficient(double dot, double norm_squared) {
  return norm_squared >= kTinyNormSquared ? 1.0 - dot / (2.0 * norm_squared) : 1.0;
}

Status OutOfMemory(int64_t bytes) {
  return Status::Error(ErrorKind::kInternal,
                       "could not allocate " + std::to_string(bytes) + " bytes for Adasum");
}

}  // namespace

Status AdasumReducer::Allreduce(Transport& transport, DataType type,
                                const std::vector<AdasumTensor>& tensors) {
  wire_bytes_ = 0;
  if (!AdasumSupportsSize(transport.size())) {
    return Status::Error(ErrorKind::kInternal, "Adasum reached the wire with a process set of " +
                                                   std::to_string(transport.size()) +
                                                   " ranks, not a power of 2");
  }
  switch (type) {
    case DataType::kFloat32: return Run<float>(transport, tensors);
    case DataType::kFloat64: return Run<double>(transport, tensors);
    default:
      return Status::Error(ErrorKind::kInternal,
                           std::string("Adasum reached the wire with ") + DataTypeName(type));
  }
}

template <typename T>
Status AdasumReducer::Run(Transport& transport, const std::vector<AdasumTensor>& tensors) {
  const int rank = transport.rank();
  const int size = transport.size();
  const size_t n = tensors.size();
  mine_.assign(n, Range());
  theirs_.assign(n, Range());
  for (size_t i = 0; i < n; ++i) mine_[i].hi = tensors[i].count;
  before_.clear();

  // Reduce-scatter: halve, swap, combine the kept half.
  for (int level = 1; level < size; level <<= 1) {
    const bool left = (rank & level) == 0;
    before_.push_back(mine_);
    for (size_t i = 0; i < n; ++i) {
      const Range whole = mine_[i];
      const int64_t mid = whole.lo + whole.size() / 2;
      // The left rank keeps the first (smaller) half, as Horovod splits.
      mine_[i] = left ? Range{whole.lo, mid} : Range{mid, whole.hi};
      theirs_[i] = left ? Range{mid, whole.hi} : Range{whole.lo, mid};
    }
    // The peer's half goes to the peer; its copy of this rank's half arrives.
    uint8_t* theirs = nullptr;
    Status s = Swap(transport, rank ^ level, tensors, theirs_, mine_, sizeof(T), false, &theirs);
    if (!s.ok()) return s;
    // The partial sums of this rank's piece, oriented left/right so that the
    // group's total is (a.b, |a|^2, |b|^2) of the two subtrees' vectors.
    sums_.assign(3 * n, 0.0);
    const T* other = reinterpret_cast<const T*>(theirs);
    for (size_t i = 0; i < n; ++i) {
      const T* own = static_cast<const T*>(tensors[i].data) + mine_[i].lo;
      double dot = 0.0, own_sq = 0.0, other_sq = 0.0;
      for (int64_t j = 0; j < mine_[i].size(); ++j) {
        const double x = static_cast<double>(own[j]);
        const double y = static_cast<double>(other[j]);
        dot += x * y;
        own_sq += x * x;
        other_sq += y * y;
      }
      sums_[3 * i] = dot;
      sums_[3 * i + 1] = left ? own_sq : other_sq;
      sums_[3 * i + 2] = left ? other_sq : own_sq;
      other += mine_[i].size();
    }
    s = SumOverGroup(transport, level);
    if (!s.ok()) return s;
    Combine<T>(tensors, reinterpret_cast<const T*>(theirs), left);
  }

  // Allgather: the pieces travel back the way they came.
  for (int level = size >> 1; level > 0; level >>= 1) {
    const std::vector<Range> whole = std::move(before_.back());
    before_.pop_back();
    const bool left = (rank & level) == 0;
    for (size_t i = 0; i < n; ++i) {
      theirs_[i] = left ? Range{mine_[i].hi, whole[i].hi} : Range{whole[i].lo, mine_[i].lo};
    }
    uint8_t* unused = nullptr;
    Status s = Swap(transport, rank ^ level, tensors, mine_, theirs_, sizeof(T), true, &unused);
    if (!s.ok()) return s;
    mine_ = whole;
  }
  return Status::OK();
}

template <typename T>
void AdasumReducer::Combine(const std::vector<AdasumTensor>& tensors, const T* theirs, bool left) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const double dot = sums_[3 * i];
    const double a = Coefficient(dot, sums_[3 * i + 1]);  // left subtree's vector
    const double b = Coefficient(dot, sums_[3 * i + 2]);  // right subtree's vector
    const double own_coeff = left ? a : b;
    const double other_coeff = left ? b : a;
    T* own = static_cast<T*>(tensors[i].data) + mine_[i].lo;
    const int64_t count = mine_[i].size();
    for (int64_t j = 0; j < count; ++j) {
      own[j] = static_cast<T>(own_coeff * static_cast<double>(own[j]) +
                              other_coeff * static_cast<double>(theirs[j]));
    }
    theirs += count;
  }
}

Status AdasumReducer::Swap(Transport& transport, int peer, const std::vector<AdasumTensor>& tensors,
                           const std::vector<Range>& give, const std::vector<Range>& take,
                           size_t elem, bool in_place, uint8_t** received) {
  auto bytes_of = [&](const std::vector<Range>& pieces, int* sole) {
    int64_t total = 0;
    *sole = -1;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].size() == 0) continue;
      *sole = total == 0 ? static_cast<int>(i) : -1;
      total += pieces[i].size();
    }
    return total * static_cast<int64_t>(elem);
  };
  auto at = [&](const std::vector<Range>& pieces, size_t i) {
    return static_cast<uint8_t*>(tensors[i].data) + pieces[i].lo * static_cast<int64_t>(elem);
  };
  int give_sole = -1, take_sole = -1;
  const int64_t send_bytes = bytes_of(give, &give_sole);
  const int64_t recv_bytes = bytes_of(take, &take_sole);

  const uint8_t* send = nullptr;
  if (give_sole >= 0) {
    send = at(give, static_cast<size_t>(give_sole));
  } else if (send_bytes > 0) {
    uint8_t* packed = scratch_.Get(FusionBuffer::kSend, 0, static_cast<size_t>(send_bytes));
    if (packed == nullptr) return OutOfMemory(send_bytes);
    for (size_t i = 0, offset = 0; i < give.size(); ++i) {
      const size_t bytes = static_cast<size_t>(give[i].size()) * elem;
      if (bytes == 0) continue;  // an empty tensor's data may be null
      std::memcpy(packed + offset, at(give, i), bytes);
      offset += bytes;
    }
    send = packed;
  }
  uint8_t* recv = nullptr;
  const bool direct = in_place && take_sole >= 0;
  if (direct) {
    recv = at(take, static_cast<size_t>(take_sole));
  } else if (recv_bytes > 0) {
    recv = scratch_.Get(FusionBuffer::kGather, 0, static_cast<size_t>(recv_bytes));
    if (recv == nullptr) return OutOfMemory(recv_bytes);
  }
  if (send_bytes > 0 || recv_bytes > 0) {
    Status s = transport.SendRecv(send, send_bytes, recv, recv_bytes, peer, kPieceTag);
    if (!s.ok()) return s;
    wire_bytes_ += send_bytes;
  }
  if (in_place && !direct) {
    for (size_t i = 0, offset = 0; i < take.size(); ++i) {
      const size_t bytes = static_cast<size_t>(take[i].size()) * elem;
      if (bytes == 0) continue;
      std::memcpy(at(take, i), recv + offset, bytes);
      offset += bytes;
    }
  }
  *received = recv;
  return Status::OK();
}

Status AdasumReducer::SumOverGroup(Transport& transport, int level) {
  // Butterfly over the ranks that differ from this one in bits 0..log2(level):
  // both partners add the same two numbers, so every rank of the group ends
  // with bitwise the same sums, in an order that does not depend on fusion.
  peer_sums_.resize(sums_.size());
  const int64_t bytes = static_cast<int64_t>(sums_.size() * sizeof(double));
  for (int bit = 1; bit <= level; bit <<= 1) {
    Status s = transport.SendRecv(sums_.data(), bytes, peer_sums_.data(), bytes, transport.rank() ^ bit, kSumsTag);
    if (!s.ok()) return s;
    wire_bytes_ += bytes;
    for (size_t i = 0; i < sums_.size(); ++i) sums_[i] += peer_sums_[i];
  }
  return Status::OK();
}

}  // namespace hvdlite
