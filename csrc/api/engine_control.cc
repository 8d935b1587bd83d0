// C API: the engine's counters, compute-thread hint, timeline and flight recorder.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "api/c_api.h"
#include "api/runtime.h"

namespace api = hvdlite::api;

namespace {

// Compressor codes that exist, in code order (their wire_bytes counters).
std::vector<int> CompressionCodes() {
  std::vector<int> codes;
  for (int code = 0; code < hvdlite::kMaxCompressionKinds; ++code) {
    if (hvdlite::IsValidCompression(code)) codes.push_back(code);
  }
  return codes;
}

}  // namespace

extern "C" {

int hvd_engine_stats(int64_t* values, int32_t capacity) {
  auto engine = api::CurrentEngine();
  if (!engine) return -1;
  auto& st = engine->stats();
  std::vector<int64_t> all;
#define HVDLITE_STAT_VALUE(name) all.push_back(st.name.load(std::memory_order_relaxed));
  HVDLITE_STATS_FIELDS(HVDLITE_STAT_VALUE)
#undef HVDLITE_STAT_VALUE
  for (int code : CompressionCodes()) {
    all.push_back(st.wire_bytes[static_cast<size_t>(code)].load(std::memory_order_relaxed));
  }
  const int n = std::min<int>(capacity, static_cast<int>(all.size()));
  std::copy(all.begin(), all.begin() + n, values);
  return static_cast<int>(all.size());
}

const char* hvd_engine_stats_names(void) {
  static const std::string names = [] {
#define HVDLITE_STAT_NAME(name) #name ","
    std::string all = HVDLITE_STATS_FIELDS(HVDLITE_STAT_NAME);
#undef HVDLITE_STAT_NAME
    for (int code : CompressionCodes()) {
      all += std::string("wire_bytes_") +
             hvdlite::CompressionName(static_cast<hvdlite::CompressionType>(code)) + ",";
    }
    return all;
  }();
  return names.c_str();
}

int hvd_set_compute_threads(int32_t threads) {
  auto engine = api::CurrentEngine();
  if (!engine) return -api::LastErrorKind();
  engine->SetComputeThreads(threads);
  return 0;
}

int hvd_start_timeline(const char* path, int mark_cycles) {
  auto engine = api::CurrentEngine();
  if (!engine) return -api::LastErrorKind();
  hvdlite::Status s = engine->StartTimeline(path ? path : "", mark_cycles != 0);
  return s.ok() ? 0 : api::SetError(s);
}

int hvd_stop_timeline(void) {
  auto engine = api::CurrentEngine();
  if (!engine) return -api::LastErrorKind();
  engine->StopTimeline();
  return 0;
}

int64_t hvd_flight_recorder_json(char* buffer, int64_t length) {
  // The engine that ran the handles: a failed or shut-down one still has its record.
  auto engine = api::EngineOfHandles();
  if (!engine) return api::SetError(hvdlite::ErrorKind::kNotInitialized, "hvdlite is not initialised; call hvdlite.init() first");
  const std::string text = engine->FlightRecorderText("hvdlite.flight_recorder()");
  if (buffer != nullptr && length > 0) {
    const size_t n = std::min<size_t>(text.size(), static_cast<size_t>(length - 1));
    std::memcpy(buffer, text.data(), n);
    buffer[n] = 0;
  }
  return static_cast<int64_t>(text.size());
}

}  // extern "C"
