#include "compressors/powersgd.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "transport/transport.h"
#include "compressors/registry.h"

namespace hvdlite {

namespace {

uint64_t NameSeed(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1): a start for the power iteration, the same on every rank.
void RandomFill(float* out, int64_t n, uint64_t seed) {
  uint64_t state = seed;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(static_cast<double>(SplitMix64(&state) >> 11) * 0x1.0p-52 - 1.0);
  }
}

// Eight running sums, so the compiler can keep them in one vector register
// (one sum is a dependency chain it may not reorder); the order is fixed, so
// every rank gets the same bits.
float Dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += a[i + j] * b[i + j];
  }
  float s = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void Axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// Gram-Schmidt on the r columns of p (rows x r, row-major); a column that
// vanishes stays 0.
void Orthonormalize(float* p, int64_t rows, int r) {
  for (int j = 0; j < r; ++j) {
    for (int k = 0; k < j; ++k) {
      double d = 0.0;
      for (int64_t i = 0; i < rows; ++i) d += static_cast<double>(p[i * r + j]) * p[i * r + k];
      const float f = static_cast<float>(d);
      for (int64_t i = 0; i < rows; ++i) p[i * r + j] -= f * p[i * r + k];
    }
    double norm = 0.0;
    for (int64_t i = 0; i < rows; ++i) norm += static_cast<double>(p[i * r + j]) * p[i * r + j];
    norm = std::sqrt(norm);
    if (norm > 0.0) {
      const float inv = static_cast<float>(1.0 / norm);
      for (int64_t i = 0; i < rows; ++i) p[i * r + j] *= inv;
    }
  }
}

}  // namespace

PowerSGDCompressor::PowerSGDCompressor(int rank, int64_t start_iter) : rank_(rank), start_iter_(start_iter) {}

std::string PowerSGDCompressor::Describe() const {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "powersgd(%d)", rank_);
  return buf;
}

size_t PowerSGDCompressor::CompressedBytes(const std::vector<Segment>& segs) const {
  return static_cast<size_t>(TotalCount(segs)) * sizeof(float);
}

bool PowerSGDCompressor::LowRank(const Segment& s) const {
  if (s.rows <= 0 || s.count % s.rows != 0) return false;
  const int64_t cols = s.count / s.rows;
  return (s.rows + cols) * rank_ < s.rows * cols;
}

Status PowerSGDCompressor::Exchange(Transport& wire, float* data, const std::vector<Segment>& segs,
                                    int64_t* wire_bytes) {
  PlanRound(segs);
  const int64_t first = static_cast<int64_t>(first_.size()), second = static_cast<int64_t>(second_.size());
  ComputeP(data, segs);
  Status status = first > 0 ? wire.Allreduce(first_.data(), first, DataType::kFloat32, ReduceOp::kSum)
                            : Status::OK();
  if (!status.ok()) return status;
  ComputeQ(data, segs);
  if (second > 0) status = wire.Allreduce(second_.data(), second, DataType::kFloat32, ReduceOp::kSum);
  if (!status.ok()) return status;
  Approximate(data, segs, 1.0f / static_cast<float>(wire.size()));
  *wire_bytes = (first + second) * static_cast<int64_t>(sizeof(float));
  return Status::OK();
}

void PowerSGDCompressor::PlanRound(const std::vector<Segment>& segs) {
  plans_.assign(segs.size(), Plan{});
  int64_t first = 0, second = 0;
  for (size_t t = 0; t < segs.size(); ++t) {
    const Segment& s = segs[t];
    Plan& plan = plans_[t];
    plan.state = &state_[s.name];
    plan.low_rank = LowRank(s) && plan.state->rounds >= start_iter_;
    plan.first = first;
    plan.second = second;
    if (plan.low_rank) {
      first += s.rows * rank_;
      second += (s.count / s.rows) * rank_;
    } else {
      first += s.count;
    }
  }
  first_.resize(static_cast<size_t>(first));
  second_.resize(static_cast<size_t>(second));
}

void PowerSGDCompressor::ComputeP(float* data, const std::vector<Segment>& segs) {
  const int r = rank_;
  for (size_t t = 0; t < segs.size(); ++t) {
    const Segment& s = segs[t];
    float* m = data + s.offset;
    if (!plans_[t].low_rank) {
      std::memcpy(first_.data() + plans_[t].first, m, static_cast<size_t>(s.count) * sizeof(float));
      continue;
    }
    TensorState& st = *plans_[t].state;
    const int64_t rows = s.rows, cols = s.count / s.rows;
    if (static_cast<int64_t>(st.error.size()) != s.count) st.error.assign(static_cast<size_t>(s.count), 0.0f);
    if (static_cast<int64_t>(st.q.size()) != cols * r) {
      st.q.resize(static_cast<size_t>(cols * r));
      RandomFill(st.q.data(), cols * r, NameSeed(s.name));
    }
    for (int64_t i = 0; i < s.count; ++i) m[i] += st.error[i];
    float* p = first_.data() + plans_[t].first;
    for (int64_t i = 0; i < rows; ++i) {
      for (int j = 0; j < r; ++j) p[i * r + j] = Dot(m + i * cols, st.q.data() + j * cols, cols);
    }
  }
}

void PowerSGDCompressor::ComputeQ(float* data, const std::vector<Segment>& segs) {
  const int r = rank_;
  for (size_t t = 0; t < segs.size(); ++t) {
    const Segment& s = segs[t];
    float* m = data + s.offset;
    if (!plans_[t].low_rank) {
      std::memcpy(m, first_.data() + plans_[t].first, static_cast<size_t>(s.count) * sizeof(float));
      continue;
    }
    const int64_t rows = s.rows, cols = s.count / s.rows;
    float* p = first_.data() + plans_[t].first;
    Orthonormalize(p, rows, r);
    float* q = second_.data() + plans_[t].second;
    std::memset(q, 0, static_cast<size_t>(cols * r) * sizeof(float));
    for (int64_t i = 0; i < rows; ++i) {
      for (int j = 0; j < r; ++j) Axpy(q + j * cols, p[i * r + j], m + i * cols, cols);
    }
  }
}

void PowerSGDCompressor::Approximate(float* data, const std::vector<Segment>& segs, float share) {
  const int r = rank_;
  for (size_t t = 0; t < segs.size(); ++t) {
    const Segment& s = segs[t];
    TensorState& st = *plans_[t].state;
    ++st.rounds;
    if (!plans_[t].low_rank) continue;
    const int64_t rows = s.rows, cols = s.count / s.rows;
    float* m = data + s.offset;
    const float* p = first_.data() + plans_[t].first;
    const float* q = second_.data() + plans_[t].second;
    row_.resize(static_cast<size_t>(cols));
    for (int64_t i = 0; i < rows; ++i) {
      std::fill(row_.begin(), row_.end(), 0.0f);
      for (int j = 0; j < r; ++j) Axpy(row_.data(), p[i * r + j], q + j * cols, cols);
      float* mi = m + i * cols;
      float* ei = st.error.data() + i * cols;
      for (int64_t k = 0; k < cols; ++k) {
        ei[k] = mi[k] - row_[k] * share;
        mi[k] = row_[k];
      }
    }
    // Warm start: the mean Q begins the next round's power iteration.
    for (int64_t i = 0; i < cols * r; ++i) st.q[i] = q[i] * share;
  }
}

bool PowerSGDCompressor::GetError(const std::string& name, std::vector<float>* out) const {
  auto it = state_.find(name);
  if (it == state_.end() || it->second.error.empty()) return false;
  *out = it->second.error;
  return true;
}

namespace {

std::string CheckArguments(const CompressionSpec& spec, DataType dtype, int64_t) {
  if (spec.rank < 1 || spec.rank > 64) {
    return "PowerSGD rank must be in [1, 64], got " + std::to_string(spec.rank);
  }
  if (spec.start_iter < 0) return "PowerSGD start_iter must be >= 0, got " + std::to_string(spec.start_iter);
  if (dtype != DataType::kFloat32) {
    return std::string("PowerSGD compression needs float32 tensors, not ") + DataTypeName(dtype) +
           "; cast to float32 or use Compression.none / fp16 / bf16";
  }
  return "";
}

std::string Arguments(const CompressionSpec& spec) {
  return "(rank=" + std::to_string(spec.rank) + ", start_iter=" + std::to_string(spec.start_iter) + ")";
}

std::unique_ptr<Compressor> Make(const CompressionSpec& spec) {
  if (spec.rank < 1 || spec.rank > 64) return nullptr;
  return std::make_unique<PowerSGDCompressor>(spec.rank, spec.start_iter);
}

CompressorKind Kind() {
  CompressorKind kind{CompressionType::kPowerSGD, "powersgd", Make, CheckArguments, Arguments};
  kind.reducescatter = false;  // its factors describe whole matrices
  return kind;
}

const bool kRegistered = RegisterCompressor(Kind());

}  // namespace

}  // namespace hvdlite
