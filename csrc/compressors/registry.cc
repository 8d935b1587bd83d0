// The table of compressors, filled by each compressor's file at load time
// (registry.h), and the engine's questions to it (compressor.h).
#include "compressors/registry.h"

#include <array>
#include <cstdio>
#include <cstdlib>

#include "compressors/compressor.h"

namespace hvdlite {

int64_t TotalCount(const std::vector<Segment>& segs) {
  int64_t total = 0;
  for (const Segment& s : segs) total += s.count;
  return total;
}

namespace {

// Indexed by code. A function-local static: registrations run during other
// files' static initialisation, in no particular order.
std::array<CompressorKind, kMaxCompressionKinds>& Kinds() {
  static std::array<CompressorKind, kMaxCompressionKinds> kinds{};
  return kinds;
}

// Full precision: nothing to build; its bytes are counted like any kind's.
const bool kNoneRegistered = RegisterCompressor({CompressionType::kNone, "none", nullptr});

}  // namespace

bool RegisterCompressor(const CompressorKind& kind) {
  const int code = static_cast<int>(kind.type);
  if (code < 0 || code >= kMaxCompressionKinds || Kinds()[static_cast<size_t>(code)].name != nullptr) {
    std::fprintf(stderr, "hvdlite: compressor '%s' has a code (%d) that is taken or not below %d\n",
                 kind.name, code, kMaxCompressionKinds);
    std::abort();
  }
  Kinds()[static_cast<size_t>(code)] = kind;
  return true;
}

const CompressorKind* FindCompressorKind(CompressionType type) {
  const int code = static_cast<int>(type);
  if (code < 0 || code >= kMaxCompressionKinds) return nullptr;
  const CompressorKind& kind = Kinds()[static_cast<size_t>(code)];
  return kind.name ? &kind : nullptr;
}

bool IsValidCompression(int32_t value) {
  return FindCompressorKind(static_cast<CompressionType>(value)) != nullptr;
}

int32_t CompressionCode(const std::string& name) {
  for (const auto& kind : Kinds()) {
    if (kind.name && name == kind.name) return static_cast<int32_t>(kind.type);
  }
  return -1;
}

const char* CompressionName(CompressionType type) {
  const CompressorKind* kind = FindCompressorKind(type);
  return kind ? kind->name : "unknown";
}

std::string CompressionArguments(const CompressionSpec& spec) {
  const CompressorKind* kind = FindCompressorKind(spec.type);
  return kind && kind->arguments ? kind->arguments(spec) : "";
}

std::string CheckCompression(const CompressionSpec& spec, OpType op, DataType dtype, int64_t elements) {
  const CompressorKind* kind = FindCompressorKind(spec.type);
  if (kind == nullptr) return "unknown compression code " + std::to_string(static_cast<int>(spec.type));
  if (op == OpType::kReducescatter && !kind->reducescatter) {
    return std::string(kind->name) + " compression applies to allreduce only; use Compression.none, fp16, "
           "bf16 or topk for a reducescatter";
  }
  return kind->check ? kind->check(spec, dtype, elements) : "";
}

std::atomic<int64_t>& WireBytes(EngineStats* stats, CompressionType type) {
  return stats->wire_bytes[static_cast<size_t>(type)];
}

std::unique_ptr<Compressor> CreateCompressor(const CompressionSpec& spec) {
  const CompressorKind* kind = FindCompressorKind(spec.type);
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
