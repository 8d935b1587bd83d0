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

#include "compressors/decorator.h"

namespace hvdlite {

class NormClip : public CompressorDecorator {
 public:
  NormClip(std::unique_ptr<Compressor> inner, double max_norm);

  std::string Describe() const override;
  size_t Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) override;

 private:
  const double max_norm_;
  std::vector<float> clipped_;   // a clipped segment, at offset 0
  std::vector<Segment> single_;  // one segment per inner call
};

}  // namespace hvdlite
