#include "compressors/fp16.h"

#include "compressors/registry.h"

namespace hvdlite {

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

namespace {

std::unique_ptr<Compressor> Make(const CompressionSpec&) { return std::make_unique<FP16Compressor>(); }

const bool kRegistered = RegisterCompressor({CompressionType::kFP16, "fp16", Make});

}  // namespace

}  // namespace hvdlite
