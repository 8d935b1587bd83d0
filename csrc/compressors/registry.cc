// The one place that knows every concrete compressor (its name, its wire
// counter, how to build it from a CompressionSpec), so the engine only sees
// the interface.
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

namespace {

std::unique_ptr<Compressor> MakeFp16(const CompressionSpec&) { return std::make_unique<FP16Compressor>(); }

std::unique_ptr<Compressor> MakeTopK(const CompressionSpec& spec) {
  // Validated earlier with a proper error; here only refuse to build nonsense.
  if (!(spec.topk_ratio > 0.0 && spec.topk_ratio <= 1.0)) return nullptr;
  std::unique_ptr<Compressor> topk = std::make_unique<TopKCompressor>(
      spec.topk_ratio, TopKCompressor::kDefaultSampleSize, TopKCompressor::kEngineSendWholeBelow);
  if (spec.error_feedback) return std::make_unique<ErrorFeedback>(std::move(topk));
  return topk;
}

// Every compressor the engine knows, one row each. Adding one is a row here,
// its value in CompressionType (common.h, the C API's code) and its object in
// hvdlite/compression.py; its specific argument checks go in
// request_validation.cc.
struct CompressorKind {
  CompressionType type;
  const char* name;
  std::atomic<int64_t> EngineStats::*wire_bytes;  // the counter of what it puts on the wire
  std::unique_ptr<Compressor> (*create)(const CompressionSpec& spec);
};

const CompressorKind kKinds[] = {
    {CompressionType::kNone, "none", &EngineStats::wire_bytes_none, nullptr},
    {CompressionType::kFP16, "fp16", &EngineStats::wire_bytes_fp16, MakeFp16},
    {CompressionType::kTopK, "topk", &EngineStats::wire_bytes_topk, MakeTopK},
};

const CompressorKind* Find(CompressionType type) {
  for (const auto& kind : kKinds) {
    if (kind.type == type) return &kind;
  }
  return nullptr;
}

}  // namespace

bool IsValidCompression(int32_t value) {
  return Find(static_cast<CompressionType>(value)) != nullptr;
}

const char* CompressionName(CompressionType type) {
  const CompressorKind* kind = Find(type);
  return kind ? kind->name : "unknown";
}

std::atomic<int64_t> EngineStats::*WireBytesStat(CompressionType type) {
  const CompressorKind* kind = Find(type);
  return kind ? kind->wire_bytes : &EngineStats::wire_bytes_none;
}

std::unique_ptr<Compressor> CreateCompressor(const CompressionSpec& spec) {
  const CompressorKind* kind = Find(spec.type);
  return kind && kind->create ? kind->create(spec) : nullptr;
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
