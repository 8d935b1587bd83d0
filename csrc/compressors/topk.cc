#include "compressors/topk.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "compressors/density_warmup.h"
#include "compressors/error_feedback.h"
#include "compressors/momentum_correction.h"
#include "compressors/norm_clip.h"
#include "compressors/registry.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HVDLITE_HAVE_AVX2_FILTER 1
#endif

namespace hvdlite {

namespace {

// Selection works on 64-bit keys: the magnitude bits of the float (sign
// dropped: for non-negative floats the bit pattern orders like the value, and
// integer compares cannot trip on NaN) above the complement of the index, so
// equal magnitudes order by lower index first. Keys are unique, so "the k
// largest keys" is exactly one set and no tie handling is needed anywhere.
inline uint32_t MagnitudeBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b & 0x7fffffffu;
}

inline uint64_t MakeKey(uint32_t magnitude, int64_t i) {
  return (static_cast<uint64_t>(magnitude) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(i));
}

inline uint32_t KeyIndex(uint64_t key) { return ~static_cast<uint32_t>(key); }

inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Keeps in cand[0, m) and vals[0, m) (order preserved) exactly the k largest
// keys, k < m; returns the smallest kept key.
uint64_t TrimToK(uint64_t* cand, float* vals, int64_t m, int64_t k, uint64_t* work) {
  std::copy(cand, cand + m, work);
  std::nth_element(work, work + (k - 1), work + m, std::greater<uint64_t>());
  const uint64_t kth = work[k - 1];
  int64_t j = 0;
  for (int64_t i = 0; i < m; ++i) {
    if (cand[i] >= kth) {
      cand[j] = cand[i];
      vals[j++] = vals[i];
    }
  }
  return kth;
}

// Collects keys >= threshold in index order. When the buffer is full it keeps
// the k largest and raises the threshold to the smallest of them: the k-th
// largest of a prefix never exceeds the k-th largest of the whole segment, so
// nothing of the answer is lost and memory stays bounded by cap.
struct Collector {
  uint64_t* cand;
  float* vals;  // the candidates' values: no random reads of the input at the end
  uint64_t* work;
  int64_t cap;  // > k
  int64_t k;
  uint64_t threshold;
  int64_t m = 0;
  int64_t compactions = 0;

  void Add(uint64_t key, float value) {
    if (m == cap) {
      threshold = TrimToK(cand, vals, m, k, work);
      m = k;
      ++compactions;
      if (key < threshold) return;
    }
    vals[m] = value;
    cand[m++] = key;
  }
};

void FilterScalar(const float* x, int64_t begin, int64_t n, Collector* c) {
  uint32_t floor = static_cast<uint32_t>(c->threshold >> 32);
  for (int64_t i = begin; i < n; ++i) {
    const float v = x[i];
    const uint32_t mag = MagnitudeBits(v);
    if (mag < floor) continue;
    const uint64_t key = MakeKey(mag, i);
    if (key < c->threshold) continue;
    c->Add(key, v);
    floor = static_cast<uint32_t>(c->threshold >> 32);
  }
}

#ifdef HVDLITE_HAVE_AVX2_FILTER

// Compares 32 magnitudes per iteration against the threshold's magnitude and
// only looks at single elements when one of them passes (1-2% of blocks at
// realistic ratios), so the pass runs at memory bandwidth.
__attribute__((target("avx2"))) void FilterAvx2(const float* x, int64_t n, Collector* c) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  // Magnitudes are <= INT32_MAX, so a signed compare against floor - 1 is
  // "magnitude >= floor" (floor 0 gives -1: everything passes).
  uint32_t floor = static_cast<uint32_t>(c->threshold >> 32);
  __m256i below = _mm256_set1_epi32(static_cast<int32_t>(floor) - 1);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i* p = reinterpret_cast<const __m256i*>(x + i);
    __m256i g0 = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_loadu_si256(p), abs_mask), below);
    __m256i g1 = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 1), abs_mask), below);
    __m256i g2 = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 2), abs_mask), below);
    __m256i g3 = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 3), abs_mask), below);
    __m256i any = _mm256_or_si256(_mm256_or_si256(g0, g1), _mm256_or_si256(g2, g3));
    if (_mm256_testz_si256(any, any)) continue;
    uint32_t mask = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(g0))) |
                    static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(g1))) << 8 |
                    static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(g2))) << 16 |
                    static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(g3))) << 24;
    while (mask != 0) {
      const int64_t j = i + __builtin_ctz(mask);
      mask &= mask - 1;
      const float v = x[j];
      const uint64_t key = MakeKey(MagnitudeBits(v), j);
      if (key >= c->threshold) c->Add(key, v);
    }
    if (static_cast<uint32_t>(c->threshold >> 32) != floor) {  // a trim raised it
      floor = static_cast<uint32_t>(c->threshold >> 32);
      below = _mm256_set1_epi32(static_cast<int32_t>(floor) - 1);
    }
  }
  FilterScalar(x, i, n, c);
}

bool HaveAvx2() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return supported;
}

#endif  // HVDLITE_HAVE_AVX2_FILTER

void Filter(const float* x, int64_t n, Collector* c, bool vectorised) {
#ifdef HVDLITE_HAVE_AVX2_FILTER
  if (vectorised && HaveAvx2()) return FilterAvx2(x, n, c);
#else
  (void)vectorised;
#endif
  FilterScalar(x, 0, n, c);
}

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

TopKCompressor::TopKCompressor(double ratio, int64_t sample_size, int64_t send_whole_below)
    : ratio_(ratio), sample_size_(std::max<int64_t>(sample_size, 1)), send_whole_below_(send_whole_below) {}

int64_t TopKCompressor::K(double ratio, int64_t count) {
  if (count <= 0) return 0;
  const double r = ratio * static_cast<double>(count);
  if (!(r > 1.0)) return 1;  // also NaN / non-positive ratios: still send something
  if (r >= static_cast<double>(count)) return count;
  return static_cast<int64_t>(std::ceil(r));
}

std::string TopKCompressor::Describe() const {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "topk(%g)", ratio_);
  return buf;
}

size_t TopKCompressor::CompressedBytes(const std::vector<Segment>& segs) const {
  size_t bytes = 0;
  for (const Segment& s : segs) bytes += static_cast<size_t>(K(s.count)) * 8;
  return bytes;
}

uint64_t TopKCompressor::SampleThreshold(int64_t rank) {
  std::nth_element(sample_.begin(), sample_.begin() + (rank - 1), sample_.end(),
                   std::greater<uint64_t>());
  return sample_[rank - 1];
}

void TopKCompressor::Select(const float* x, int64_t n, int64_t k, uint32_t* idx, float* val) {
  if (k <= 0 || n <= 0) return;
  if (k >= n) {  // everything goes: no selection
    for (int64_t i = 0; i < n; ++i) {
      idx[i] = static_cast<uint32_t>(i);
      val[i] = x[i];
    }
    return;
  }
  const uint64_t call = calls_++;
  uint64_t threshold;
  int64_t cap;
  int64_t rank = 0;  // rank of the threshold within the sample
  // About 1/256 of the segment, within [256, sample_size_]: a random read
  // costs far more than an element of the streaming pass, so the sample must
  // stay small next to n; the estimate's accuracy depends on e = ratio * s
  // below, not on n, and extra candidates are cheap.
  int64_t s = std::min<int64_t>(sample_size_, std::max<int64_t>(256, n / 256));
  if (n <= 4 * s) {
    // Small segment: the exact k-th key costs no more than a sample would.
    if (static_cast<int64_t>(work_.size()) < n) work_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) work_[i] = MakeKey(MagnitudeBits(x[i]), i);
    std::nth_element(work_.begin(), work_.begin() + (k - 1), work_.begin() + n,
                     std::greater<uint64_t>());
    threshold = work_[k - 1];
    cap = k + 1;
    s = 0;
  } else {
    // Sample s keys with replacement; if the segment's k-th key is t, the
    // number of sample keys >= t is about Binomial(s, k/n) with mean e. Taking
    // the sample's rank-th key with rank = e + 3 sd + 2 makes a threshold above
    // t (too few candidates, a second pass) rare, at the price of ~1.25 k
    // candidates at ratio 0.01 with the full sample (~3 k with s = 256).
    sample_.resize(static_cast<size_t>(s));
    uint64_t state = call * 0x2545f4914f6cdd1dull;
    for (int64_t j = 0; j < s; j += 2) {
      const uint64_t r = SplitMix64(&state);
      const int64_t a = static_cast<int64_t>(((r >> 32) * static_cast<uint64_t>(n)) >> 32);
      const int64_t b = static_cast<int64_t>(((r & 0xffffffffu) * static_cast<uint64_t>(n)) >> 32);
      sample_[j] = MakeKey(MagnitudeBits(x[a]), a);
      if (j + 1 < s) sample_[j + 1] = MakeKey(MagnitudeBits(x[b]), b);
    }
    const double e = static_cast<double>(k) * static_cast<double>(s) / static_cast<double>(n);
    const double want = std::ceil(e + margin_sd_ * std::sqrt(e) + margin_extra_);
    rank = want < 1.0 ? 1 : want > static_cast<double>(s) ? s : static_cast<int64_t>(want);
    threshold = SampleThreshold(rank);
    const double expected = static_cast<double>(n) * static_cast<double>(rank) / static_cast<double>(s);
    cap = std::min<int64_t>(n, std::max<int64_t>(2 * k, static_cast<int64_t>(expected * 1.5)) + 64);
  }
  if (static_cast<int64_t>(cand_.size()) < cap) cand_.resize(static_cast<size_t>(cap));
  if (static_cast<int64_t>(work_.size()) < cap) work_.resize(static_cast<size_t>(cap));
  if (static_cast<int64_t>(vals_.size()) < cap) vals_.resize(static_cast<size_t>(cap));

  Collector c{cand_.data(), vals_.data(), work_.data(), cap, k, threshold};
  for (;;) {
    Filter(x, n, &c, vectorised_);
    compactions_ += c.compactions;
    if (c.m >= k) break;
    // The sample overestimated the threshold: lower it and pass again. Four
    // times the rank, and then everything (threshold 0), so this ends.
    ++repeated_passes_;
    rank = 4 * rank + 16;
    const uint64_t lower = (s == 0 || rank >= s) ? 0 : SampleThreshold(rank);
    c = Collector{cand_.data(), vals_.data(), work_.data(), cap, k, lower};
  }
  if (c.m > k) TrimToK(c.cand, c.vals, c.m, k, c.work);
  for (int64_t t = 0; t < k; ++t) idx[t] = KeyIndex(c.cand[t]);
  std::copy(c.vals, c.vals + k, val);
}

size_t TopKCompressor::Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) {
  size_t pos = 0;
  for (const Segment& s : segs) {
    const int64_t k = K(s.count);
    if (k == 0) continue;
    if (s.count > static_cast<int64_t>(std::numeric_limits<uint32_t>::max())) return 0;
    // Select writes typed arrays; the wire is 4-byte aligned (8 k bytes per segment).
    Select(input + s.offset, s.count, k, reinterpret_cast<uint32_t*>(out + pos),
           reinterpret_cast<float*>(out + pos + 4 * static_cast<size_t>(k)));
    pos += 8 * static_cast<size_t>(k);
  }
  return pos;
}

void TopKCompressor::Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) {
  size_t pos = 0;
  for (const Segment& s : segs) {
    const int64_t k = K(s.count);
    const uint8_t* idx = in + pos;
    const uint8_t* val = in + pos + 4 * static_cast<size_t>(k);
    float* dst = out + s.offset;
    const uint64_t n = static_cast<uint64_t>(s.count);
    if (n > 0) std::fill(dst, dst + n, 0.0f);
    for (int64_t t = 0; t < k; ++t) {
      const uint32_t i = LoadU32(idx + 4 * t);
      if (i < n) dst[i] = LoadF32(val + 4 * t);  // a corrupt index must not write outside
    }
    pos += 8 * static_cast<size_t>(k);
  }
}

void TopKCompressor::DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs,
                                   float* out) {
  size_t pos = 0;
  for (const Segment& s : segs) {
    const int64_t k = K(s.count);
    const uint8_t* idx = in + pos;
    const uint8_t* val = in + pos + 4 * static_cast<size_t>(k);
    float* dst = out + s.offset;
    const uint64_t n = static_cast<uint64_t>(s.count);
    for (int64_t t = 0; t < k; ++t) {
      const uint32_t i = LoadU32(idx + 4 * t);
      if (i < n) dst[i] += LoadF32(val + 4 * t);  // a corrupt index must not write outside
    }
    pos += 8 * static_cast<size_t>(k);
  }
}

namespace {

std::string CheckArguments(const CompressionSpec& spec, DataType dtype, int64_t elements) {
  if (!(spec.topk_ratio > 0.0 && spec.topk_ratio <= 1.0)) {
    return "top-k ratio must be in (0, 1], got " + std::to_string(spec.topk_ratio);
  }
  if (!(spec.momentum >= 0.0 && spec.momentum < 1.0)) {
    return "top-k momentum correction must be in [0, 1), got " + std::to_string(spec.momentum);
  }
  if (spec.momentum > 0.0 && !spec.error_feedback) {
    return "top-k momentum correction accumulates what top-k leaves out: it needs error_feedback=True";
  }
  if (spec.warmup_steps < 0) return "top-k warmup_steps must be >= 0, got " + std::to_string(spec.warmup_steps);
  if (!(spec.clip_norm >= 0.0)) return "top-k clip_norm must be >= 0 (0: off), got " + std::to_string(spec.clip_norm);
  if (dtype != DataType::kFloat32) {
    return std::string("top-k compression needs float32 tensors, not ") + DataTypeName(dtype) +
           "; cast to float32 or use Compression.none / fp16";
  }
  // With a warm-up the first rounds are dense: the largest wire form is k = count.
  const double ratio = spec.warmup_steps > 0 ? 1.0 : spec.topk_ratio;
  if (std::ceil(ratio * static_cast<double>(elements)) * 8 > INT32_MAX) {
    // The k (value, index) pairs go out in one allgather whose count is an int.
    return "top-k would put more than 2^31-1 bytes on the wire for this tensor; lower the ratio "
           "or split the tensor";
  }
  return "";
}

std::string Arguments(const CompressionSpec& spec) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "(ratio=%g, error_feedback=%s", spec.topk_ratio,
                spec.error_feedback ? "True" : "False");
  std::string out = buf;
  if (spec.momentum > 0.0) {
    std::snprintf(buf, sizeof(buf), ", momentum_correction=%g", spec.momentum);
    out += buf;
  }
  if (spec.warmup_steps > 0) out += ", warmup_steps=" + std::to_string(spec.warmup_steps);
  if (spec.clip_norm > 0.0) {
    std::snprintf(buf, sizeof(buf), ", clip_norm=%g", spec.clip_norm);
    out += buf;
  }
  return out + ")";
}

// Deep Gradient Compression's parts are decorators around top-k, innermost
// first: warm-up (the density), error feedback (the accumulation), momentum
// correction (the velocity before it), clipping (the gradient before that).
std::unique_ptr<Compressor> Make(const CompressionSpec& spec) {
  if (!(spec.topk_ratio > 0.0 && spec.topk_ratio <= 1.0)) return nullptr;
  auto topk = std::make_unique<TopKCompressor>(spec.topk_ratio, TopKCompressor::kDefaultSampleSize,
                                               TopKCompressor::kEngineSendWholeBelow);
  std::unique_ptr<Compressor> c;
  if (spec.warmup_steps > 0) {
    c = std::make_unique<DensityWarmup>(std::move(topk), spec.warmup_steps);
  } else {
    c = std::move(topk);
  }
  if (spec.error_feedback) c = std::make_unique<ErrorFeedback>(std::move(c));
  if (spec.momentum > 0.0) c = std::make_unique<MomentumCorrection>(std::move(c), spec.momentum);
  if (spec.clip_norm > 0.0) c = std::make_unique<NormClip>(std::move(c), spec.clip_norm);
  return c;
}

const bool kRegistered =
    RegisterCompressor({CompressionType::kTopK, "topk", Make, CheckArguments, Arguments});

}  // namespace

}  // namespace hvdlite
