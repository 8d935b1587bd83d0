#include "allreduce/bucket_planner.h"

#include <algorithm>
#include <climits>

namespace hvdlite {

std::vector<BucketPlan> PlanBuckets(const std::vector<PlanItem>& items, bool may_go_direct,
                                    const BucketLimits& limits) {
  // A bucket stays within one wire call's count.
  const int64_t threshold = std::min<int64_t>(limits.fusion_threshold_bytes, int64_t{1} << 30);
  const int64_t direct = limits.direct_threshold_bytes > 0
                             ? std::min(limits.direct_threshold_bytes, threshold)
                             : threshold;
  std::vector<BucketPlan> plans;
  int64_t open_bytes = 0;
  bool open = false;  // the last plan is a fused bucket that takes more
  for (size_t i = 0; i < items.size(); ++i) {
    const PlanItem& item = items[i];
    if (may_go_direct && item.bytes >= direct) {
      BucketPlan plan;
      plan.kind = item.count > INT_MAX ? BucketPlan::Kind::kChunked : BucketPlan::Kind::kDirect;
      plan.items.push_back(i);
      plan.count = item.count;
      plans.push_back(std::move(plan));
      open = false;
      continue;
    }
    if (!open || (open_bytes + item.bytes > threshold && !plans.back().items.empty())) {
      plans.emplace_back();
      open = true;
      open_bytes = 0;
    }
    plans.back().items.push_back(i);
    plans.back().count += item.count;
    open_bytes += item.bytes;
  }
  return plans;
}

}  // namespace hvdlite
