#include "tuning/affinity_trial.h"

#include "common/median.h"

namespace hvdlite {

AffinityTrial::Arm AffinityTrial::Record(double seconds) {
  ++in_block_;
  if (!trying_) {
    if (in_block_ >= kKeepSteps) {
      trying_ = true;
      in_block_ = 0;
    }
    return arm_;
  }
  steps_[Index(arm_)].push_back(seconds);
  if (steps_[0].size() >= kStepsPerArm && steps_[1].size() >= kStepsPerArm) {
    Decide();
  } else if (in_block_ >= kBlockSteps) {
    in_block_ = 0;
    arm_ = arm_ == Arm::kPinned ? Arm::kUnpinned : Arm::kPinned;
  }
  return arm_;
}

void AffinityTrial::Decide() {
  arm_ = Median(steps_[0]) < Median(steps_[1]) ? Arm::kPinned : Arm::kUnpinned;
  ++chose_[Index(arm_)];
  steps_[0].clear();
  steps_[1].clear();
  trying_ = false;
  in_block_ = 0;
}

}  // namespace hvdlite
