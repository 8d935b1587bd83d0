#include "compressors/quantize.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "compressors/error_feedback.h"
#include "compressors/registry.h"

namespace hvdlite {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// SplitMix64's finaliser: a bijection of 64-bit words that mixes every bit.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t NameHash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

inline uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

inline bool Finite(uint32_t bits) { return (bits & 0x7f800000u) != 0x7f800000u; }

// u in [0, 1), a multiple of 2^-24 (exact in float32), for value `index` of a
// segment whose draws are keyed by `key`; the value's bits make ranks with
// different values draw differently. Segments are below 2^31 values
// (validation), so (bits, index) fills 64 bits without overlap.
inline float Uniform(uint64_t key, int64_t index, uint32_t bits) {
  const uint64_t z = Mix64(key ^ ((static_cast<uint64_t>(bits) << 32) | static_cast<uint32_t>(index)));
  return static_cast<float>(z >> 40) * 0x1.0p-24f;
}

inline void StoreF32(uint8_t* p, float v) { std::memcpy(p, &v, sizeof(v)); }
inline float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

QuantizeCompressor::QuantizeCompressor(int bits, int64_t block_size, Rounding rounding, uint64_t seed)
    : bits_(bits), qmax_((1 << (bits - 1)) - 1), block_size_(block_size), rounding_(rounding), seed_(seed) {}

std::string QuantizeCompressor::Describe() const {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "quantize(%d, %lld, %s)", bits_, static_cast<long long>(block_size_),
                rounding_ == Rounding::kStochastic ? "stochastic" : "nearest");
  return buf;
}

size_t QuantizeCompressor::SegmentBytes(int64_t count) const {
  const int64_t blocks = (count + block_size_ - 1) / block_size_;
  return static_cast<size_t>(blocks * 4 + (count * bits_ + 7) / 8);
}

size_t QuantizeCompressor::CompressedBytes(const std::vector<Segment>& segs) const {
  size_t bytes = 0;
  for (const Segment& s : segs) bytes += SegmentBytes(s.count);
  return bytes;
}

float QuantizeCompressor::EncodeBlock(const float* x, int64_t n, int64_t first, uint64_t key,
                                      uint8_t* codes) const {
  // The largest finite magnitude, compared as bits: for non-negative floats
  // the bit patterns order like the values, and integers cannot trip on NaN.
  uint32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = Bits(x[i]);
    amax_bits = std::max(amax_bits, Finite(b) ? (b & 0x7fffffffu) : 0u);
  }
  float a;
  std::memcpy(&a, &amax_bits, sizeof(a));
  const int zero = qmax_ + 1;
  if (a == 0.0f) {  // all zeros (but for non-finite values): no division by a
    for (int64_t i = 0; i < n; ++i) codes[i] = Finite(Bits(x[i])) ? static_cast<uint8_t>(zero) : 0;
    return 0.0f;
  }
  const float qmax = static_cast<float>(qmax_);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = Bits(x[i]);
    if (!Finite(b)) {
      codes[i] = 0;
      continue;
    }
    // Rounded as a magnitude, the sign put back after: truncation is the
    // floor, m - whole is exact (Sterbenz, for m >= 1), and rounding is
    // symmetric, so stochastic rounding stays unbiased for either sign.
    const float m = std::fabs(x[i]) / a * qmax;  // in [0, qmax]
    const int whole = static_cast<int>(m);
    const float frac = m - static_cast<float>(whole);
    const bool up = rounding_ == Rounding::kStochastic ? Uniform(key, first + i, b) < frac
                                                       : frac > 0.5f || (frac == 0.5f && (whole & 1) != 0);
    const int q = whole + (up ? 1 : 0);
    codes[i] = static_cast<uint8_t>(zero + ((b >> 31) != 0 ? -q : q));
  }
  return a / qmax;
}

size_t QuantizeCompressor::Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) {
  size_t pos = 0;
  for (const Segment& s : segs) {
    uint64_t key = 0;
    if (rounding_ == Rounding::kStochastic) {
      const uint64_t step = steps_[s.name]++;
      key = Mix64(Mix64(seed_ ^ NameHash(s.name)) + step * kGolden);
    }
    const int64_t blocks = (s.count + block_size_ - 1) / block_size_;
    uint8_t* scales = out + pos;
    uint8_t* packed = scales + 4 * blocks;
    codes_.resize(static_cast<size_t>(block_size_));
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t first = blk * block_size_;
      const int64_t n = std::min(block_size_, s.count - first);
      StoreF32(scales + 4 * blk, EncodeBlock(input + s.offset + first, n, first, key, codes_.data()));
      if (bits_ == 8) {
        std::memcpy(packed + first, codes_.data(), static_cast<size_t>(n));
        continue;
      }
      for (int64_t i = 0; i < n; ++i) {  // value first + i: byte (first + i) / 2
        const int64_t v = first + i;
        uint8_t& byte = packed[v / 2];
        byte = (v & 1) ? static_cast<uint8_t>(byte | (codes_[i] << 4)) : codes_[i];
      }
    }
    pos += SegmentBytes(s.count);
  }
  return pos;
}

void QuantizeCompressor::DecodeSegment(const uint8_t* in, int64_t count, float* out, bool add) const {
  const int64_t blocks = (count + block_size_ - 1) / block_size_;
  const uint8_t* packed = in + 4 * blocks;
  const int zero = qmax_ + 1;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const float scale = LoadF32(in + 4 * blk);
    const int64_t first = blk * block_size_;
    const int64_t end = std::min(count, first + block_size_);
    for (int64_t v = first; v < end; ++v) {
      const int code = bits_ == 8 ? packed[v] : (packed[v / 2] >> ((v & 1) * 4)) & 0xf;
      const float value = code == 0 ? nan : static_cast<float>(code - zero) * scale;
      out[v] = add ? out[v] + value : value;
    }
  }
}

void QuantizeCompressor::Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) {
  size_t pos = 0;
  for (const Segment& s : segs) {
    DecodeSegment(in + pos, s.count, out + s.offset, false);
    pos += SegmentBytes(s.count);
  }
}

void QuantizeCompressor::DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs, float* out) {
  size_t pos = 0;
  for (const Segment& s : segs) {
    DecodeSegment(in + pos, s.count, out + s.offset, true);
    pos += SegmentBytes(s.count);
  }
}

namespace {

std::string CheckArguments(const CompressionSpec& spec, DataType, int64_t elements) {
  if (spec.bits != 4 && spec.bits != 8) return "quantize bits must be 4 or 8, got " + std::to_string(spec.bits);
  if (spec.block_size < 2 || spec.block_size > QuantizeCompressor::kMaxBlockSize) {
    return "quantize block_size must be in [2, " + std::to_string(QuantizeCompressor::kMaxBlockSize) +
           "], got " + std::to_string(spec.block_size);
  }
  if (spec.seed < 0) return "quantize seed must be >= 0, got " + std::to_string(spec.seed);
  // One allgather, whose count is an int, carries the form.
  const QuantizeCompressor sizer(spec.bits, spec.block_size, QuantizeCompressor::Rounding::kNearest, 0);
  if (sizer.SegmentBytes(elements) > static_cast<size_t>(INT32_MAX)) {
    return "quantize would put more than 2^31-1 bytes on the wire for this tensor; use bits=4 or split "
           "the tensor";
  }
  return "";
}

std::string Arguments(const CompressionSpec& spec) {
  return "(bits=" + std::to_string(spec.bits) + ", block_size=" + std::to_string(spec.block_size) +
         ", rounding='" + (spec.stochastic ? "stochastic" : "nearest") + "', error_feedback=" +
         (spec.error_feedback ? "True" : "False") + ", seed=" + std::to_string(spec.seed) + ")";
}

std::unique_ptr<Compressor> Make(const CompressionSpec& spec) {
  if (!CheckArguments(spec, DataType::kFloat32, 0).empty()) return nullptr;
  auto q = std::make_unique<QuantizeCompressor>(
      spec.bits, spec.block_size,
      spec.stochastic ? QuantizeCompressor::Rounding::kStochastic : QuantizeCompressor::Rounding::kNearest,
      static_cast<uint64_t>(spec.seed));
  if (!spec.error_feedback) return q;
  // A non-finite value is sent as NaN; its residual would be NaN for good.
  return std::make_unique<ErrorFeedback>(std::move(q), /*drop_nonfinite=*/true);
}

CompressorKind Kind() {
  CompressorKind kind{CompressionType::kQuantize, "quantize", Make, CheckArguments, Arguments};
  kind.takes_16bit_floats = true;  // a float16 outer gradient gains 4x, not 8x
  return kind;
}

const bool kRegistered = RegisterCompressor(Kind());

}  // namespace

}  // namespace hvdlite
