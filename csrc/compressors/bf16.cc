#include "bf16.h"

#include "../half.h"
#include "registry.h"

namespace hvdlite {

size_t BF16Compressor::CompressedBytes(const std::vector<Segment>& segs) const {
  return static_cast<size_t>(TotalCount(segs)) * sizeof(uint16_t);
}

size_t BF16Compressor::Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) {
  auto* wire = reinterpret_cast<uint16_t*>(out);
  int64_t pos = 0;
  for (const Segment& s : segs) {
    const float* in = input + s.offset;
    for (int64_t i = 0; i < s.count; ++i) wire[pos + i] = FloatToBFloat16(in[i]);
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
