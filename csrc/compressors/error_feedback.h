// Error feedback (a decorator over any compressor): what compression dropped
// this step -- the entries top-k did not send, the rounding error of fp16 -- is
// kept per tensor name and added to that tensor's next input, so over many
// steps nothing is lost, only delayed.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "compressors/decorator.h"

namespace hvdlite {

class ErrorFeedback : public CompressorDecorator {
 public:
  // drop_nonfinite: a residual entry that comes out NaN or +-inf (its input
  // was: an fp16 overflow under loss scaling) is set to 0, for a compressor
  // that sends such entries as NaN; kept, it would make the entry NaN at
  // every later step too.
  explicit ErrorFeedback(std::unique_ptr<Compressor> inner, bool drop_nonfinite = false);

  std::string Describe() const override { return inner_->Describe() + "+ef"; }
  // Compresses input + residual and keeps residual = (input + residual) - sent.
  // A segment whose count differs from its stored residual starts from zero.
  size_t Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) override;
  void Reset() override;

  // The residual carried for a tensor name (false if none); for tests and stats.
  bool GetResidual(const std::string& name, std::vector<float>* out) const;
  size_t residual_count() const { return residuals_.size(); }

 private:
  // Stored negated (-residual): then "residual = tmp - sent" becomes
  // "neg = -tmp; neg += sent", and inner's DecompressAdd does the second half
  // touching only what was sent (k entries for top-k) instead of a dense
  // decompression into another buffer. -(a - b) == (-a) + b exactly in IEEE
  // arithmetic (up to the sign of a zero), so the residual is the one the
  // direct way computes.
  std::unordered_map<std::string, std::vector<float>> residuals_;
  const bool drop_nonfinite_;
  std::vector<float> tmp_;  // input + residual, indexed like the input buffer
  // Scratch reused every call (no allocation in steady state).
  std::vector<float*> seg_residuals_;  // this call's residual per segment
  std::vector<Segment> single_;        // one segment at offset 0
};

}  // namespace hvdlite
