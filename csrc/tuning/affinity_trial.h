// Whether pinning the engine to its training thread's core pays, measured.
//
// A pinned engine shares its training thread's core: it works while that
// thread waits for the results, with the gradients in the core's own cache.
// Left to roam, it also works on cores that other ranks leave idle, but
// reads the gradients from another core's cache. Which is faster depends on
// how the host places its virtual CPUs at the moment: in interleaved train
// steps on one host, pinning was faster by 1 % in one period and slower by
// 5-10 % in another (docs/engine.md#engine-thread-affinity). So the engine
// tries both: it alternates pinned and unpinned in blocks of training steps,
// keeps the one with the shorter median step (roaming on a tie), and tries
// again after a while, starting with the arm it kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hvdlite {

class AffinityTrial {
 public:
  enum class Arm { kPinned, kUnpinned };

  // Steps per block: a block's arm holds for whole steps, so the switch
  // itself (made between steps) does not blur a sample.
  static constexpr int64_t kBlockSteps = 2;
  // Steps per arm before a choice: a step's time scatters by +-10 % on a
  // busy host; the medians of six tell apart the 5-10 % at stake.
  static constexpr size_t kStepsPerArm = 6;
  // Steps a choice holds before the next trial: a trial spends half its
  // steps on the slower arm, so one per 200 steps puts ~3 % of them there,
  // and still follows the host's slower changes.
  static constexpr int64_t kKeepSteps = 200;

  // A training step (the time from one step's first submission to the
  // next's) ran under arm(); returns the arm for the next step.
  Arm Record(double seconds);
  Arm arm() const { return arm_; }
  // Decisions so far, by the arm chosen.
  int64_t chose_pinned() const { return chose_[0]; }
  int64_t chose_unpinned() const { return chose_[1]; }

 private:
  static int Index(Arm arm) { return arm == Arm::kPinned ? 0 : 1; }
  void Decide();

  // The first trial starts roaming: where a job's engine lives for only a
  // few steps, that is the safer arm (it lost 1 % where the pin paid, the pin
  // lost 4-14 % where it did not).
  Arm arm_ = Arm::kUnpinned;
  bool trying_ = true;   // alternating; else keeping the chosen arm
  int64_t in_block_ = 0;      // steps of the current block (trying) or since the choice (kept)
  std::vector<double> steps_[2];  // step times of this trial, per arm
  int64_t chose_[2] = {0, 0};
};

}  // namespace hvdlite
