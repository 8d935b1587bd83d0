// Element-wise allreduces agreed in one round, with one dtype, op and
// compression: planned into buckets (bucket_planner.h), each bucket run by
// the strategy of its kind (bucket_strategy.h), and pipelined, so bucket
// i+1 is packed (or compressed) while bucket i is on the wire, and bucket i
// is unpacked while i+1 is. Tensors at least the direct threshold go on the
// wire from their own buffers, with no copy. Where the set spans several
// hosts with several ranks each, compressed buckets are summed exactly
// inside each host and compressed only between hosts
// (host_compressed_allreduce.h).
#pragma once

#include <vector>

#include "allreduce/bucket_planner.h"
#include "allreduce/bucket_strategy.h"
#include "allreduce/compressed_bucket.h"
#include "allreduce/dense_buckets.h"
#include "allreduce/exchange_buckets.h"
#include "ops/operation_context.h"

namespace hvdlite {

class AllreducePipeline {
 public:
  explicit AllreducePipeline(OperationContext* ctx)
      : ctx_(ctx), direct_(ctx), fused_(ctx), compressed_(ctx), exchange_(ctx), across_hosts_(ctx) {}

  // Reduces `entries` over `wire` (the process set's). Completes every
  // entry's handle on success; a non-OK result means the wire can no longer
  // be trusted (the caller fails what is left).
  Status Run(Transport& wire, const std::vector<TensorEntry*>& entries);

 private:
  // How the round's tensors cross the wire, the same for all its buckets
  // but the direct and chunked ones.
  enum class Form { kDense, kCompressed, kExchange, kAcrossHosts };
  struct Round {
    Form form = Form::kDense;
    Compressor* compressor = nullptr;
    HostLevels levels;
  };

  Round PlanRound(Transport& wire, const std::vector<TensorEntry*>& entries);
  std::vector<BucketPlan> PlanBucketsOf(const Round& round, const std::vector<TensorEntry*>& entries);
  BucketStrategy* StrategyFor(const Round& round, BucketPlan::Kind kind);
  // The buckets one after another, each one's wire work overlapping the
  // next one's staging and the previous one's unstaging.
  Status RunBuckets(std::vector<Bucket>& buckets);
  // `in_flight`: the previous bucket's wire work, nudged between copies.
  Status Prepare(Bucket& bucket, TransportWork* in_flight);
  Status Start(Bucket& bucket);
  Status Finish(Bucket& bucket, TransportWork* in_flight);
  // A tensor beyond one wire call: scaled in place and reduced in pieces.
  Status RunChunked(Transport& wire, TensorEntry& entry);

  OperationContext* ctx_;
  DirectBucket direct_;
  FusedBucket fused_;
  CompressedBucket compressed_;
  ExchangeBucket exchange_;
  AcrossHostsBucket across_hosts_;
};

}  // namespace hvdlite
