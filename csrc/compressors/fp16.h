// fp16 compression: float32 -> IEEE half (round to nearest even, overflow to
// inf, NaN stays NaN) on the way out, summed on the wire by a custom MPI op
// that adds in float32 and rounds once, and widened back on the way in.
// Bulk kernels use F16C/AVX2 when the CPU has them (chosen at run time: the
// engine is built without -march) and the scalar conversions of half.h
// otherwise.
#pragma once

#include <cstdint>

#include "compressor.h"

namespace hvdlite {

// One implementation of the bulk half kernels. NaN payloads may differ between
// implementations (F16C keeps the top payload bits, half.h returns a canonical
// quiet NaN); every other value converts bitwise identically.
struct Fp16Kernels {
  const char* name;
  void (*to_half)(const float* in, uint16_t* out, int64_t n);
  void (*to_float)(const uint16_t* in, float* out, int64_t n);
  void (*add_to_float)(const uint16_t* in, float* out, int64_t n);  // out += in
  void (*sum)(const uint16_t* in, uint16_t* inout, int64_t n);      // inout = half(in + inout)
};

const Fp16Kernels& ScalarFp16Kernels();
// nullptr when the CPU (or the compiler's target) lacks AVX2 + F16C.
const Fp16Kernels* F16CFp16Kernels();
// The fastest available; what FP16Compressor and the MPI op use.
const Fp16Kernels& BestFp16Kernels();

// A commutative MPI op summing MPI_UINT16_T halves; created once on first use.
// Returns MPI_OP_NULL when MPI is not initialised (or already finalised).
MPI_Op Fp16SumOp();

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
  MPI_Datatype WireType() const override { return MPI_UINT16_T; }
  MPI_Op WireSumOp() const override { return Fp16SumOp(); }

 private:
  const Fp16Kernels& kernels_;
};

}  // namespace hvdlite
