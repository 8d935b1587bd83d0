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
  const bool widen = Is16BitFloat(b.dtype);
  size_t offset = 0;
  for (TensorEntry* e : b.entries) {
    const int64_t n = NumElements(e->request.shape);
    b.offsets.push_back(static_cast<int64_t>(offset));
    const float* input = static_cast<const float*>(e->input);
    double prescale = e->request.prescale;
    if (widen) {  // a compressor that takes 16-bit floats sees them as float32
      ctx_->scratch_in.resize(static_cast<size_t>(n));
      WidenToFloat(e->input, ctx_->scratch_in.data(), n, b.dtype, prescale);
      input = ctx_->scratch_in.data();
      prescale = 1.0;
    }
    offset += CompressScaled(*b.compressor, input, n, prescale, OneSegment(*e, n), b.staged + offset,
                             &ctx_->scratch_in);
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
  const bool narrow = Is16BitFloat(b.dtype);
  for (size_t i = 0; i < b.entries.size(); ++i) {
    TensorEntry& e = *b.entries[i];
    const int64_t n = NumElements(e.request.shape);
    const double post = PostFactor(e.request, forms.ranks);
    if (narrow) {  // the float32 sum, scaled, rounded once to the tensor's type
      ctx_->scratch_out.resize(static_cast<size_t>(n));
      DecodeCompressedSum(*b.compressor, forms, static_cast<size_t>(b.offsets[i]), OneSegment(e, n), n,
                          ctx_->scratch_out.data());
      NarrowFromFloat(ctx_->scratch_out.data(), e.output, n, b.dtype, post);
      if (in_flight) in_flight->Progress();
      continue;
    }
    auto* out = static_cast<float*>(e.output);
    DecodeCompressedSum(*b.compressor, forms, static_cast<size_t>(b.offsets[i]), OneSegment(e, n), n, out);
    if (post != 1.0) CopyScaled(out, out, n, DataType::kFloat32, post);
    if (in_flight) in_flight->Progress();
  }
  ctx_->Phase(b.entries, activity::kDecompress, false);
}

}  // namespace hvdlite
