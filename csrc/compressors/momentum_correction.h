// Momentum correction with momentum factor masking, a decorator over top-k
// with error feedback (Deep Gradient Compression, Lin et al. 2018).
//
// Sparse updates and an optimizer's momentum do not mix: applied after the
// exchange, momentum only ever sees the few entries that were sent, and an
// entry's accumulated residual misses the momentum it would have had. DGC
// moves momentum before the exchange instead: each rank keeps a velocity per
// tensor, u = m u + g, hands u to error feedback (which accumulates v += u and
// sends the top-k of v), and zeroes u where an entry was sent, so a sent
// entry's stale momentum does not push it again. Where a tensor is sent whole
// (small tensors, a dense warm-up step) nothing is masked: the velocity goes on
// as the optimizer's momentum would have. The optimizer then applies
// the averaged result with plain SGD (the DistributedOptimizers set its
// momentum to 0 when they pass m here).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "compressors/decorator.h"

namespace hvdlite {

class MomentumCorrection : public CompressorDecorator {
 public:
  // inner: error feedback over top-k (registry checks), momentum in (0, 1).
  MomentumCorrection(std::unique_ptr<Compressor> inner, double momentum);

  std::string Describe() const override;
  size_t Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) override;
  void Reset() override;

  // The velocity carried for a tensor name (false if none); for tests.
  bool GetVelocity(const std::string& name, std::vector<float>* out) const;

 private:
  const float momentum_;
  std::unordered_map<std::string, std::vector<float>> velocity_;
  std::vector<float> sent_;      // the dense form of what one segment sent
  std::vector<Segment> single_;  // one segment at offset 0
};

}  // namespace hvdlite
