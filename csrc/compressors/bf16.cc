#include "compressors/bf16.h"

#include <cstring>

#include "kernels/half.h"
#include "compressors/registry.h"

namespace hvdlite {

size_t BF16Compressor::CompressedBytes(const std::vector<Segment>& segs) const {
  return static_cast<size_t>(TotalCount(segs)) * sizeof(uint16_t);
}

namespace {

// FloatToBFloat16 (half.h) without a branch, so the compiler vectorises it:
// round to nearest even, and a NaN stays a (quiet) NaN.
void ToBFloat16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, in + i, sizeof(x));
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t nan = (x >> 16) | 0x40u;
    out[i] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

}  // namespace

size_t BF16Compressor::Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) {
  auto* wire = reinterpret_cast<uint16_t*>(out);
  int64_t pos = 0;
  for (const Segment& s : segs) {
    ToBFloat16(input + s.offset, wire + pos, s.count);
    pos += s.count;
  }
  return static_cast<size_t>(pos) * sizeof(uint16_t);
}

void BF16Compressor::Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) {
  const auto* wire = reinterpret_cast<const uint16_t*>(in);
  int64_t pos = 0;
  for (const Segment& s : segs) {
    float* dst = out + s.offset;
    for (int64_t i = 0; i < s.count; ++i) dst[i] = BFloat16ToFloat(wire[pos + i]);
    pos += s.count;
  }
}

void BF16Compressor::DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs, float* out) {
  const auto* wire = reinterpret_cast<const uint16_t*>(in);
  int64_t pos = 0;
  for (const Segment& s : segs) {
    float* dst = out + s.offset;
    for (int64_t i = 0; i < s.count; ++i) dst[i] += BFloat16ToFloat(wire[pos + i]);
    pos += s.count;
  }
}

namespace {

std::unique_ptr<Compressor> Make(const CompressionSpec&) { return std::make_unique<BF16Compressor>(); }

const bool kRegistered = RegisterCompressor({CompressionType::kBF16, "bf16", Make});

}  // namespace

}  // namespace hvdlite
