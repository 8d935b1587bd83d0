#include "kernels/reduce_kernels.h"

#include <cstring>
#include <type_traits>

#include "kernels/half.h"
#include "kernels/scale.h"

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

// ---- element-wise reductions ------------------------------------------------

// Integer sums and products wrap, as MPI's do, without signed overflow.
template <typename T>
T WrapAdd(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename T>
T WrapMul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// The same arithmetic as CopyScaled (scale.cc), so every wire gives the same bits.
template <typename T>
T Scaled(T x, double factor) {
  if constexpr (std::is_same_v<T, float>) {
    return x * static_cast<float>(factor);
  } else {
    return static_cast<T>(static_cast<double>(x) * factor);
  }
}

// Calls f with the binary function of `op` on T.
template <typename T, typename F>
void WithOp(ReduceOp op, F f) {
  switch (op) {
    case ReduceOp::kMin: f([](T x, T y) { return y < x ? y : x; }); break;
    case ReduceOp::kMax: f([](T x, T y) { return x < y ? y : x; }); break;
    case ReduceOp::kProduct: f([](T x, T y) { return WrapMul(x, y); }); break;
    case ReduceOp::kSum:
    case ReduceOp::kAverage: f([](T x, T y) { return WrapAdd(x, y); }); break;
    case ReduceOp::kAdasum: break;  // refused by ElementwiseReducible
  }
}

// The final pass: out[i] = value(i), and copy[i] too when there is a copy.
// Each element is read before it is written, so `copy` may alias a source.
template <typename T, typename V>
void FinalPass(T* out, T* copy, int64_t n, V value) {
  if (copy == nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = value(i);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const T v = value(i);
    out[i] = v;
    copy[i] = v;
  }
}

// out = post(src[0] op src[1] op ...); `post` (the caller's scale) is folded
// into the last pass instead of a pass of its own, and so is the copy.
template <typename T, typename F, typename Post>
void ReduceAll(const std::vector<const uint8_t*>& src, void* out_bytes, int64_t n, F f, Post post,
               void* copy_bytes) {
  T* out = static_cast<T*>(out_bytes);
  T* copy = static_cast<T*>(copy_bytes);
  const T* a = reinterpret_cast<const T*>(src[0]);
  if (src.size() == 1) {
    FinalPass(out, copy, n, [&](int64_t i) { return post(a[i]); });
    return;
  }
  const T* b = reinterpret_cast<const T*>(src[1]);
  if (src.size() == 2) {
    FinalPass(out, copy, n, [&](int64_t i) { return post(f(a[i], b[i])); });
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
  for (size_t k = 2; k + 1 < src.size(); ++k) {
    const T* c = reinterpret_cast<const T*>(src[k]);
    for (int64_t i = 0; i < n; ++i) out[i] = f(out[i], c[i]);
  }
  const T* last = reinterpret_cast<const T*>(src.back());
  FinalPass(out, copy, n, [&](int64_t i) { return post(f(out[i], last[i])); });
}

template <typename T>
void ReduceTyped(const std::vector<const uint8_t*>& src, void* out, int64_t n, ReduceOp op,
                 double scale, void* copy) {
  WithOp<T>(op, [&](auto f) {
    if (scale == 1.0) {
      ReduceAll<T>(src, out, n, f, [](T x) { return x; }, copy);
    } else {
      ReduceAll<T>(src, out, n, f, [scale](T x) { return Scaled(x, scale); }, copy);
    }
  });
}

// 16-bit floats: each step in float32, rounded back (the MPI user op's rule).
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Reduce16Into(const uint16_t* in, uint16_t* inout, int64_t n, ReduceOp op) {
  WithOp<float>(op, [&](auto f) {
    for (int64_t i = 0; i < n; ++i) inout[i] = FromFloat(f(ToFloat(in[i]), ToFloat(inout[i])));
  });
}

void Reduce16(const uint16_t* in, uint16_t* inout, int64_t n, DataType dtype, ReduceOp op) {
  if (dtype == DataType::kFloat16) {
    if (op == ReduceOp::kSum || op == ReduceOp::kAverage) {
      BestFp16Kernels().sum(in, inout, n);
    } else {
      Reduce16Into<HalfToFloat, FloatToHalf>(in, inout, n, op);
    }
  } else {
    Reduce16Into<BFloat16ToFloat, FloatToBFloat16>(in, inout, n, op);
  }
}

template <typename F>
void Dispatch(DataType dtype, F f) {
  switch (dtype) {
    case DataType::kUInt8: f(uint8_t{}); break;
    case DataType::kInt8: f(int8_t{}); break;
    case DataType::kUInt16: f(uint16_t{}); break;
    case DataType::kInt16: f(int16_t{}); break;
    case DataType::kInt32: f(int32_t{}); break;
    case DataType::kInt64: f(int64_t{}); break;
    case DataType::kFloat32: f(float{}); break;
    case DataType::kFloat64: f(double{}); break;
    default: break;  // 16-bit floats are handled by the callers; bool is not reducible
  }
}

bool Is16BitFloat(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
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

bool ElementwiseReducible(DataType dtype, ReduceOp op) {
  if (op == ReduceOp::kAdasum) return false;
  return dtype != DataType::kBool && IsValidDataType(static_cast<int32_t>(dtype));
}

void ReduceInto(const void* in, void* inout, int64_t n, DataType dtype, ReduceOp op) {
  if (n <= 0) return;
  if (Is16BitFloat(dtype)) {
    Reduce16(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), n, dtype, op);
    return;
  }
  // Operand order as MPI applies a user op: in op inout.
  const std::vector<const uint8_t*> src = {static_cast<const uint8_t*>(in),
                                           static_cast<const uint8_t*>(inout)};
  Dispatch(dtype, [&](auto tag) { ReduceTyped<decltype(tag)>(src, inout, n, op, 1.0, nullptr); });
}

void ReduceSources(const std::vector<const uint8_t*>& src, void* out, int64_t n, DataType dtype,
                   ReduceOp op, double scale, void* copy) {
  if (n <= 0) return;
  if (Is16BitFloat(dtype)) {
    auto* acc = static_cast<uint16_t*>(out);
    if (src[0] != out) std::memcpy(acc, src[0], static_cast<size_t>(n) * sizeof(uint16_t));
    for (size_t k = 1; k < src.size(); ++k) {
      Reduce16(reinterpret_cast<const uint16_t*>(src[k]), acc, n, dtype, op);
    }
    if (scale != 1.0) CopyScaled(acc, acc, n, dtype, scale);
    if (copy) std::memcpy(copy, acc, static_cast<size_t>(n) * sizeof(uint16_t));
    return;
  }
  Dispatch(dtype, [&](auto tag) { ReduceTyped<decltype(tag)>(src, out, n, op, scale, copy); });
}

bool ReduceSourcesStreaming(const std::vector<const uint8_t*>& src, void* out, void* copy, int64_t n,
                            DataType dtype, ReduceOp op, double scale) {
#if defined(__SSE2__)
  const auto o_addr = reinterpret_cast<uintptr_t>(out);
  if (dtype != DataType::kFloat32 || (op != ReduceOp::kSum && op != ReduceOp::kAverage) || src.empty() ||
      o_addr % sizeof(float) != 0 || (o_addr - reinterpret_cast<uintptr_t>(copy)) % 16 != 0) {
    return false;
  }
  auto* o = static_cast<float*>(out);
  auto* c = static_cast<float*>(copy);
  const auto* first = reinterpret_cast<const float*>(src[0]);
  const size_t k = src.size();
  const bool scaled = scale != 1.0;
  const float factor = static_cast<float>(scale);
  // One element with plain stores, in ReduceAll's order and Scaled's arithmetic.
  auto one = [&](int64_t i) {
    float acc = first[i];
    for (size_t r = 1; r < k; ++r) acc += reinterpret_cast<const float*>(src[r])[i];
    if (scaled) acc *= factor;
    o[i] = acc;
    c[i] = acc;
  };
  int64_t i = 0;
  for (; i < n && (o_addr + static_cast<uintptr_t>(i) * sizeof(float)) % 16 != 0; ++i) one(i);
  const __m128 f = _mm_set1_ps(factor);
  // 64 bytes per round: whole lines leave the write-combining buffers at once.
  for (; i + 16 <= n; i += 16) {
    __m128 a[4];
    for (int j = 0; j < 4; ++j) a[j] = _mm_loadu_ps(first + i + 4 * j);
    for (size_t r = 1; r < k; ++r) {
      const float* s = reinterpret_cast<const float*>(src[r]) + i;
      for (int j = 0; j < 4; ++j) a[j] = _mm_add_ps(a[j], _mm_loadu_ps(s + 4 * j));
    }
    if (scaled) {
      for (int j = 0; j < 4; ++j) a[j] = _mm_mul_ps(a[j], f);
    }
    for (int j = 0; j < 4; ++j) _mm_stream_ps(o + i + 4 * j, a[j]);
    for (int j = 0; j < 4; ++j) _mm_stream_ps(c + i + 4 * j, a[j]);
  }
  for (; i < n; ++i) one(i);
  // Weakly ordered stores: fenced before the release that publishes them.
  _mm_sfence();
  return true;
#else
  (void)src, (void)out, (void)copy, (void)n, (void)dtype, (void)op, (void)scale;
  return false;
#endif
}

}  // namespace hvdlite
