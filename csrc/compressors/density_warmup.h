// Density warm-up, a decorator over top-k (Deep Gradient Compression, Lin et
// al. 2018): a tensor's first `steps` rounds send a density that falls
// exponentially from dense to the target ratio, target^(s / steps) at round
// s, so the large, fast-changing gradients of the first steps are not held
// back in residuals while the model is still far from any minimum.
//
// A round is one collective of the tensor (BeginRound); every call between
// two BeginRounds uses the density fixed there, so the sizes of the wire
// forms agree on all ranks and between Compress and the Decompress calls.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "compressors/topk.h"

namespace hvdlite {

class DensityWarmup : public Compressor {
 public:
  DensityWarmup(std::unique_ptr<TopKCompressor> topk, int64_t steps);

  std::string Describe() const override;
  Wire wire() const override { return Wire::kAllgather; }
  size_t CompressedBytes(const std::vector<Segment>& segs) const override;
  size_t Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) override;
  void Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) override;
  void DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs, float* out) override;
  void Reset() override;
  void BeginRound(const std::vector<Segment>& segs) override;
  bool Sparsifies(const Segment& s) const override { return topk_->KAt(RatioOf(s.name), s.count) < s.count; }

  // The density of round `round` (0-based) of any tensor.
  double RatioAt(int64_t round) const;
  // The density fixed for this tensor's current round (the target when it
  // has had none).
  double RatioOf(const std::string& name) const;

 private:
  // call(wire offset) for each segment, with top-k set to that segment's
  // density and single_ holding it; each goes to top-k alone, and the wire
  // form stays the concatenation of the segments' forms (compressor.h).
  template <typename Call>
  void EachAtItsDensity(const std::vector<Segment>& segs, Call call);
  // One segment's wire bytes at its density.
  size_t SegmentBytes(const Segment& s) const { return 8 * static_cast<size_t>(topk_->KAt(RatioOf(s.name), s.count)); }

  std::unique_ptr<TopKCompressor> topk_;
  const double target_;
  const int64_t steps_;
  struct Progress {
    int64_t rounds = 0;  // BeginRounds seen
    double ratio = 1.0;  // of the current round
  };
  std::unordered_map<std::string, Progress> progress_;
  std::vector<Segment> single_;  // one segment per inner call
};

}  // namespace hvdlite
