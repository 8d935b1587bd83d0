// Checks of AffinityTrial (affinity_trial.h), the choice between a pinned and
// a roaming engine thread from timed training steps: the arms alternate in
// blocks, starting roaming, the shorter median wins (outliers do not decide,
// a tie roams), the choice holds for kKeepSteps and is then tried again from
// the arm kept; and of Median (median.h).
#include <cstdint>
#include <vector>

#include "tuning/affinity_trial.h"
#include "check.h"
#include "common/median.h"

using namespace hvdlite;

namespace {

using Arm = AffinityTrial::Arm;

// Runs steps until a choice, timing each with `pinned` / `unpinned` seconds
// (or what `time` returns for the step's index and arm); returns the arms
// the steps ran under.
template <typename Time>
std::vector<Arm> UntilChoice(AffinityTrial& trial, Time time) {
  std::vector<Arm> arms;
  const int64_t before = trial.chose_pinned() + trial.chose_unpinned();
  for (int i = 0; i < 100 && trial.chose_pinned() + trial.chose_unpinned() == before; ++i) {
    arms.push_back(trial.arm());
    trial.Record(time(i, trial.arm()));
  }
  return arms;
}

void TestAlternates() {
  AffinityTrial trial;
  CHECK(trial.arm() == Arm::kUnpinned, "starts roaming");
  auto arms = UntilChoice(trial, [](int, Arm) { return 0.1; });
  const size_t steps = 2 * AffinityTrial::kStepsPerArm;
  CHECK(arms.size() == steps, "a choice after %zu steps, got %zu", steps, arms.size());
  for (size_t i = 0; i < arms.size(); ++i) {
    const Arm want = (i / AffinityTrial::kBlockSteps) % 2 == 0 ? Arm::kUnpinned : Arm::kPinned;
    CHECK(arms[i] == want, "step %zu ran %s", i, arms[i] == Arm::kPinned ? "pinned" : "unpinned");
  }
  CHECK(trial.chose_unpinned() == 1 && trial.arm() == Arm::kUnpinned, "a tie roams");
}

void TestShorterMedianWins() {
  for (Arm faster : {Arm::kPinned, Arm::kUnpinned}) {
    AffinityTrial trial;
    UntilChoice(trial, [faster](int, Arm arm) { return arm == faster ? 0.100 : 0.105; });
    CHECK(trial.arm() == faster, "5 %% faster %s lost", faster == Arm::kPinned ? "pinned" : "unpinned");
  }
}

void TestOutliers() {
  // The pinned arm is faster, but two of its steps include a pause (an
  // evaluation, a checkpoint): the medians still pick it.
  AffinityTrial trial;
  int pinned_steps = 0;
  UntilChoice(trial, [&](int, Arm arm) {
    if (arm == Arm::kUnpinned) return 0.110;
    return ++pinned_steps % 3 == 0 ? 5.0 : 0.100;
  });
  CHECK(trial.arm() == Arm::kPinned && trial.chose_pinned() == 1, "outliers decided");
}

void TestKeepsThenTriesAgain() {
  AffinityTrial trial;
  UntilChoice(trial, [](int, Arm arm) { return arm == Arm::kUnpinned ? 0.09 : 0.10; });
  CHECK(trial.arm() == Arm::kUnpinned, "unpinned was faster");
  bool kept = true;
  for (int64_t i = 0; i + 1 < AffinityTrial::kKeepSteps; ++i) {
    kept = kept && trial.Record(0.5) == Arm::kUnpinned;   // slow steps do not count while kept
  }
  CHECK(kept, "the choice did not hold for %d steps", static_cast<int>(AffinityTrial::kKeepSteps));
  CHECK(trial.Record(0.1) == Arm::kUnpinned, "a new trial starts with the arm kept");
  // The host changed: now the pin is faster.
  auto arms = UntilChoice(trial, [](int, Arm arm) { return arm == Arm::kPinned ? 0.08 : 0.10; });
  CHECK(arms.size() == 2 * AffinityTrial::kStepsPerArm && arms.front() == Arm::kUnpinned &&
            arms[AffinityTrial::kBlockSteps] == Arm::kPinned,
        "the second trial alternated otherwise");
  CHECK(trial.arm() == Arm::kPinned, "the second trial missed the change");
  CHECK(trial.chose_pinned() == 1 && trial.chose_unpinned() == 1, "counts %lld / %lld",
        static_cast<long long>(trial.chose_pinned()), static_cast<long long>(trial.chose_unpinned()));
}

void TestMedian() {
  CHECK(Median(std::vector<double>{}) == 0.0, "empty");
  CHECK(Median(std::vector<double>{3.0}) == 3.0, "one value");
  CHECK(Median(std::vector<double>{5.0, 1.0, 3.0}) == 3.0, "odd count");
  CHECK(Median(std::vector<double>{4.0, 1.0, 3.0, 2.0}) == 2.5, "even count: the mean of the middle two");
  CHECK(Median(std::vector<float>{1.0f, 100.0f, 2.0f, 3.0f, 2.5f}) == 2.5f, "an outlier does not move it");
}

}  // namespace

int main() {
  return hvdlite_test::RunTests({{"alternates", TestAlternates},
                                 {"shorter_median_wins", TestShorterMedianWins},
                                 {"outliers", TestOutliers},
                                 {"keeps_then_tries_again", TestKeepsThenTriesAgain},
                                 {"median", TestMedian}});
}
