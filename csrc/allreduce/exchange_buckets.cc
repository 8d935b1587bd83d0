#include "allreduce/exchange_buckets.h"

namespace hvdlite {

namespace {

std::vector<Segment> SegmentsOf(const Bucket& b) {
  std::vector<Segment> segs;
  for (size_t i = 0; i < b.entries.size(); ++i) segs.push_back(SegmentOf(*b.entries[i], b.offsets[i]));
  return segs;
}

}  // namespace

const char* ExchangeBucket::Activity(const Bucket& b) const {
  return b.wire->Activity(OpType::kAllreduce, DataType::kFloat32, ReduceOp::kSum);
}

Status ExchangeBucket::Start(Bucket& b) {
  int64_t sent = 0;
  b.work = std::make_unique<DoneWork>(
      b.compressor->Exchange(*b.wire, reinterpret_cast<float*>(b.staged), SegmentsOf(b), &sent));
  b.wire_bytes = static_cast<size_t>(sent);
  ctx_->stats->Add(WireBytes(ctx_->stats, b.compression), sent);
  return Status::OK();
}

const char* AcrossHostsBucket::Activity(const Bucket& b) const {
  return b.wire->Activity(OpType::kAllreduce, DataType::kFloat32, ReduceOp::kSum);
}

Status AcrossHostsBucket::Start(Bucket& b) {
  int64_t sent = 0;
  b.work = std::make_unique<DoneWork>(across_hosts_.Run(b.levels, b.compressor,
                                                        reinterpret_cast<float*>(b.staged), b.count,
                                                        SegmentsOf(b), &sent));
  b.wire_bytes = static_cast<size_t>(sent);
  ctx_->stats->Add(WireBytes(ctx_->stats, b.compression), sent);
  return Status::OK();
}

}  // namespace hvdlite
