// Checks of csrc/allreduce/bucket_planner.h: which allreduces share a buffer. The
// rules one by one, then random item lists against the properties every
// plan must have (each item once, in order; fused buckets within the
// threshold unless one item alone exceeds it; direct and chunked items alone).
#include <climits>
#include <cstdint>
#include <random>
#include <vector>

#include "allreduce/bucket_planner.h"
#include "check.h"

using namespace hvdlite;

namespace {

using Kind = BucketPlan::Kind;

BucketLimits Limits(int64_t fusion, int64_t direct) {
  BucketLimits l;
  l.fusion_threshold_bytes = fusion;
  l.direct_threshold_bytes = direct;
  return l;
}

std::vector<PlanItem> Items(std::initializer_list<int64_t> bytes) {
  std::vector<PlanItem> items;
  for (int64_t b : bytes) items.push_back(PlanItem{b / 4, b});
  return items;
}

void TestFusesUpToTheThreshold() {
  auto plans = PlanBuckets(Items({40, 40, 40, 40}), true, Limits(100, 1000));
  CHECK(plans.size() == 2, "%zu buckets", plans.size());
  if (plans.size() != 2) return;
  CHECK(plans[0].kind == Kind::kFused && plans[0].items == std::vector<size_t>({0, 1}) && plans[0].count == 20,
        "first two share a buffer");
  CHECK(plans[1].items == std::vector<size_t>({2, 3}), "the rest the next");
  plans = PlanBuckets(Items({100}), false, Limits(100, 0));
  CHECK(plans.size() == 1 && plans[0].kind == Kind::kFused, "exactly the threshold fits");
  plans = PlanBuckets(Items({150, 10}), false, Limits(100, 0));
  CHECK(plans.size() == 2 && plans[0].items == std::vector<size_t>({0}),
        "an item larger than the threshold gets a bucket of its own (nothing else fits)");
  CHECK(PlanBuckets({}, true, Limits(100, 10)).empty(), "no items, no buckets");
}

void TestDirectAndChunked() {
  auto plans = PlanBuckets(Items({8, 64, 8, 8}), true, Limits(100, 64));
  CHECK(plans.size() == 3, "%zu buckets", plans.size());
  if (plans.size() == 3) {
    CHECK(plans[0].kind == Kind::kFused && plans[0].items == std::vector<size_t>({0}), "before");
    CHECK(plans[1].kind == Kind::kDirect && plans[1].items == std::vector<size_t>({1}), "direct alone");
    CHECK(plans[2].kind == Kind::kFused && plans[2].items == std::vector<size_t>({2, 3}),
          "a direct bucket closes the open one");
  }
  plans = PlanBuckets(Items({8, 64}), false, Limits(100, 64));
  CHECK(plans.size() == 1 && plans[0].kind == Kind::kFused, "compressed or widened: never direct");
  plans = PlanBuckets(Items({50}), true, Limits(100, 0));
  CHECK(plans.size() == 1 && plans[0].kind == Kind::kFused, "direct threshold 0: the fusion threshold");
  plans = PlanBuckets(Items({100}), true, Limits(100, 0));
  CHECK(plans.size() == 1 && plans[0].kind == Kind::kDirect, "at the fusion threshold: direct");
  std::vector<PlanItem> huge = {PlanItem{int64_t{INT_MAX} + 1, (int64_t{INT_MAX} + 1) * 4}, PlanItem{1, 4}};
  plans = PlanBuckets(huge, true, Limits(int64_t{4} << 30, 0));
  CHECK(plans.size() == 2 && plans[0].kind == Kind::kChunked && plans[1].kind == Kind::kFused,
        "beyond INT_MAX elements: chunked; the fusion threshold is capped at 2^30 bytes");
}

void TestZeroThresholdDisablesFusion() {
  auto plans = PlanBuckets(Items({4, 4, 4}), false, Limits(0, 0));
  CHECK(plans.size() == 3, "HOROVOD_FUSION_THRESHOLD=0: one tensor per bucket, %zu", plans.size());
}

void TestRandomPlansKeepTheRules() {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t fusion = std::uniform_int_distribution<int64_t>(0, 4096)(rng);
    const int64_t direct = std::uniform_int_distribution<int64_t>(0, 4096)(rng);
    const bool may_go_direct = rng() % 2 == 0;
    std::vector<PlanItem> items(std::uniform_int_distribution<size_t>(0, 40)(rng));
    for (auto& item : items) {
      item.count = std::uniform_int_distribution<int64_t>(0, 1500)(rng);
      item.bytes = item.count * 4;
    }
    const auto plans = PlanBuckets(items, may_go_direct, Limits(fusion, direct));
    const int64_t cut = direct > 0 ? std::min(direct, fusion) : fusion;
    size_t next = 0;
    bool ok = true;
    for (const auto& p : plans) {
      int64_t bytes = 0, count = 0;
      ok &= !p.items.empty();
      for (size_t i : p.items) {
        ok &= i == next++;  // every item once, in order
        bytes += items[i].bytes;
        count += items[i].count;
      }
      ok &= count == p.count;
      if (p.kind == Kind::kFused) {
        ok &= bytes <= fusion || p.items.size() == 1;
        for (size_t i : p.items) ok &= !(may_go_direct && items[i].bytes >= cut);
      } else {
        ok &= p.items.size() == 1 && may_go_direct && items[p.items[0]].bytes >= cut;
      }
    }
    ok &= next == items.size();
    CHECK(ok, "trial %d: fusion %lld direct %lld", trial, static_cast<long long>(fusion),
          static_cast<long long>(direct));
    if (!ok) return;
  }
}

}  // namespace

int main() {
  return hvdlite_test::RunTests({{"fuses_up_to_the_threshold", TestFusesUpToTheThreshold},
                                 {"direct_and_chunked", TestDirectAndChunked},
                                 {"zero_threshold_disables_fusion", TestZeroThresholdDisablesFusion},
                                 {"random_plans_keep_the_rules", TestRandomPlansKeepTheRules}});
}
