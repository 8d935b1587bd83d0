#include "compressors/error_feedback.h"

#include <algorithm>
#include <cmath>

namespace hvdlite {

ErrorFeedback::ErrorFeedback(std::unique_ptr<Compressor> inner, bool drop_nonfinite)
    : CompressorDecorator(std::move(inner)), drop_nonfinite_(drop_nonfinite), single_(1) {}

size_t ErrorFeedback::Compress(const float* input, const std::vector<Segment>& segs,
                               uint8_t* out) {
  int64_t end = 0;
  for (const Segment& s : segs) end = std::max(end, s.offset + s.count);
  // Grows once to the largest buffer seen; only the segments' ranges are used.
  if (static_cast<int64_t>(tmp_.size()) < end) tmp_.resize(static_cast<size_t>(end));
  seg_residuals_.clear();  // keeps its capacity

  for (const Segment& s : segs) {
    std::vector<float>& neg = residuals_[s.name];
    if (static_cast<int64_t>(neg.size()) != s.count) neg.assign(static_cast<size_t>(s.count), 0.0f);
    seg_residuals_.push_back(neg.data());
    const float* in = input + s.offset;
    float* tmp = tmp_.data() + s.offset;
    float* r = neg.data();
    // One pass: tmp = input + residual, and the first half of the new residual.
    for (int64_t i = 0; i < s.count; ++i) {
      const float t = in[i] - r[i];
      tmp[i] = t;
      r[i] = -t;
    }
  }
  const size_t bytes = inner_->Compress(tmp_.data(), segs, out);

  // Second half: -residual += sent, one segment at a time (the residuals are
  // separate buffers), relying on the wire being per-segment concatenated.
  size_t pos = 0;
  for (size_t j = 0; j < segs.size(); ++j) {
    single_[0].name = segs[j].name;  // a warm-up below reads its density by name
    single_[0].count = segs[j].count;
    inner_->DecompressAdd(out + pos, single_, seg_residuals_[j]);
    pos += inner_->CompressedBytes(single_);
    if (drop_nonfinite_) {
      float* r = seg_residuals_[j];
      for (int64_t i = 0; i < segs[j].count; ++i) r[i] = std::isfinite(r[i]) ? r[i] : 0.0f;
    }
  }
  return bytes;
}

void ErrorFeedback::Reset() {
  residuals_.clear();
  inner_->Reset();  // a warm-up inside starts over too
}

bool ErrorFeedback::GetResidual(const std::string& name, std::vector<float>* out) const {
  auto it = residuals_.find(name);
  if (it == residuals_.end()) return false;
  out->resize(it->second.size());
  for (size_t i = 0; i < it->second.size(); ++i) (*out)[i] = 0.0f - it->second[i];  // +0 rather than -0 for a zero residual
  return true;
}

}  // namespace hvdlite
