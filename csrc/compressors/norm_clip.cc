#include "compressors/norm_clip.h"

#include <cmath>
#include <cstdio>

namespace hvdlite {

NormClip::NormClip(std::unique_ptr<Compressor> inner, double max_norm)
    : CompressorDecorator(std::move(inner)), max_norm_(max_norm), single_(1) {}

std::string NormClip::Describe() const {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "+clip(%g)", max_norm_);
  return inner_->Describe() + buf;
}

size_t NormClip::Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) {
  size_t pos = 0;
  for (const Segment& s : segs) {
    const float* g = input + s.offset;
    double squares = 0.0;
    for (int64_t i = 0; i < s.count; ++i) squares += static_cast<double>(g[i]) * g[i];
    const double norm = std::sqrt(squares);
    single_[0] = s;
    const float* from = input;
    if (norm > max_norm_) {  // also false for a NaN norm: a NaN gradient is sent as it is
      const float factor = static_cast<float>(max_norm_ / norm);
      clipped_.resize(static_cast<size_t>(s.count));
      for (int64_t i = 0; i < s.count; ++i) clipped_[i] = g[i] * factor;
      from = clipped_.data();
      single_[0].offset = 0;
    }
    const size_t bytes = inner_->Compress(from, single_, out + pos);
    if (bytes == 0 && s.count > 0) return 0;
    pos += bytes;
  }
  return pos;
}

}  // namespace hvdlite
