#include "compressors/momentum_correction.h"

#include <cstdio>

namespace hvdlite {

MomentumCorrection::MomentumCorrection(std::unique_ptr<Compressor> inner, double momentum)
    : CompressorDecorator(std::move(inner)), momentum_(static_cast<float>(momentum)), single_(1) {}

std::string MomentumCorrection::Describe() const {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "+momentum(%g)", static_cast<double>(momentum_));
  return inner_->Describe() + buf;
}

size_t MomentumCorrection::Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) {
  size_t pos = 0;
  for (const Segment& s : segs) {
    std::vector<float>& u = velocity_[s.name];
    if (static_cast<int64_t>(u.size()) != s.count) u.assign(static_cast<size_t>(s.count), 0.0f);
    const float* g = input + s.offset;
    for (int64_t i = 0; i < s.count; ++i) u[i] = momentum_ * u[i] + g[i];
    single_[0] = s;
    single_[0].offset = 0;
    const size_t bytes = inner_->Compress(u.data(), single_, out + pos);
    if (bytes == 0 && s.count > 0) return 0;
    pos += bytes;
    // Momentum factor masking: what was sent leaves the velocity too. Not
    // where everything is sent (small tensors, a dense warm-up round): there
    // the velocity goes on as the optimizer's momentum would, or those
    // tensors would train with no momentum at all. An entry sent with the
    // value 0 is indistinguishable here, and its velocity is (all but) 0.
    if (!inner_->Sparsifies(single_[0])) continue;
    sent_.resize(static_cast<size_t>(s.count));
    inner_->Decompress(out + pos - bytes, single_, sent_.data());
    for (int64_t i = 0; i < s.count; ++i) {
      if (sent_[i] != 0.0f) u[i] = 0.0f;
    }
  }
  return pos;
}

void MomentumCorrection::Reset() {
  velocity_.clear();
  inner_->Reset();
}

bool MomentumCorrection::GetVelocity(const std::string& name, std::vector<float>* out) const {
  auto it = velocity_.find(name);
  if (it == velocity_.end()) return false;
  *out = it->second;
  return true;
}

}  // namespace hvdlite
