// Local gradient clipping, a decorator over any compressor (Deep Gradient
// Compression's companion to momentum correction): before compression, each
// tensor's gradient on this rank is scaled down to an L2 norm of at most
// max_norm. Accumulated residuals can otherwise release a burst of stale
// gradient at once; DGC clips each rank's gradient before it accumulates,
// with the limit of global clipping divided by sqrt(ranks).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "compressor.h"

namespace hvdlite {

class NormClip : public Compressor {
 public:
  NormClip(std::unique_ptr<Compressor> inner, double max_norm);

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
  void Reset() override { inner_->Reset(); }
  void BeginRound(const std::vector<Segment>& segs) override { inner_->BeginRound(segs); }
  bool Sparsifies(const Segment& s) const override { return inner_->Sparsifies(s); }

 private:
  std::unique_ptr<Compressor> inner_;
  const double max_norm_;
  std::vector<float> clipped_;   // a clipped segment, at offset 0
  std::vector<Segment> single_;  // one segment per inner call
};

}  // namespace hvdlite
