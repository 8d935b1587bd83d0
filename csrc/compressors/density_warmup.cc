#include "compressors/density_warmup.h"

#include <cmath>
#include <cstdio>

namespace hvdlite {

DensityWarmup::DensityWarmup(std::unique_ptr<TopKCompressor> topk, int64_t steps)
    : topk_(std::move(topk)), target_(topk_->ratio()), steps_(steps), single_(1) {}

std::string DensityWarmup::Describe() const {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "+warmup(%lld)", static_cast<long long>(steps_));
  return topk_->Describe() + buf;
}

double DensityWarmup::RatioAt(int64_t round) const {
  if (round >= steps_) return target_;
  return std::pow(target_, static_cast<double>(round) / static_cast<double>(steps_));
}

double DensityWarmup::RatioOf(const std::string& name) const {
  auto it = progress_.find(name);
  return it == progress_.end() ? target_ : it->second.ratio;
}

void DensityWarmup::BeginRound(const std::vector<Segment>& segs) {
  for (const Segment& s : segs) {
    Progress& p = progress_[s.name];
    p.ratio = RatioAt(p.rounds++);
  }
}

size_t DensityWarmup::CompressedBytes(const std::vector<Segment>& segs) const {
  size_t bytes = 0;
  for (const Segment& s : segs) bytes += SegmentBytes(s);
  return bytes;
}

template <typename Call>
void DensityWarmup::EachAtItsDensity(const std::vector<Segment>& segs, Call call) {
  size_t pos = 0;
  for (const Segment& s : segs) {
    topk_->set_ratio(RatioOf(s.name));
    single_[0] = s;
    call(pos);
    pos += SegmentBytes(s);
  }
  topk_->set_ratio(target_);
}

size_t DensityWarmup::Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) {
  bool fits = true;
  size_t total = 0;
  EachAtItsDensity(segs, [&](size_t pos) {
    const size_t bytes = SegmentBytes(single_[0]);
    if (bytes > 0 && topk_->Compress(input, single_, out + pos) != bytes) fits = false;  // too large for top-k
    total = pos + bytes;
  });
  return fits ? total : 0;
}

void DensityWarmup::Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) {
  EachAtItsDensity(segs, [&](size_t pos) { topk_->Decompress(in + pos, single_, out); });
}

void DensityWarmup::DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs, float* out) {
  EachAtItsDensity(segs, [&](size_t pos) { topk_->DecompressAdd(in + pos, single_, out); });
}

void DensityWarmup::Reset() {
  progress_.clear();
  topk_->Reset();
}

}  // namespace hvdlite
