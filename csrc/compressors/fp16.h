// fp16 compression: float32 -> IEEE half (round to nearest even, overflow to
// inf, NaN stays NaN) on the way out, summed on the wire as float16 (each
// addition in float32, rounded once: reduce_kernels.h), and widened back on
// the way in. The bulk kernels use F16C/AVX2 when the CPU has them (chosen at
// run time: the engine is built without -march) and the scalar conversions of
// half.h otherwise.
#pragma once

#include <cstdint>

#include "kernels/reduce_kernels.h"
#include "compressors/compressor.h"

namespace hvdlite {

class FP16Compressor : public Compressor {
 public:
  FP16Compressor();
  std::string Describe() const override { return "fp16"; }
  Wire wire() const override { return Wire::kAllreduce; }
  // Wire layout: the segments' halves back to back, in segment order.
  size_t CompressedBytes(const std::vector<Segment>& segs) const override;
  size_t Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) override;
  void Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) override;
  void DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs, float* out) override;
  DataType wire_dtype() const override { return DataType::kFloat16; }

 private:
  const Fp16Kernels& kernels_;
};

}  // namespace hvdlite
