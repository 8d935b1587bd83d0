// bf16 compression: float32 -> bfloat16 (the top 16 bits, rounded to nearest
// even; NaN stays NaN) on the way out, summed on the wire as bfloat16 (each
// addition in float32, rounded once: reduce_kernels.h), widened back on the
// way in. Half the bytes of float32 with float32's range: no overflow to inf
// where fp16 would, for 8 bits of mantissa instead of 11.
#pragma once

#include "compressors/compressor.h"

namespace hvdlite {

class BF16Compressor : public Compressor {
 public:
  std::string Describe() const override { return "bf16"; }
  Wire wire() const override { return Wire::kAllreduce; }
  // Wire layout: the segments' bfloat16 values back to back, in segment order.
  size_t CompressedBytes(const std::vector<Segment>& segs) const override;
  size_t Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) override;
  void Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) override;
  void DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs, float* out) override;
  DataType wire_dtype() const override { return DataType::kBFloat16; }
};

}  // namespace hvdlite
