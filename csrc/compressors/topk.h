// Top-k sparsification: each rank sends, per segment, its k largest-magnitude
// entries with their indices; ranks allgather the sparse forms and every rank
// scatter-adds them all into a dense result.
//
// Selection is exact without sorting the segment: a threshold is estimated
// from a random sample, one pass collects the candidates above it into
// preallocated buffers (raising the threshold in place if they fill up), and
// nth_element trims them to exactly k. A threshold that was too high (fewer
// than k candidates) is lowered and the pass repeated.
//
// Order: magnitude compares the float's bits without the sign bit, so NaN
// ranks above inf above every finite value (a NaN gradient is sent, not hidden
// in a residual), -0 ties +0, and ties go to the lower index.
#pragma once

#include <cstdint>
#include <vector>

#include "compressors/compressor.h"

namespace hvdlite {

class TopKCompressor : public Compressor {
 public:
  static constexpr int64_t kDefaultSampleSize = 16384;
  // The engine sends segments smaller than this whole (k = count), as Deep
  // Gradient Compression leaves biases and small layers dense: they cost
  // little on the wire, and k = 1 of a 10-element bias delays its updates by
  // many steps (4-rank digits MLP, top-k 1 % + error feedback, 12 epochs:
  // 94.2 % with every tensor compressed, 96.2 % with this, 97.6 % uncompressed).
  static constexpr int64_t kEngineSendWholeBelow = 1024;

  // ratio in (0, 1]. sample_size caps how many elements the threshold
  // estimate reads per segment (about 1/256 of it, at least 256; tests shrink
  // the cap to force the fallbacks). Segments of fewer than
  // send_whole_below elements are sent whole.
  explicit TopKCompressor(double ratio, int64_t sample_size = kDefaultSampleSize,
                          int64_t send_whole_below = 0);

  // k = ceil(ratio * count) computed in double (the same expression as
  // math.ceil(ratio * n) in Python), at least 1 if count > 0, at most count.
  static int64_t K(double ratio, int64_t count);
  // This compressor's k for a segment (send_whole_below applied), at its own
  // ratio or at `ratio`.
  int64_t K(int64_t count) const { return KAt(ratio_, count); }
  int64_t KAt(double ratio, int64_t count) const { return count < send_whole_below_ ? count : K(ratio, count); }

  std::string Describe() const override;
  Wire wire() const override { return Wire::kAllgather; }
  // Wire layout: for each segment in order, k uint32 indices (within the
  // segment, ascending) then k float32 values; 8 * k bytes per segment, the
  // same on every rank. Segments must have count < 2^32 (Compress returns 0
  // for a larger one: uint32 indices cannot address it).
  size_t CompressedBytes(const std::vector<Segment>& segs) const override;
  size_t Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) override;
  void Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) override;
  void DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs, float* out) override;
  bool Sparsifies(const Segment& s) const override { return K(s.count) < s.count; }

  double ratio() const { return ratio_; }
  // The density of the next calls (DensityWarmup sets it per segment).
  void set_ratio(double ratio) { ratio_ = ratio; }
  // How often selection had to repeat a pass (threshold too high) and how
  // often the candidate buffer filled and was trimmed mid-pass; for tests/stats.
  int64_t repeated_passes() const { return repeated_passes_; }
  int64_t compactions() const { return compactions_; }

  // Test knobs; results are exact whatever they are set to.
  // false: the scalar pass even where AVX2 exists.
  void set_vectorised(bool on) { vectorised_ = on; }
  // The threshold is the sample's rank-th largest key, rank = e + sd * sqrt(e)
  // + extra (e: expected sample hits of the top k); lowering the margin forces
  // the second-pass fallback.
  void set_threshold_margin(double sd, double extra) {
    margin_sd_ = sd;
    margin_extra_ = extra;
  }

  // Selects the exact top-k of x[0, n) into idx (ascending) and val; n < 2^32.
  // Scratch: about 20 bytes per candidate (cap = max(2k, 1.5x the expected
  // candidates) + 64, e.g. ~10 MB for 1% of 25.6 M) plus 8 bytes per sample.
  void Select(const float* x, int64_t n, int64_t k, uint32_t* idx, float* val);

 private:
  // The rank-th largest key of sample_ (1-based).
  uint64_t SampleThreshold(int64_t rank);

  double ratio_;
  int64_t sample_size_;
  int64_t send_whole_below_;
  bool vectorised_ = true;
  double margin_sd_ = 3.0;
  double margin_extra_ = 2.0;
  uint64_t calls_ = 0;  // seeds the sample: deterministic, different every call
  int64_t repeated_passes_ = 0;
  int64_t compactions_ = 0;
  // Scratch reused across calls; grows to the largest need, never shrinks.
  std::vector<uint64_t> sample_;  // sampled keys
  std::vector<uint64_t> cand_;    // candidate keys in index order
  std::vector<uint64_t> work_;    // copy of cand_ for nth_element
  std::vector<float> vals_;       // values of cand_
};

}  // namespace hvdlite
