#include "allreduce/compressed_wire.h"

#include <cstring>

#include "kernels/scale.h"

namespace hvdlite {

size_t CompressScaled(Compressor& c, const float* input, int64_t count, double prescale,
                      const std::vector<Segment>& segs, uint8_t* out, std::vector<float>* scratch) {
  if (prescale != 1.0) {
    scratch->resize(static_cast<size_t>(count));
    CopyScaled(input, scratch->data(), count, DataType::kFloat32, prescale);
    input = scratch->data();
  }
  return c.Compress(input, segs, out);
}

const char* CompressedActivity(const Transport& wire, const Compressor& c) {
  return GathersForms(c) ? wire.Activity(OpType::kAllgather)
                         : wire.Activity(OpType::kAllreduce, c.wire_dtype(), ReduceOp::kSum);
}

Status StartCompressedExchange(Transport& wire, const Compressor& c, const CompressedForms& forms,
                               std::unique_ptr<TransportWork>* work) {
  if (GathersForms(c)) {
    return wire.StartAllgather(forms.mine, static_cast<int64_t>(forms.bytes), forms.gathered, work);
  }
  const int64_t elems = static_cast<int64_t>(forms.bytes / DataTypeSize(c.wire_dtype()));
  return wire.StartAllreduce(Transport::kInPlace, forms.mine, elems, c.wire_dtype(), ReduceOp::kSum, 1.0,
                             work);
}

void DecodeCompressedSum(Compressor& c, const CompressedForms& forms, size_t offset,
                         const std::vector<Segment>& segs, int64_t count, float* out) {
  if (!GathersForms(c)) {
    c.Decompress(forms.mine + offset, segs, out);
    return;
  }
  std::memset(out, 0, static_cast<size_t>(count) * sizeof(float));
  for (int r = 0; r < forms.ranks; ++r) {
    c.DecompressAdd(forms.gathered + static_cast<size_t>(r) * forms.bytes + offset, segs, out);
  }
}

}  // namespace hvdlite
