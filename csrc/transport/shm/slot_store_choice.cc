#include "transport/shm/slot_store_choice.h"

#include <algorithm>

#include "common/median.h"

namespace hvdlite {

namespace {

SlotStores Other(SlotStores s) {
  return s == SlotStores::kCached ? SlotStores::kStreaming : SlotStores::kCached;
}

}  // namespace

SlotStoreChoice::SlotStoreChoice() {
  for (auto& s : samples_) s.reserve(kMaxSamples);
}

SlotStoreChoice::SlotStoreChoice(SlotStores fixed) : preferred_(fixed), adaptive_(false) {}

SlotStoreChoice SlotStoreChoice::For(Choice setting) {
  switch (setting) {
    case Choice::kOn: return SlotStoreChoice(SlotStores::kStreaming);
    case Choice::kOff: return SlotStoreChoice(SlotStores::kCached);
    case Choice::kAuto: break;
  }
  return SlotStoreChoice();
}

SlotStores SlotStoreChoice::For(uint64_t seq) const {
  return adaptive_ && seq % probe_every_ == 0 ? Other(preferred_) : preferred_;
}

void SlotStoreChoice::Record(uint64_t seq, int64_t ns, int64_t bytes) {
  if (!adaptive_ || bytes <= 0) return;
  const int kind = static_cast<int>(For(seq));
  auto& mine = samples_[kind];
  const float per_byte = static_cast<float>(ns) / static_cast<float>(bytes);
  // The latest kMaxSamples: between rare probes the preferred kind's
  // samples must describe the host as it is now.
  if (mine.size() < kMaxSamples) {
    mine.push_back(per_byte);
  } else {
    mine[next_[kind]] = per_byte;
    next_[kind] = (next_[kind] + 1) % kMaxSamples;
  }
  auto& probed = samples_[static_cast<int>(Other(preferred_))];
  auto& kept = samples_[static_cast<int>(preferred_)];
  if (probed.size() < kProbeSamples || kept.size() < kProbeSamples) return;
  // Medians: a step the scheduler interrupted (the core went to backward)
  // takes milliseconds instead of microseconds and must not decide.
  const float other = Median(probed), own = Median(kept);
  if (other < kSwitchRatio * own) {
    preferred_ = Other(preferred_);
    ++switches_;
    probe_every_ = kProbeEvery;
  } else if (other > kFarRatio * own) {
    probe_every_ = std::min(kProbeEveryMax, 2 * probe_every_);
  } else {
    probe_every_ = kProbeEvery;
  }
  probed.clear();
  kept.clear();
  next_[0] = next_[1] = 0;
}

}  // namespace hvdlite
