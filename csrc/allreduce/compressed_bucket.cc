#include "allreduce/compressed_bucket.h"

#include "kernels/scale.h"
#include "allreduce/compressed_wire.h"
#include "timeline/timeline_names.h"

namespace hvdlite {

namespace {

CompressedForms FormsOf(const Bucket& b) {
  CompressedForms forms;
  forms.mine = b.staged;
  forms.gathered = b.gathered;
  forms.bytes = b.wire_bytes;
  forms.ranks = b.wire->size();
  return forms;
}

}  // namespace

Status CompressedBucket::Prepare(Bucket& b, TransportWork* in_flight) {
  size_t wire = 0;
  for (TensorEntry* e : b.entries) {
    wire += b.compressor->CompressedBytes(OneSegment(*e, NumElements(e->request.shape)));
  }
  b.wire_bytes = wire;
  b.staged = ctx_->buffers.Get(FusionBuffer::kSend, b.slot, wire);
  if (!b.staged) return OutOfMemory("a compression buffer", wire);
  if (GathersForms(*b.compressor)) {
    const size_t all = wire * static_cast<size_t>(b.wire->size());
    b.gathered = ctx_->buffers.Get(FusionBuffer::kGather, b.slot, all);
    if (!b.gathered) return OutOfMemory("a gather buffer", all);
  }
  ctx_->Phase(b.entries, activity::kCompress, true);
  size_t offset = 0;
  for (TensorEntry* e : b.entries) {
    const int64_t n = NumElements(e->request.shape);
    b.offsets.push_back(static_cast<int64_t>(offset));
    offset += CompressScaled(*b.compressor, static_cast<const float*>(e->input), n, e->request.prescale,
                             OneSegment(*e, n), b.staged + offset, &ctx_->scratch_in);
    if (in_flight) in_flight->Progress();
  }
  ctx_->Phase(b.entries, activity::kCompress, false);
  return Status::OK();
}

const char* CompressedBucket::Activity(const Bucket& b) const {
  return CompressedActivity(*b.wire, *b.compressor);
}

Status CompressedBucket::Start(Bucket& b) {
  ctx_->stats->Add(WireBytes(ctx_->stats, b.compression), static_cast<int64_t>(b.wire_bytes));
  return StartCompressedExchange(*b.wire, *b.compressor, FormsOf(b), &b.work);
}

void CompressedBucket::Finish(Bucket& b, TransportWork* in_flight) {
  ctx_->Phase(b.entries, activity::kDecompress, true);
  const CompressedForms forms = FormsOf(b);
  for (size_t i = 0; i < b.entries.size(); ++i) {
    TensorEntry& e = *b.entries[i];
    const int64_t n = NumElements(e.request.shape);
    auto* out = static_cast<float*>(e.output);
    DecodeCompressedSum(*b.compressor, forms, static_cast<size_t>(b.offsets[i]), OneSegment(e, n), n, out);
    const double post = PostFactor(e.request, forms.ranks);
    if (post != 1.0) CopyScaled(out, out, n, DataType::kFloat32, post);
    if (in_flight) in_flight->Progress();
  }
  ctx_->Phase(b.entries, activity::kDecompress, false);
}

}  // namespace hvdlite
