#include "fp16.h"

#include <cstring>
#include <mutex>

#include "../half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HVDLITE_HAVE_F16C_KERNELS 1
#endif

namespace hvdlite {

namespace {

// ---- scalar: the reference semantics (half.h) ------------------------------

void ToHalfScalar(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

void ToFloatScalar(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

void AddToFloatScalar(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += HalfToFloat(in[i]);
}

void SumScalar(const uint16_t* in, uint16_t* inout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) inout[i] = FloatToHalf(HalfToFloat(in[i]) + HalfToFloat(inout[i]));
}

#ifdef HVDLITE_HAVE_F16C_KERNELS

// ---- F16C/AVX2 --------------------------------------------------------------
// The rounding immediate (0 = nearest even) overrides MXCSR, so a caller's
// rounding mode cannot change the wire. Loops are unrolled by 4 vectors to
// keep enough loads in flight to run at memory bandwidth; tails go through a
// padded stack block so that every element uses the same instruction (equal
// NaN payloads regardless of position).

#define HVDLITE_F16C __attribute__((target("avx2,f16c")))
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT;

HVDLITE_F16C inline __m256 LoadHalf8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

HVDLITE_F16C inline void StoreHalf8(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, kRound));
}

HVDLITE_F16C void ToHalfF16C(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 a = _mm256_loadu_ps(in + i);
    __m256 b = _mm256_loadu_ps(in + i + 8);
    __m256 c = _mm256_loadu_ps(in + i + 16);
    __m256 d = _mm256_loadu_ps(in + i + 24);
    StoreHalf8(out + i, a);
    StoreHalf8(out + i + 8, b);
    StoreHalf8(out + i + 16, c);
    StoreHalf8(out + i + 24, d);
  }
  for (; i + 8 <= n; i += 8) StoreHalf8(out + i, _mm256_loadu_ps(in + i));
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    alignas(32) float f[8] = {};
    alignas(16) uint16_t h[8];
    std::memcpy(f, in + i, rest * sizeof(float));
    StoreHalf8(h, _mm256_load_ps(f));
    std::memcpy(out + i, h, rest * sizeof(uint16_t));
  }
}

HVDLITE_F16C void ToFloatF16C(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 a = LoadHalf8(in + i);
    __m256 b = LoadHalf8(in + i + 8);
    __m256 c = LoadHalf8(in + i + 16);
    __m256 d = LoadHalf8(in + i + 24);
    _mm256_storeu_ps(out + i, a);
    _mm256_storeu_ps(out + i + 8, b);
    _mm256_storeu_ps(out + i + 16, c);
    _mm256_storeu_ps(out + i + 24, d);
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, LoadHalf8(in + i));
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    alignas(16) uint16_t h[8] = {};
    alignas(32) float f[8];
    std::memcpy(h, in + i, rest * sizeof(uint16_t));
    _mm256_store_ps(f, LoadHalf8(h));
    std::memcpy(out + i, f, rest * sizeof(float));
  }
}

HVDLITE_F16C void AddToFloatF16C(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_add_ps(_mm256_loadu_ps(out + i), LoadHalf8(in + i));
    __m256 b = _mm256_add_ps(_mm256_loadu_ps(out + i + 8), LoadHalf8(in + i + 8));
    _mm256_storeu_ps(out + i, a);
    _mm256_storeu_ps(out + i + 8, b);
  }
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), LoadHalf8(in + i)));
  }
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    alignas(16) uint16_t h[8] = {};
    alignas(32) float f[8] = {};
    std::memcpy(h, in + i, rest * sizeof(uint16_t));
    std::memcpy(f, out + i, rest * sizeof(float));
    _mm256_store_ps(f, _mm256_add_ps(_mm256_load_ps(f), LoadHalf8(h)));
    std::memcpy(out + i, f, rest * sizeof(float));
  }
}

HVDLITE_F16C void SumF16C(const uint16_t* in, uint16_t* inout, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_add_ps(LoadHalf8(in + i), LoadHalf8(inout + i));
    __m256 b = _mm256_add_ps(LoadHalf8(in + i + 8), LoadHalf8(inout + i + 8));
    StoreHalf8(inout + i, a);
    StoreHalf8(inout + i + 8, b);
  }
  for (; i + 8 <= n; i += 8) {
    StoreHalf8(inout + i, _mm256_add_ps(LoadHalf8(in + i), LoadHalf8(inout + i)));
  }
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    alignas(16) uint16_t a[8] = {};
    alignas(16) uint16_t b[8] = {};
    std::memcpy(a, in + i, rest * sizeof(uint16_t));
    std::memcpy(b, inout + i, rest * sizeof(uint16_t));
    StoreHalf8(b, _mm256_add_ps(LoadHalf8(a), LoadHalf8(b)));
    std::memcpy(inout + i, b, rest * sizeof(uint16_t));
  }
}

#undef HVDLITE_F16C

#endif  // HVDLITE_HAVE_F16C_KERNELS

const Fp16Kernels kScalarKernels = {"scalar", ToHalfScalar, ToFloatScalar, AddToFloatScalar,
                                    SumScalar};

#ifdef HVDLITE_HAVE_F16C_KERNELS
const Fp16Kernels kF16CKernels = {"f16c", ToHalfF16C, ToFloatF16C, AddToFloatF16C, SumF16C};
#endif

// MPI user function: MPI may hand it any chunk of the buffer.
void Fp16SumFunction(void* in, void* inout, int* len, MPI_Datatype* datatype) {
  int64_t n = *len;
  if (*datatype != MPI_UINT16_T) {  // a contiguous type of halves: count its elements
    int bytes = 0;
    MPI_Type_size(*datatype, &bytes);
    n = n * bytes / static_cast<int64_t>(sizeof(uint16_t));
  }
  BestFp16Kernels().sum(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), n);
}

}  // namespace

const Fp16Kernels& ScalarFp16Kernels() { return kScalarKernels; }

const Fp16Kernels* F16CFp16Kernels() {
#ifdef HVDLITE_HAVE_F16C_KERNELS
  static const bool supported = [] {
    __builtin_cpu_init();  // may run before the constructors that normally do this
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  }();
  return supported ? &kF16CKernels : nullptr;
#else
  return nullptr;
#endif
}

const Fp16Kernels& BestFp16Kernels() {
  static const Fp16Kernels* best = F16CFp16Kernels() ? F16CFp16Kernels() : &kScalarKernels;
  return *best;
}

MPI_Op Fp16SumOp() {
  static std::mutex mu;
  static MPI_Op op = MPI_OP_NULL;
  std::lock_guard<std::mutex> lock(mu);
  if (op != MPI_OP_NULL) return op;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return MPI_OP_NULL;
  // Never freed: MPI_Finalize releases it, and the engine may use it until then.
  if (MPI_Op_create(&Fp16SumFunction, /*commute=*/1, &op) != MPI_SUCCESS) op = MPI_OP_NULL;
  return op;
}

FP16Compressor::FP16Compressor() : kernels_(BestFp16Kernels()) {}

size_t FP16Compressor::CompressedBytes(const std::vector<Segment>& segs) const {
  return static_cast<size_t>(TotalCount(segs)) * sizeof(uint16_t);
}

size_t FP16Compressor::Compress(const float* input, const std::vector<Segment>& segs,
                                uint8_t* out) {
  auto* wire = reinterpret_cast<uint16_t*>(out);
  int64_t pos = 0;
  for (const Segment& s : segs) {
    kernels_.to_half(input + s.offset, wire + pos, s.count);
    pos += s.count;
  }
  return static_cast<size_t>(pos) * sizeof(uint16_t);
}

void FP16Compressor::Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) {
  const auto* wire = reinterpret_cast<const uint16_t*>(in);
  int64_t pos = 0;
  for (const Segment& s : segs) {
    kernels_.to_float(wire + pos, out + s.offset, s.count);
    pos += s.count;
  }
}

void FP16Compressor::DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs,
                                   float* out) {
  const auto* wire = reinterpret_cast<const uint16_t*>(in);
  int64_t pos = 0;
  for (const Segment& s : segs) {
    kernels_.add_to_float(wire + pos, out + s.offset, s.count);
    pos += s.count;
  }
}

}  // namespace hvdlite
