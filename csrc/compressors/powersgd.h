// PowerSGD (Vogels, Karimireddy and Jaggi, 2019): each matrix gradient M
// (a tensor's rows x the product of its other dimensions) crosses the wire as
// a rank-r approximation P Q^T found by one step of power iteration, warm-
// started from the previous step's Q:
//
//   M += error;  P = M Q;  allreduce(P);  P = orthonormal columns of P;
//   Q = M^T P;  allreduce(Q);  result = P Q^T;  error = M - result / ranks
//
// so a rank sends (rows + cols) x r floats instead of rows x cols, and, unlike
// top-k, the compressed forms are summed by allreduce (they do not grow with
// the number of ranks). Tensors with fewer than two dimensions, and matrices
// too small to gain ((rows + cols) r >= rows cols), go dense in the first
// allreduce; so do all tensors in a tensor's first start_iter rounds, with no
// error kept (the paper's and DDP's warm start: early gradients change fast).
//
// Every rank computes P's orthonormal columns from the same summed P with the
// same code, so results are bitwise identical on all ranks. Q starts random,
// from a seed of the tensor's name, the same on every rank.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "compressors/compressor.h"

namespace hvdlite {

class PowerSGDCompressor : public Compressor {
 public:
  PowerSGDCompressor(int rank, int64_t start_iter);

  std::string Describe() const override;
  Wire wire() const override { return Wire::kExchange; }
  // Dense bytes: an upper bound of what Exchange sends per rank.
  size_t CompressedBytes(const std::vector<Segment>& segs) const override;
  // kExchange: the engine calls Exchange on dense data, not these.
  size_t Compress(const float*, const std::vector<Segment>&, uint8_t*) override { return 0; }
  void Decompress(const uint8_t*, const std::vector<Segment>&, float*) override {}
  void DecompressAdd(const uint8_t*, const std::vector<Segment>&, float*) override {}
  Status Exchange(Transport& wire, float* data, const std::vector<Segment>& segs,
                  int64_t* wire_bytes) override;
  void Reset() override { state_.clear(); }

  // Whether a segment is sent as factors after its warm start.
  bool LowRank(const Segment& s) const;
  // For tests: the error carried for a tensor (false if none).
  bool GetError(const std::string& name, std::vector<float>* out) const;

 private:
  struct TensorState {
    int64_t rounds = 0;
    std::vector<float> q;      // r x cols: Q^T, row j is column j of Q
    std::vector<float> error;  // rows x cols
  };
  struct Plan {
    TensorState* state = nullptr;  // state_'s entry (stable: an unordered_map keeps its elements in place)
    bool low_rank = false;
    int64_t first = 0;   // offset in first_ (P or the dense values)
    int64_t second = 0;  // offset in second_ (Q^T)
  };

  // Exchange's steps. Lays out both allreduces (plans_), sizing first_ and second_.
  void PlanRound(const std::vector<Segment>& segs);
  // first_ = P = (M + error) Q of each low-rank tensor, and the dense ones as they are.
  void ComputeP(float* data, const std::vector<Segment>& segs);
  // The dense tensors' sums back into `data`; second_ = Q = M^T P with P's columns orthonormal.
  void ComputeQ(float* data, const std::vector<Segment>& segs);
  // The sum's approximation P Q^T into `data`; what this rank's `share`
  // of it missed is kept as its error for the next round.
  void Approximate(float* data, const std::vector<Segment>& segs, float share);

  const int rank_;
  const int64_t start_iter_;
  std::unordered_map<std::string, TensorState> state_;
  // Scratch reused across calls.
  std::vector<Plan> plans_;
  std::vector<float> first_;   // P's and dense segments: the first allreduce
  std::vector<float> second_;  // Q's: the second allreduce
  std::vector<float> row_;     // one row of P Q^T
};

}  // namespace hvdlite
