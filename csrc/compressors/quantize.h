// Block quantization to 4 or 8 bits per value (Streaming DiLoCo, Douillard
// et al. 2025, sends its outer gradients in 4 bits). A segment is cut into
// blocks of block_size values; each block sends one float32 scale and, per
// value, an integer code q in [-qmax, qmax] (qmax = 7 for 4 bits, 127 for 8)
// such that q * scale approximates the value:
//
//   a = max |x| over the block's finite values;   scale = a / qmax
//   m = |x| / a * qmax     (in [0, qmax]: both operations are monotonic)
//   q = sign(x) * (m rounded to nearest, ties to even), or stochastically
//       sign(x) * (floor(m) + 1 with probability m - floor(m), else floor(m)),
//       unbiased: E[q * scale] = x up to float32 rounding
//
// Symmetric codes keep 0 exact (a zero block or a frozen weight's zero costs
// nothing). The code left over, -qmax - 1, marks a value that was NaN or
// +-inf: it decodes as NaN, so the sum is NaN there on every rank, as a dense
// sum would be (a loss scaler sees the overflow), while the block's other
// values keep the scale of its finite ones.
//
// Codes cannot be summed on the wire, so the forms are gathered
// (Wire::kAllgather) and every rank adds all ranks' decoded forms in rank
// order: the same float32 additions in the same order, the same bits
// everywhere. Each rank receives (ranks - 1) forms of ~1/7 of float32 (4 bits
// + a 32-bit scale per 64 values), so this beats a dense ring allreduce
// (2 (ranks - 1) / ranks of float32) up to about 14 ranks.
//
// Stochastic rounding draws u in [0, 1) (24 bits) per value from a hash of
// the seed, the tensor's name, how many times this compressor compressed that
// name, the value's index and its bits: deterministic, so a rank's form can be
// recomputed anywhere (the tests do it in NumPy), and different on ranks whose
// values differ although the compressor does not know its rank.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "compressors/compressor.h"

namespace hvdlite {

class QuantizeCompressor : public Compressor {
 public:
  enum class Rounding { kNearest, kStochastic };
  static constexpr int64_t kMaxBlockSize = 65536;

  // bits: 4 or 8; block_size in [2, kMaxBlockSize].
  QuantizeCompressor(int bits, int64_t block_size, Rounding rounding, uint64_t seed);

  std::string Describe() const override;  // e.g. "quantize(4, 64, nearest)"
  Wire wire() const override { return Wire::kAllgather; }
  // Wire layout of a segment of n values: ceil(n / block_size) float32
  // scales, then the codes, stored as q + qmax + 1 (0: not finite), two per
  // byte for 4 bits (value i in byte i / 2, the low nibble for even i; an odd
  // n leaves the last high nibble 0), one per byte for 8 bits.
  size_t CompressedBytes(const std::vector<Segment>& segs) const override;
  size_t Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) override;
  void Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) override;
  void DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs, float* out) override;
  void Reset() override { steps_.clear(); }

  size_t SegmentBytes(int64_t count) const;

 private:
  // Codes (q + qmax + 1, one per byte) of one block of n values; returns its scale.
  float EncodeBlock(const float* x, int64_t n, int64_t first, uint64_t key, uint8_t* codes) const;
  // Decodes a segment's form into out (add: out += values).
  void DecodeSegment(const uint8_t* in, int64_t count, float* out, bool add) const;

  const int bits_;
  const int qmax_;
  const int64_t block_size_;
  const Rounding rounding_;
  const uint64_t seed_;
  std::unordered_map<std::string, uint64_t> steps_;  // stochastic only: compressions per name
  std::vector<uint8_t> codes_;  // a block's codes before packing
};

}  // namespace hvdlite
