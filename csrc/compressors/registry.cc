// Maps a CompressionSpec to a compressor; the one place that knows every
// concrete compressor, so the engine only sees the interface.
#include "compressor.h"
#include "error_feedback.h"
#include "fp16.h"
#include "topk.h"

namespace hvdlite {

int64_t TotalCount(const std::vector<Segment>& segs) {
  int64_t total = 0;
  for (const Segment& s : segs) total += s.count;
  return total;
}

std::unique_ptr<Compressor> CreateCompressor(const CompressionSpec& spec) {
  switch (spec.type) {
    case CompressionType::kNone:
      return nullptr;
    case CompressionType::kFP16:
      return std::make_unique<FP16Compressor>();
    case CompressionType::kTopK: {
      // Validated earlier with a proper error; here only refuse to build nonsense.
      if (!(spec.topk_ratio > 0.0 && spec.topk_ratio <= 1.0)) return nullptr;
      std::unique_ptr<Compressor> topk = std::make_unique<TopKCompressor>(
          spec.topk_ratio, TopKCompressor::kDefaultSampleSize, TopKCompressor::kEngineSendWholeBelow);
      if (spec.error_feedback) return std::make_unique<ErrorFeedback>(std::move(topk));
      return topk;
    }
  }
  return nullptr;  // a value outside the enum
}

Compressor* CompressorCache::For(const CompressionSpec& spec) {
  if (spec.type == CompressionType::kNone) return nullptr;
  const std::string key = spec.ToString();
  auto it = by_spec_.find(key);
  if (it == by_spec_.end()) it = by_spec_.emplace(key, CreateCompressor(spec)).first;
  return it->second.get();
}

void CompressorCache::Reset() {
  for (auto& kv : by_spec_) {
    if (kv.second) kv.second->Reset();
  }
}

}  // namespace hvdlite
