// How a compressor makes itself known to the engine: its file registers one
// CompressorKind at load time, e.g. (compressors/fp16.cc)
//
//   const bool kRegistered = RegisterCompressor({CompressionType::kFP16, "fp16", Make});
//
// and nothing else names it: the engine builds compressors, validates their
// arguments, names them in errors and counts their wire bytes through this
// table (compressor.h). Python's hvdlite.compression finds the code by name.
#pragma once

#include <memory>
#include <string>

#include "negotiation/message.h"

namespace hvdlite {

class Compressor;

struct CompressorKind {
  CompressionType type;  // the C API's code, also on the wire: below kMaxCompressionKinds
  const char* name;      // in errors, cache keys and engine_stats()'s "wire_bytes_<name>"
  std::unique_ptr<Compressor> (*create)(const CompressionSpec& spec);
  // The kind's own argument checks for a tensor of `elements` of `dtype`: an
  // error for the user, "" when fine. Optional.
  std::string (*check)(const CompressionSpec& spec, DataType dtype, int64_t elements) = nullptr;
  // Its arguments as they follow the name, e.g. "(ratio=0.01, error_feedback=True)". Optional.
  std::string (*arguments)(const CompressionSpec& spec) = nullptr;
  // The operations it serves besides allreduce: reducescatter too unless false.
  bool reducescatter = true;
  // Whether float16 and bfloat16 tensors are compressed too (widened to
  // float32 first, narrowed back after): else they cross as they are, or the
  // kind's check refuses them.
  bool takes_16bit_floats = false;
};

// Called from a namespace-scope initializer; aborts on a duplicate or
// out-of-range code (a build error in all but name).
bool RegisterCompressor(const CompressorKind& kind);

// The registered kind with this code, or nullptr.
const CompressorKind* FindCompressorKind(CompressionType type);

}  // namespace hvdlite
