#include "ops/allreduce_pipeline.h"

#include <algorithm>
#include <cstring>

#include "ops/bucket_planner.h"
#include "kernels/scale.h"
#include "timeline/timeline_names.h"

namespace hvdlite {

namespace {

constexpr int64_t kCopyChunkBytes = 1 << 20;  // wire progress between chunks

// A copy long enough to starve the previous bucket's wire work is split, and
// the work is nudged between pieces (MPI progresses only inside MPI calls).
void CopyWithProgress(const void* in, void* out, int64_t count, DataType dtype, double factor,
                      TransportWork* in_flight) {
  const int64_t elem = static_cast<int64_t>(DataTypeSize(dtype));
  const int64_t chunk = in_flight ? std::max<int64_t>(1, kCopyChunkBytes / elem) : count;
  for (int64_t done = 0; done < count; done += chunk) {
    const int64_t n = std::min(chunk, count - done);
    CopyScaled(static_cast<const uint8_t*>(in) + done * elem, static_cast<uint8_t*>(out) + done * elem,
               n, dtype, factor);
    if (in_flight) in_flight->Progress();
  }
}

}  // namespace

struct AllreducePipeline::Bucket {
  std::vector<TensorEntry*> entries;
  std::vector<int64_t> offsets;  // elements (staged dense) or bytes (wire form)
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Compressor* compressor = nullptr;
  CompressionType compression = CompressionType::kNone;
  bool direct = false;  // one tensor straight from its own buffers
  bool across_hosts = false;  // compressed between hosts only: staged dense
  bool exchange = false;      // the compressor's own exchange (PowerSGD): staged dense
  HostLevels levels;
  int slot = 0;
  int64_t count = 0;      // elements
  size_t wire_bytes = 0;  // per rank
  uint8_t* staged = nullptr;
  uint8_t* gathered = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  std::unique_ptr<TransportWork> work;  // the wire's part, started by Start
  const char* activity = "";            // its timeline name
};

Status AllreducePipeline::Run(ProcessSet& set, const std::vector<TensorEntry*>& entries) {
  const Request& first = entries[0]->request;
  Compressor* compressor = ctx_->compressors.For(EffectiveCompression(first));
  const bool exchange = compressor && compressor->wire() == Compressor::Wire::kExchange;
  HostLevels levels;
  // An exchange of its own runs over the whole set (PowerSGD's factors
  // describe whole matrices, not a host's block of them).
  const bool across_hosts = compressor && !exchange && set.transport().GetHostLevels(&levels);
  if (compressor && !across_hosts) {  // between hosts, each block begins its own round
    std::vector<Segment> segs;
    for (TensorEntry* e : entries) segs.push_back(SegmentOf(*e, 0));
    compressor->BeginRound(segs);
  }
  const bool widen = Is16BitFloat(first.dtype);
  const int64_t staged_elem = (compressor || widen) ? 4 : static_cast<int64_t>(DataTypeSize(first.dtype));
  std::vector<PlanItem> items;
  for (TensorEntry* e : entries) {
    PlanItem item;
    item.count = NumElements(e->request.shape);
    item.bytes = item.count * staged_elem;
    // Top-k's wire form (value + index) is larger than the dense input at
    // high ratios; the bucket must fit one wire call too.
    if (compressor && !across_hosts && !exchange) {
      item.bytes = std::max<int64_t>(item.bytes, compressor->CompressedBytes(OneSegment(*e, item.count)));
    }
    items.push_back(item);
  }
  BucketLimits limits;
  limits.fusion_threshold_bytes = ctx_->options.fusion_threshold_bytes;
  limits.direct_threshold_bytes = ctx_->options.direct_threshold_bytes;
  const std::vector<BucketPlan> plans = PlanBuckets(items, !compressor && !widen, limits);

  // Chunked tensors first, each alone; then the buckets, pipelined.
  std::vector<Bucket> buckets;
  for (const BucketPlan& plan : plans) {
    if (plan.kind == BucketPlan::Kind::kChunked) {
      TensorEntry& e = *entries[plan.items[0]];
      Status s = RunChunked(set, e);
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
    for (size_t i : plan.items) b.entries.push_back(entries[i]);
    b.dtype = first.dtype;
    b.op = first.reduce_op;
    b.compressor = compressor;
    b.compression = EffectiveCompression(first).type;
    b.direct = plan.kind == BucketPlan::Kind::kDirect;
    b.across_hosts = across_hosts;
    b.exchange = exchange;
    b.levels = levels;
    b.count = plan.count;
    b.slot = static_cast<int>(buckets.size() - 1) % FusionBuffer::kSlots;
  }
  Status status;
  for (size_t i = 0; i < buckets.size(); ++i) {
    TransportWork* previous = i > 0 ? buckets[i - 1].work.get() : nullptr;
    if ((status = Prepare(set, buckets[i], previous)).ok()) status = Start(set, buckets[i]);
    if (status.ok() && i > 0) status = Finish(set, buckets[i - 1], buckets[i].work.get());
    if (!status.ok()) return status;
  }
  if (!buckets.empty()) status = Finish(set, buckets.back(), nullptr);
  return status;
}

Status AllreducePipeline::Prepare(ProcessSet& set, Bucket& b, TransportWork* in_flight) {
  ctx_->Phase(b.entries, activity::kQueue, false);
  if (b.direct) {
    TensorEntry& e = *b.entries[0];
    const Request& q = e.request;
    if (q.prescale != 1.0 || e.input == e.output) {
      CopyScaled(e.input, e.output, b.count, q.dtype, q.prescale);
      b.send = Transport::kInPlace;
    } else {
      b.send = e.input;  // zero-copy: the wire reads the caller's input directly
    }
    b.recv = e.output;
    return Status::OK();
  }
  if (b.compressor == nullptr || b.across_hosts || b.exchange) {
    const bool widen = Is16BitFloat(b.dtype);
    const int64_t elem = widen ? 4 : static_cast<int64_t>(DataTypeSize(b.dtype));
    b.staged = ctx_->buffers.Get(FusionBuffer::kSend, b.slot, static_cast<size_t>(b.count * elem));
    if (!b.staged) return OutOfMemory("a fusion buffer", static_cast<size_t>(b.count * elem));
    ctx_->Phase(b.entries, activity::kMemcpyInFusionBuffer, true);
    int64_t offset = 0;
    for (TensorEntry* e : b.entries) {
      const int64_t n = NumElements(e->request.shape);
      b.offsets.push_back(offset);
      if (widen) {
        WidenToFloat(e->input, reinterpret_cast<float*>(b.staged) + offset, n, b.dtype, e->request.prescale);
        if (in_flight) in_flight->Progress();
      } else {
        CopyWithProgress(e->input, b.staged + offset * elem, n, b.dtype, e->request.prescale, in_flight);
      }
      offset += n;
    }
    ctx_->Phase(b.entries, activity::kMemcpyInFusionBuffer, false);
    b.send = Transport::kInPlace;
    b.recv = b.staged;
    return Status::OK();
  }
  // Compressed: each tensor is one segment, so residuals follow tensor names.
  size_t wire = 0;
  for (TensorEntry* e : b.entries) {
    wire += b.compressor->CompressedBytes(OneSegment(*e, NumElements(e->request.shape)));
  }
  b.wire_bytes = wire;
  b.staged = ctx_->buffers.Get(FusionBuffer::kSend, b.slot, wire);
  if (!b.staged) return OutOfMemory("a compression buffer", wire);
  if (b.compressor->wire() == Compressor::Wire::kAllgather) {
    b.gathered = ctx_->buffers.Get(FusionBuffer::kGather, b.slot, wire * set.size());
    if (!b.gathered) return OutOfMemory("a gather buffer", wire * set.size());
  }
  ctx_->Phase(b.entries, activity::kCompress, true);
  size_t offset = 0;
  for (TensorEntry* e : b.entries) {
    const int64_t n = NumElements(e->request.shape);
    const float* src = static_cast<const float*>(e->input);
    if (e->request.prescale != 1.0) {
      ctx_->scratch_in.resize(static_cast<size_t>(n));
      CopyScaled(src, ctx_->scratch_in.data(), n, DataType::kFloat32, e->request.prescale);
      src = ctx_->scratch_in.data();
    }
    b.offsets.push_back(static_cast<int64_t>(offset));
    offset += b.compressor->Compress(src, OneSegment(*e, n), b.staged + offset);
    if (in_flight) in_flight->Progress();
  }
  ctx_->Phase(b.entries, activity::kCompress, false);
  return Status::OK();
}

Status AllreducePipeline::Start(ProcessSet& set, Bucket& b) {
  Transport& wire = set.transport();
  EngineStats* stats = ctx_->stats;
  Status s;
  if (b.across_hosts) {
    // Synchronous: the host's phases and the exchange between hosts take turns.
    b.activity = wire.Activity(OpType::kAllreduce, DataType::kFloat32, ReduceOp::kSum);
    ctx_->Phase(b.entries, b.activity, true);
    std::vector<Segment> segs;
    for (size_t i = 0; i < b.entries.size(); ++i) segs.push_back(SegmentOf(*b.entries[i], b.offsets[i]));
    int64_t sent = 0;
    b.work = std::make_unique<DoneWork>(across_hosts_.Run(b.levels, b.compressor,
                                                          reinterpret_cast<float*>(b.staged), b.count,
                                                          segs, &sent));
    b.wire_bytes = static_cast<size_t>(sent);
    stats->Add(WireBytes(stats, b.compression), sent);
  } else if (b.exchange) {
    // Synchronous too: its collectives depend on each other.
    b.activity = wire.Activity(OpType::kAllreduce, DataType::kFloat32, ReduceOp::kSum);
    ctx_->Phase(b.entries, b.activity, true);
    std::vector<Segment> segs;
    for (size_t i = 0; i < b.entries.size(); ++i) segs.push_back(SegmentOf(*b.entries[i], b.offsets[i]));
    int64_t sent = 0;
    b.work = std::make_unique<DoneWork>(
        b.compressor->Exchange(wire, reinterpret_cast<float*>(b.staged), segs, &sent));
    b.wire_bytes = static_cast<size_t>(sent);
    stats->Add(WireBytes(stats, b.compression), sent);
  } else if (b.compressor != nullptr && b.compressor->wire() == Compressor::Wire::kAllgather) {
    b.activity = wire.Activity(OpType::kAllgather);
    ctx_->Phase(b.entries, b.activity, true);
    s = wire.StartAllgather(b.staged, static_cast<int64_t>(b.wire_bytes), b.gathered, &b.work);
    stats->Add(WireBytes(stats, b.compression), static_cast<int64_t>(b.wire_bytes));
  } else if (b.compressor != nullptr) {
    // The compressor's wire form is summed as its element type.
    const DataType wire_type = b.compressor->wire_dtype();
    b.activity = wire.Activity(OpType::kAllreduce, wire_type, ReduceOp::kSum);
    ctx_->Phase(b.entries, b.activity, true);
    s = wire.StartAllreduce(Transport::kInPlace, b.staged, b.count, wire_type, ReduceOp::kSum, 1.0,
                            &b.work);
    stats->Add(WireBytes(stats, b.compression), static_cast<int64_t>(b.wire_bytes));
  } else {
    const DataType wire_type = Is16BitFloat(b.dtype) ? DataType::kFloat32 : b.dtype;
    // A direct tensor's post-scale (Average) rides along with the reduction.
    const double post = b.direct ? PostFactor(b.entries[0]->request, set.size()) : 1.0;
    b.activity = wire.Activity(OpType::kAllreduce, wire_type, b.op);
    ctx_->Phase(b.entries, b.activity, true);
    s = wire.StartAllreduce(b.send, b.recv, b.count, wire_type, b.op, post, &b.work);
    stats->Add(WireBytes(stats, CompressionType::kNone),
               b.count * static_cast<int64_t>(DataTypeSize(wire_type)));
  }
  stats->Add(stats->collectives, 1);
  stats->Add(stats->bytes_in, BytesIn(b.entries));
  if (s.ok() && b.work->done()) ctx_->Phase(b.entries, b.activity, false);
  return s;
}

Status AllreducePipeline::Finish(ProcessSet& set, Bucket& b, TransportWork* in_flight) {
  Status s = b.work->Wait();
  if (!b.work->done()) ctx_->Phase(b.entries, b.activity, false);
  if (!s.ok()) return s;
  const int size = set.size();
  if (b.direct) {
    // Reduced and scaled in place by the wire.
  } else if (b.compressor == nullptr || b.across_hosts || b.exchange) {
    ctx_->Phase(b.entries, activity::kMemcpyOutFusionBuffer, true);
    const bool widen = Is16BitFloat(b.dtype);
    const int64_t elem = widen ? 4 : static_cast<int64_t>(DataTypeSize(b.dtype));
    for (size_t i = 0; i < b.entries.size(); ++i) {
      TensorEntry& e = *b.entries[i];
      const int64_t n = NumElements(e.request.shape);
      const double post = PostFactor(e.request, size);
      if (widen) {
        NarrowFromFloat(reinterpret_cast<float*>(b.staged) + b.offsets[i], e.output, n, b.dtype, post);
        if (in_flight) in_flight->Progress();
      } else {
        CopyWithProgress(b.staged + b.offsets[i] * elem, e.output, n, b.dtype, post, in_flight);
      }
    }
    ctx_->Phase(b.entries, activity::kMemcpyOutFusionBuffer, false);
  } else {
    ctx_->Phase(b.entries, activity::kDecompress, true);
    for (size_t i = 0; i < b.entries.size(); ++i) {
      TensorEntry& e = *b.entries[i];
      const int64_t n = NumElements(e.request.shape);
      auto* out = static_cast<float*>(e.output);
      if (b.compressor->wire() == Compressor::Wire::kAllreduce) {
        b.compressor->Decompress(b.staged + b.offsets[i], OneSegment(e, n), out);
      } else {
        std::memset(out, 0, static_cast<size_t>(n) * sizeof(float));
        for (int r = 0; r < size; ++r) {
          b.compressor->DecompressAdd(b.gathered + static_cast<size_t>(r) * b.wire_bytes + b.offsets[i],
                                      OneSegment(e, n), out);
        }
      }
      const double post = PostFactor(e.request, size);
      if (post != 1.0) CopyScaled(out, out, n, DataType::kFloat32, post);
      if (in_flight) in_flight->Progress();
    }
    ctx_->Phase(b.entries, activity::kDecompress, false);
  }
  ctx_->CompleteAllreduces(b.entries, b.compressor ? static_cast<int64_t>(b.wire_bytes) : b.count * 4);
  return Status::OK();
}

Status AllreducePipeline::RunChunked(ProcessSet& set, TensorEntry& e) {
  const Request& q = e.request;
  const int64_t count = NumElements(q.shape);
  ctx_->Phase({&e}, activity::kQueue, false);
  Status s;
  if (count > 0) {
    CopyScaled(e.input, e.output, count, q.dtype, q.prescale);
    Transport& wire = set.transport();
    s = ctx_->Timed(e, wire.Activity(OpType::kAllreduce, q.dtype, q.reduce_op),
                    [&] { return wire.Allreduce(e.output, count, q.dtype, q.reduce_op); });
    ctx_->stats->Add(ctx_->stats->collectives, 1);
    ctx_->stats->Add(WireBytes(ctx_->stats, CompressionType::kNone),
                     count * static_cast<int64_t>(DataTypeSize(q.dtype)));
    const double post = PostFactor(q, set.size());
    if (s.ok() && post != 1.0) CopyScaled(e.output, e.output, count, q.dtype, post);
  }
  ctx_->Phase({&e}, OperationPhase(q), false);
  return s;
}

}  // namespace hvdlite
