// Buckets that cross the wire dense. A direct bucket is one tensor reduced
// from its own buffers, with no copy; a staged bucket packs its tensors into
// a fusion buffer (16-bit floats widened to float32, summed and rounded
// once) and unpacks the result; a fused bucket is a staged bucket reduced by
// one allreduce. The buckets that a collective of their own compresses
// (exchange_buckets.h) are staged the same way.
#pragma once

#include "allreduce/bucket_strategy.h"
#include "ops/operation_context.h"

namespace hvdlite {

class DirectBucket : public BucketStrategy {
 public:
  explicit DirectBucket(OperationContext* ctx) : ctx_(ctx) {}
  Status Prepare(Bucket& b, TransportWork* in_flight) override;
  const char* Activity(const Bucket& b) const override;
  Status Start(Bucket& b) override;
  void Finish(Bucket& b, TransportWork* in_flight) override;

 private:
  OperationContext* ctx_;
};

class StagedBucket : public BucketStrategy {
 public:
  explicit StagedBucket(OperationContext* ctx) : ctx_(ctx) {}
  Status Prepare(Bucket& b, TransportWork* in_flight) override;
  void Finish(Bucket& b, TransportWork* in_flight) override;

 protected:
  OperationContext* ctx_;
};

class FusedBucket : public StagedBucket {
 public:
  using StagedBucket::StagedBucket;
  const char* Activity(const Bucket& b) const override;
  Status Start(Bucket& b) override;
};

}  // namespace hvdlite
