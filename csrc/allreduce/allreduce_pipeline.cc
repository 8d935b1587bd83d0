#include "allreduce/allreduce_pipeline.h"

#include <algorithm>

#include "kernels/scale.h"
#include "timeline/timeline_names.h"

namespace hvdlite {

AllreducePipeline::Round AllreducePipeline::PlanRound(Transport& wire,
                                                      const std::vector<TensorEntry*>& entries) {
  Round round;
  round.compressor = ctx_->compressors.For(EffectiveCompression(entries[0]->request));
  if (round.compressor == nullptr) return round;
  if (round.compressor->wire() == Compressor::Wire::kExchange) {
    // An exchange of its own runs over the whole set (PowerSGD's factors
    // describe whole matrices, not a host's block of them).
    round.form = Form::kExchange;
  } else if (wire.GetHostLevels(&round.levels)) {
    round.form = Form::kAcrossHosts;
    return round;  // between hosts, each block begins its own round
  } else {
    round.form = Form::kCompressed;
  }
  std::vector<Segment> segs;
  for (TensorEntry* e : entries) segs.push_back(SegmentOf(*e, 0));
  round.compressor->BeginRound(segs);
  return round;
}

std::vector<BucketPlan> AllreducePipeline::PlanBucketsOf(const Round& round,
                                                         const std::vector<TensorEntry*>& entries) {
  const DataType dtype = entries[0]->request.dtype;
  const bool dense_as_is = round.compressor == nullptr && !Is16BitFloat(dtype);
  const int64_t staged_elem = dense_as_is ? static_cast<int64_t>(DataTypeSize(dtype)) : 4;
  std::vector<PlanItem> items;
  for (TensorEntry* e : entries) {
    PlanItem item;
    item.count = NumElements(e->request.shape);
    item.bytes = item.count * staged_elem;
    // Top-k's wire form (value + index) is larger than the dense input at
    // high ratios; the bucket must fit one wire call too.
    if (round.form == Form::kCompressed) {
      item.bytes = std::max<int64_t>(item.bytes, round.compressor->CompressedBytes(OneSegment(*e, item.count)));
    }
    items.push_back(item);
  }
  BucketLimits limits;
  limits.fusion_threshold_bytes = ctx_->options.fusion_threshold_bytes;
  limits.direct_threshold_bytes = ctx_->options.direct_threshold_bytes;
  return PlanBuckets(items, dense_as_is, limits);
}

BucketStrategy* AllreducePipeline::StrategyFor(const Round& round, BucketPlan::Kind kind) {
  if (kind == BucketPlan::Kind::kDirect) return &direct_;
  switch (round.form) {
    case Form::kCompressed: return &compressed_;
    case Form::kExchange: return &exchange_;
    case Form::kAcrossHosts: return &across_hosts_;
    default: return &fused_;
  }
}

Status AllreducePipeline::Run(Transport& wire, const std::vector<TensorEntry*>& entries) {
  const Request& first = entries[0]->request;
  const Round round = PlanRound(wire, entries);
  // Chunked tensors first, each alone; then the buckets, pipelined.
  std::vector<Bucket> buckets;
  for (const BucketPlan& plan : PlanBucketsOf(round, entries)) {
    if (plan.kind == BucketPlan::Kind::kChunked) {
      TensorEntry& e = *entries[plan.items[0]];
      Status s = RunChunked(wire, e);
      ctx_->stats->Add(ctx_->stats->tensors, 1);
      if (!s.ok()) {
        e.work->Fail(s);
        return s;
      }
      e.work->Finish();
      continue;
    }
    buckets.emplace_back();
    Bucket& b = buckets.back();
    b.strategy = StrategyFor(round, plan.kind);
    b.wire = &wire;
    for (size_t i : plan.items) b.entries.push_back(entries[i]);
    b.dtype = first.dtype;
    b.op = first.reduce_op;
    b.compressor = round.compressor;
    b.compression = EffectiveCompression(first).type;
    b.levels = round.levels;
    b.count = plan.count;
    b.slot = static_cast<int>(buckets.size() - 1) % FusionBuffer::kSlots;
  }
  return RunBuckets(buckets);
}

Status AllreducePipeline::RunBuckets(std::vector<Bucket>& buckets) {
  Status status;
  for (size_t i = 0; i < buckets.size(); ++i) {
    TransportWork* previous = i > 0 ? buckets[i - 1].work.get() : nullptr;
    if ((status = Prepare(buckets[i], previous)).ok()) status = Start(buckets[i]);
    if (status.ok() && i > 0) status = Finish(buckets[i - 1], buckets[i].work.get());
    if (!status.ok()) return status;
  }
  if (!buckets.empty()) status = Finish(buckets.back(), nullptr);
  return status;
}

Status AllreducePipeline::Prepare(Bucket& b, TransportWork* in_flight) {
  ctx_->Phase(b.entries, activity::kQueue, false);
  return b.strategy->Prepare(b, in_flight);
}

Status AllreducePipeline::Start(Bucket& b) {
  b.activity = b.strategy->Activity(b);
  ctx_->Phase(b.entries, b.activity, true);
  const Status s = b.strategy->Start(b);
  EngineStats* stats = ctx_->stats;
  stats->Add(stats->collectives, 1);
  stats->Add(stats->bytes_in, BytesIn(b.entries));
  if (s.ok() && b.work->done()) ctx_->Phase(b.entries, b.activity, false);
  return s;
}

Status AllreducePipeline::Finish(Bucket& b, TransportWork* in_flight) {
  Status s = b.work->Wait();
  if (!b.work->done()) ctx_->Phase(b.entries, b.activity, false);
  if (!s.ok()) return s;
  b.strategy->Finish(b, in_flight);
  ctx_->CompleteAllreduces(b.entries, b.compressor ? static_cast<int64_t>(b.wire_bytes) : b.count * 4);
  return Status::OK();
}

Status AllreducePipeline::RunChunked(Transport& wire, TensorEntry& e) {
  const Request& q = e.request;
  const int64_t count = NumElements(q.shape);
  ctx_->Phase({&e}, activity::kQueue, false);
  Status s;
  if (count > 0) {
    CopyScaled(e.input, e.output, count, q.dtype, q.prescale);
    s = ctx_->Timed(e, wire.Activity(OpType::kAllreduce, q.dtype, q.reduce_op),
                    [&] { return wire.Allreduce(e.output, count, q.dtype, q.reduce_op); });
    ctx_->stats->Add(ctx_->stats->collectives, 1);
    ctx_->stats->Add(WireBytes(ctx_->stats, CompressionType::kNone),
                     count * static_cast<int64_t>(DataTypeSize(q.dtype)));
    const double post = PostFactor(q, wire.size());
    if (s.ok() && post != 1.0) CopyScaled(e.output, e.output, count, q.dtype, post);
  }
  ctx_->Phase({&e}, OperationPhase(q), false);
  return s;
}

}  // namespace hvdlite
