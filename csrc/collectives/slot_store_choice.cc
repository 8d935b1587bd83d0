#include "slot_store_choice.h"

#include <algorithm>

namespace hvdlite {

namespace {

float Median(std::vector<float>& v) {
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

SlotStores Other(SlotStores s) {
  return s == SlotStores::kCached ? SlotStores::kStreaming : SlotStores::kCached;
}

}  // namespace

SlotStoreChoice::SlotStoreChoice() {
  for (auto& s : samples_) s.reserve(kMaxSamples);
}

SlotStoreChoice::SlotStoreChoice(SlotStores fixed) : preferred_(fixed), adaptive_(false) {}

SlotStores SlotStoreChoice::For(uint64_t seq) const {
  return adaptive_ && seq % kProbeEvery == 0 ? Other(preferred_) : preferred_;
}

void SlotStoreChoice::Record(uint64_t seq, int64_t ns, int64_t bytes) {
  if (!adaptive_ || bytes <= 0) return;
  auto& mine = samples_[static_cast<int>(For(seq))];
  if (mine.size() < kMaxSamples) mine.push_back(static_cast<float>(ns) / static_cast<float>(bytes));
  auto& probed = samples_[static_cast<int>(Other(preferred_))];
  auto& kept = samples_[static_cast<int>(preferred_)];
  if (probed.size() < kProbeSamples || kept.size() < kProbeSamples) return;
  // Medians: a step the scheduler interrupted (the core went to backward)
  // takes milliseconds instead of microseconds and must not decide.
  if (Median(probed) < kSwitchRatio * Median(kept)) {
    preferred_ = Other(preferred_);
    ++switches_;
  }
  probed.clear();
  kept.clear();
}

}  // namespace hvdlite
