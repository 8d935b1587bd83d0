// Which allreduces of one round share a buffer. A pure function of sizes and
// thresholds, identical on every rank (ranks must make the same calls in the
// same order), and tested on its own (tests/cpp/test_bucket_planner.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hvdlite {

struct BucketLimits {
  int64_t fusion_threshold_bytes = 0;  // most bytes fused into one bucket
  // Tensors at least this large skip the fusion buffer (0: the fusion threshold).
  int64_t direct_threshold_bytes = 0;
};

// One tensor as the planner sees it.
struct PlanItem {
  int64_t count = 0;  // elements
  int64_t bytes = 0;  // what it takes in a bucket: staged, or its wire form if larger
};

struct BucketPlan {
  enum class Kind {
    kFused,    // items packed into a fusion buffer
    kDirect,   // one item, reduced from its own buffers (no copy)
    kChunked,  // one item beyond one wire call's count (INT_MAX): reduced alone, in pieces
  };
  Kind kind = Kind::kFused;
  std::vector<size_t> items;  // indices into the planned list, in order
  int64_t count = 0;          // elements of all its items
};

// Items in order into buckets: each fused bucket takes items until the next
// would pass the fusion threshold (capped at 2^30 bytes, one wire call); with
// `may_go_direct` (no compression, no widening), items of at least the direct
// threshold get a direct bucket of their own, or a chunked one beyond INT_MAX
// elements. Every item is in exactly one bucket; empty input, no buckets.
std::vector<BucketPlan> PlanBuckets(const std::vector<PlanItem>& items, bool may_go_direct,
                                    const BucketLimits& limits);

}  // namespace hvdlite
