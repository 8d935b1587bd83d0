#include "allreduce/dense_buckets.h"

#include <algorithm>

#include "kernels/scale.h"
#include "timeline/timeline_names.h"

namespace hvdlite {

namespace {

constexpr int64_t kCopyChunkBytes = 1 << 20;  // wire progress between chunks

// A copy long enough to starve the previous bucket's wire work is split, and
// the work is nudged between pieces.
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

// 16-bit floats are staged (and summed) as float32.
DataType StagedType(DataType dtype) { return Is16BitFloat(dtype) ? DataType::kFloat32 : dtype; }

}  // namespace

Status DirectBucket::Prepare(Bucket& b, TransportWork* /*in_flight*/) {
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

const char* DirectBucket::Activity(const Bucket& b) const {
  return b.wire->Activity(OpType::kAllreduce, b.dtype, b.op);
}

Status DirectBucket::Start(Bucket& b) {
  // The post-scale (Average) rides along with the reduction.
  const double post = PostFactor(b.entries[0]->request, b.wire->size());
  ctx_->stats->Add(WireBytes(ctx_->stats, CompressionType::kNone),
                   b.count * static_cast<int64_t>(DataTypeSize(b.dtype)));
  return b.wire->StartAllreduce(b.send, b.recv, b.count, b.dtype, b.op, post, &b.work);
}

void DirectBucket::Finish(Bucket& /*b*/, TransportWork* /*in_flight*/) {
  // Reduced and scaled in place by the wire.
}

Status StagedBucket::Prepare(Bucket& b, TransportWork* in_flight) {
  const bool widen = Is16BitFloat(b.dtype);
  const int64_t elem = static_cast<int64_t>(DataTypeSize(StagedType(b.dtype)));
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

void StagedBucket::Finish(Bucket& b, TransportWork* in_flight) {
  ctx_->Phase(b.entries, activity::kMemcpyOutFusionBuffer, true);
  const bool widen = Is16BitFloat(b.dtype);
  const int64_t elem = static_cast<int64_t>(DataTypeSize(StagedType(b.dtype)));
  for (size_t i = 0; i < b.entries.size(); ++i) {
    TensorEntry& e = *b.entries[i];
    const int64_t n = NumElements(e.request.shape);
    const double post = PostFactor(e.request, b.wire->size());
    if (widen) {
      NarrowFromFloat(reinterpret_cast<float*>(b.staged) + b.offsets[i], e.output, n, b.dtype, post);
      if (in_flight) in_flight->Progress();
    } else {
      CopyWithProgress(b.staged + b.offsets[i] * elem, e.output, n, b.dtype, post, in_flight);
    }
  }
  ctx_->Phase(b.entries, activity::kMemcpyOutFusionBuffer, false);
}

const char* FusedBucket::Activity(const Bucket& b) const {
  return b.wire->Activity(OpType::kAllreduce, StagedType(b.dtype), b.op);
}

Status FusedBucket::Start(Bucket& b) {
  const DataType wire_type = StagedType(b.dtype);
  ctx_->stats->Add(WireBytes(ctx_->stats, CompressionType::kNone),
                   b.count * static_cast<int64_t>(DataTypeSize(wire_type)));
  return b.wire->StartAllreduce(b.send, b.recv, b.count, wire_type, b.op, 1.0, &b.work);
}

}  // namespace hvdlite
