// Momentum correction with momentum factor masking, a decorator over top-k
// with error feedback (Deep Gradient Compression, Lin et al. 2018).
//
// Sparse updates and an optimizer's momentum do not mix: applied after the
// exchange, momentum only ever sees the few entries that were sent, and an
// entry's accumulated residual misses the momentum it would have had. DGC
// moves momentum before the exchange instead: each rank keeps a velocity per
// tensor, u = m u + g, hands u to error feedback (which accumulates v += u and
// sends the top-k of v), and zeroes u where an entry was sent, so a sent
// entry's stale momentum does not push it again. The optimizer then applies
// the averaged result with plain SGD (the DistributedOptimizers set its
// momentum to 0 when they pass m here).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "compressor.h"

namespace hvdlite {

class MomentumCorrection : public Compressor {
 public:
  // inner: error feedback over top-k (registry checks), momentum in (0, 1).
  MomentumCorrection(std::unique_ptr<Compressor> inner, double momentum);

  std::string Describe() const override;
  Wire wire() const override { return inner_->wire(); }
  size_t CompressedBytes(const std::vector<Segment>& segs) const override {
    return inner_->CompressedBytes(segs);
  }
  size_t Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) override;
  void Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) override {
    inner_->Decompress(in, segs, out);
  }
  void DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs, float* out) override {
    inner_->DecompressAdd(in, segs, out);
  }
  DataType wire_dtype() const override { return inner_->wire_dtype(); }
  void Reset() override;
  void BeginRound(const std::vector<Segment>& segs) override { inner_->BeginRound(segs); }
  bool Sparsifies(const Segment& s) const override { return inner_->Sparsifies(s); }

  // The velocity carried for a tensor name (false if none); for tests.
  bool GetVelocity(const std::string& name, std::vector<float>* out) const;

 private:
  std::unique_ptr<Compressor> inner_;
  const float momentum_;
  std::unordered_map<std::string, std::vector<float>> velocity_;
  std::vector<float> sent_;      // the dense form of what one segment sent
  std::vector<Segment> single_;  // one segment at offset 0
};

}  // namespace hvdlite
