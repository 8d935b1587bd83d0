// The compression interface: a compressor turns float32 segments of a (possibly
// fused) buffer into a wire form and back. Concrete compressors (fp16.h,
// topk.h) implement it; wrappers such as error_feedback.h decorate any
// compressor with the same interface, so features compose instead of becoming
// flags inside each compressor.
//
// Threading: a compressor object is used from the engine thread only; it keeps
// scratch buffers between calls and is not safe to share across threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_stats.h"
#include "negotiation/message.h"
#include "common/status.h"

namespace hvdlite {

class Transport;

// One tensor inside a (possibly fused) float32 buffer; offsets/counts in elements.
struct Segment {
  std::string name;
  int64_t offset = 0;
  int64_t count = 0;
  // The tensor's first dimension when it has two or more (its matrix view is
  // rows x count / rows, as PowerSGD sees it); 0 otherwise or unknown.
  int64_t rows = 0;
};

class Compressor {
 public:
  // How ranks' wire forms combine: summed, gathered, or (kExchange) by the
  // compressor itself over dense float32 data, when it needs more than one
  // collective per step (PowerSGD's two allreduces).
  enum class Wire { kAllreduce, kAllgather, kExchange };
  virtual ~Compressor() = default;
  virtual std::string Describe() const = 0;  // e.g. "fp16", "topk(0.01)+ef"
  virtual Wire wire() const = 0;
  // Upper bound of the wire bytes for these segments. For kAllgather the
  // size must be the same on every rank for the same segments (fixed k).
  // Layout contract (ErrorFeedback relies on it): the wire form of several
  // segments is the concatenation, in order, of each segment's own wire form,
  // CompressedBytes({segment}) bytes long. fp16 and top-k are exact: Compress
  // returns CompressedBytes.
  virtual size_t CompressedBytes(const std::vector<Segment>& segs) const = 0;
  // input: the whole float32 buffer the segments index; returns bytes written to out.
  virtual size_t Compress(const float* input, const std::vector<Segment>& segs, uint8_t* out) = 0;
  // out = dense decompression of one wire form (entries not sent become 0).
  // Only the segments' ranges of out are written.
  virtual void Decompress(const uint8_t* in, const std::vector<Segment>& segs, float* out) = 0;
  // out += dense decompression (used for kAllgather: summing every rank's part).
  virtual void DecompressAdd(const uint8_t* in, const std::vector<Segment>& segs, float* out) = 0;
  // kAllreduce only: the element type of the wire form; the transport sums
  // wire forms as that type (ReduceOp::kSum).
  virtual DataType wire_dtype() const { return DataType::kUInt8; }
  // Forget carried state (error-feedback residuals).
  virtual void Reset() {}
  // Whether this segment's wire form leaves entries out (top-k with k below
  // the count): decorators that must treat a dense send differently ask.
  virtual bool Sparsifies(const Segment& s) const { (void)s; return false; }
  // Called once per collective before any other call for these segments:
  // a compressor whose form changes with the step (density warm-up) moves
  // on here, so every call of one collective agrees. Decorators forward it.
  virtual void BeginRound(const std::vector<Segment>& segs) { (void)segs; }
  // kExchange only: reduces `data` (the segments' dense float32 values, laid
  // out as the segments say) across `wire`'s ranks in place, as a Sum;
  // *wire_bytes: what this rank sent.
  virtual Status Exchange(Transport& wire, float* data, const std::vector<Segment>& segs,
                          int64_t* wire_bytes) {
    (void)wire, (void)data, (void)segs, (void)wire_bytes;
    return Status::Error(ErrorKind::kInternal, Describe() + " has no exchange of its own");
  }
};

// The registered kind's compressor for `spec` (registry.h); nullptr for
// none, an unknown code or arguments its own checks refuse (callers validate
// first, with CheckCompression).
std::unique_ptr<Compressor> CreateCompressor(const CompressionSpec& spec);

// Whether `value` is the code of a registered compressor.
bool IsValidCompression(int32_t value);
// The code of the compressor called `name`, -1 if none is (the C API's
// hvd_compression_code, for Python).
int32_t CompressionCode(const std::string& name);
// What follows the name in descriptions: its arguments, "" if it has none.
std::string CompressionArguments(const CompressionSpec& spec);
// The compressor's own checks of its arguments for a tensor of `elements`
// of `dtype` in an `op`: the error for the user, "" when fine.
std::string CheckCompression(const CompressionSpec& spec, OpType op, DataType dtype, int64_t elements);
// The counter of the bytes that compression puts on the wire (engine_stats()'s
// "wire_bytes_<name>").
std::atomic<int64_t>& WireBytes(EngineStats* stats, CompressionType type);

// One compressor per spec, kept across rounds: error feedback carries state
// from one step to the next.
class CompressorCache {
 public:
  // nullptr for CompressionType::kNone.
  Compressor* For(const CompressionSpec& spec);
  // Forget every compressor's carried state (hvdlite.reset_compression_state()).
  void Reset();

 private:
  std::map<std::string, std::unique_ptr<Compressor>> by_spec_;
};

// Sum of the segments' counts (the element count of a wire form for dense compressors).
int64_t TotalCount(const std::vector<Segment>& segs);

}  // namespace hvdlite
