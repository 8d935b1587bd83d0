// C API: the compressors' codes, configurations and state.
#include "api/compression.h"

#include <mutex>
#include <string>
#include <vector>

#include "api/c_api.h"
#include "api/runtime.h"
#include "compressors/topk.h"

using hvdlite::CompressionSpec;
using hvdlite::CompressionType;
using hvdlite::ErrorKind;
namespace api = hvdlite::api;

namespace hvdlite {
namespace api {
namespace {

// Configured compressors, by id - 1. Process-wide and append-only, outside
// the engine: ids stay valid across shutdown() and init() (elastic
// restarts), like the front ends that hold them.
struct CompressionConfigs {
  std::mutex mutex;
  std::vector<CompressionSpec> specs;
};

CompressionConfigs& compression_configs() {
  static CompressionConfigs* c = new CompressionConfigs();
  return *c;
}

}  // namespace

bool ResolveCompression(int32_t code, double topk_ratio, int32_t error_feedback, int32_t config,
                        CompressionSpec* out) {
  if (config != 0) {
    CompressionConfigs& c = compression_configs();
    std::lock_guard<std::mutex> lock(c.mutex);
    if (config < 0 || static_cast<size_t>(config) > c.specs.size()) return false;
    *out = c.specs[static_cast<size_t>(config) - 1];
    return true;
  }
  if (!IsValidCompression(code)) return false;
  *out = CompressionSpec();
  out->type = static_cast<CompressionType>(code);
  out->topk_ratio = topk_ratio;
  out->error_feedback = error_feedback != 0;
  return true;
}

}  // namespace api
}  // namespace hvdlite

extern "C" {

int32_t hvd_compression_code(const char* name) { return hvdlite::CompressionCode(name ? name : ""); }

int32_t hvd_compression_config(int32_t kind, double topk_ratio, int32_t error_feedback, double momentum,
                               int64_t warmup_steps, double clip_norm, int32_t rank, int64_t start_iter,
                               int32_t bits, int64_t block_size, int32_t stochastic, int64_t seed) {
  if (!hvdlite::IsValidCompression(kind)) {
    return api::SetError(ErrorKind::kInvalidArgument, "unknown compression code");
  }
  CompressionSpec spec;
  spec.type = static_cast<CompressionType>(kind);
  spec.topk_ratio = topk_ratio;
  spec.error_feedback = error_feedback != 0;
  spec.momentum = momentum;
  spec.warmup_steps = warmup_steps;
  spec.clip_norm = clip_norm;
  spec.rank = rank;
  spec.start_iter = start_iter;
  spec.bits = bits;
  spec.block_size = block_size;
  spec.stochastic = stochastic != 0;
  spec.seed = seed;
  // The arguments' own checks, on a float32 tensor of one element.
  const std::string error =
      hvdlite::CheckCompression(spec, hvdlite::OpType::kAllreduce, hvdlite::DataType::kFloat32, 1);
  if (!error.empty()) return api::SetError(ErrorKind::kInvalidArgument, error);
  auto& c = api::compression_configs();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (size_t i = 0; i < c.specs.size(); ++i) {
    if (c.specs[i] == spec) return static_cast<int32_t>(i + 1);
  }
  c.specs.push_back(spec);
  return static_cast<int32_t>(c.specs.size());
}

int hvd_reset_compression_state(void) {
  auto engine = api::CurrentEngine();
  if (!engine) return -api::LastErrorKind();
  engine->ResetCompressionState();
  return 0;
}

int64_t hvd_topk_count(int64_t count, double ratio) {
  if (count < hvdlite::TopKCompressor::kEngineSendWholeBelow) return count;
  return hvdlite::TopKCompressor::K(ratio, count);
}

}  // extern "C"
