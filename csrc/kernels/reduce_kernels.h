// Element-wise kernels of reductions, in one place for every path that
// reduces: the transports (shared-memory sums, MPI's user ops for 16-bit
// floats) and the compressors (fp16's wire). One implementation per
// operation, so every wire gives the same bits for the same inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "common/common.h"

namespace hvdlite {

// Bulk IEEE half conversions and sums. NaN payloads may differ between
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
// The fastest available.
const Fp16Kernels& BestFp16Kernels();

// Whether the kernels below reduce `dtype` with `op`: every numeric type with
// Sum, Min, Max and Product (Average is a Sum followed by a scale; Adasum is
// not element-wise). 16-bit floats are combined in float32 and rounded after
// each step, as their MPI user ops do.
bool ElementwiseReducible(DataType dtype, ReduceOp op);

// inout[i] = in[i] op inout[i] (MPI user-op semantics). Integer sums and
// products wrap as MPI's do.
void ReduceInto(const void* in, void* inout, int64_t n, DataType dtype, ReduceOp op);

// out = scale * (src[0] op src[1] op ... op src[k-1]), combined in that order
// so every rank that runs it computes the same bits; the scale uses the
// arithmetic of CopyScaled (scale.h). `out` may alias src[0]. k >= 1.
// `copy`, when given, receives the same result in the same pass (it may alias
// any source, not `out`): one read of the result fewer than a memcpy after.
void ReduceSources(const std::vector<const uint8_t*>& src, void* out, int64_t n, DataType dtype,
                   ReduceOp op, double scale, void* copy = nullptr);

// ReduceSources for float32 sums (Sum, Average) with `out` and `copy` both
// written by streaming stores (streaming_copy.h) in the same pass, for the
// shared-memory allreduce's phases in which cores hand lines over slowly.
// Summing into an in-cache scratch and streaming it out twice took 1.6 ms
// per 16 MB tensor where this takes 1.1 (one core, bench/results/
// 2026-11-26-fused-streaming). Same bits as ReduceSources. `copy` may alias
// any source. Returns false, having written nothing, where it does not apply:
// another type or op, a CPU without SSE2, or `out` and `copy` whose addresses
// differ by other than a multiple of 16 bytes (streaming stores need both
// aligned at once).
bool ReduceSourcesStreaming(const std::vector<const uint8_t*>& src, void* out, void* copy, int64_t n,
                            DataType dtype, ReduceOp op, double scale);

}  // namespace hvdlite
