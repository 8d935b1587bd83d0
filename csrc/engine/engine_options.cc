#include "engine/engine_options.h"

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "negotiation/rank_agreement.h"

namespace hvdlite {

namespace {

constexpr int64_t kMaxFlightRecorderEvents = int64_t{1} << 20;

// Returns the variable that is set (HVDLITE_ first), or nullptr.
const char* Lookup(const std::string& suffix, std::string* used_name) {
  for (const char* prefix : {"HVDLITE_", "HOROVOD_"}) {
    std::string name = prefix + suffix;
    const char* value = std::getenv(name.c_str());
    if (value != nullptr && value[0] != '\0') {
      *used_name = name;
      return value;
    }
  }
  return nullptr;
}

Status BadValue(const std::string& name, const char* value, const char* expected) {
  return Status::InvalidArgument(name + "='" + value + "' is not valid: expected " + expected +
                                 ". Fix or unset the variable and start again.");
}

Status ReadInt(const std::string& suffix, int64_t min_value, int64_t* out) {
  std::string name;
  const char* value = Lookup(suffix, &name);
  if (value == nullptr) return Status::OK();
  char* end = nullptr;
  errno = 0;
  long long parsed = std::strtoll(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || parsed < min_value) {
    std::string expected = "an integer >= " + std::to_string(min_value);
    return BadValue(name, value, expected.c_str());
  }
  *out = parsed;
  return Status::OK();
}

Status ReadDouble(const std::string& suffix, double min_value, double* out) {
  std::string name;
  const char* value = Lookup(suffix, &name);
  if (value == nullptr) return Status::OK();
  char* end = nullptr;
  errno = 0;
  double parsed = std::strtod(value, &end);
  if (errno != 0 || end == value || *end != '\0' || !std::isfinite(parsed) || parsed < min_value) {
    std::string expected = "a number >= " + std::to_string(min_value);
    return BadValue(name, value, expected.c_str());
  }
  *out = parsed;
  return Status::OK();
}

Status ReadBool(const std::string& suffix, bool* out) {
  std::string name;
  const char* value = Lookup(suffix, &name);
  if (value == nullptr) return Status::OK();
  std::string v(value);
  if (v == "1" || v == "true" || v == "True" || v == "yes") {
    *out = true;
  } else if (v == "0" || v == "false" || v == "False" || v == "no") {
    *out = false;
  } else {
    return BadValue(name, value, "0 or 1");
  }
  return Status::OK();
}

Status ReadChoice(const std::string& suffix, Choice* out) {
  std::string name;
  const char* value = Lookup(suffix, &name);
  if (value == nullptr) return Status::OK();
  const std::string v(value);
  if (v == "auto") {
    *out = Choice::kAuto;
  } else if (v == "1" || v == "true" || v == "True" || v == "yes") {
    *out = Choice::kOn;
  } else if (v == "0" || v == "false" || v == "False" || v == "no") {
    *out = Choice::kOff;
  } else {
    return BadValue(name, value, "auto, 0 or 1");
  }
  return Status::OK();
}

// A variable that names one of `values`; `expected` lists them for the error.
template <typename T>
Status ReadNamed(const std::string& suffix, std::initializer_list<std::pair<const char*, T>> values,
                 const char* expected, T* out) {
  std::string name;
  const char* value = Lookup(suffix, &name);
  if (value == nullptr) return Status::OK();
  for (const auto& [text, v] : values) {
    if (std::strcmp(value, text) == 0) {
      *out = v;
      return Status::OK();
    }
  }
  return BadValue(name, value, expected);
}

// A comma-separated list of network interface names.
Status ReadInterfaces(const std::string& suffix, std::vector<std::string>* out) {
  std::string name;
  const char* value = Lookup(suffix, &name);
  if (value == nullptr) return Status::OK();
  std::vector<std::string> names;
  std::string text(value);
  for (size_t start = 0; start <= text.size();) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string one = text.substr(start, end - start);
    if (one.empty() || one.size() >= 16) {  // IFNAMSIZ: names are at most 15 characters
      return BadValue(name, value,
                      "interface names (at most 15 characters each) separated by commas, e.g. eth0,eth1");
    }
    names.push_back(one);
    start = end + 1;
  }
  *out = names;
  return Status::OK();
}

// The engine thread's waits (transport/waiter.h).
Status ReadWaitPolicy(EngineOptions& o) {
  Status s;
  if (!(s = ReadInt("WAIT_SPIN_US", 0, &o.wait.spin_us)).ok()) return s;
  if (!(s = ReadInt("WAIT_YIELD_US", 0, &o.wait.yield_us)).ok()) return s;
  if (!(s = ReadInt("WAIT_SLEEP_US", 1, &o.wait.sleep_us)).ok()) return s;
  if (!(s = ReadInt("WAIT_NEGOTIATION_YIELD_US", 0, &o.wait.negotiation_yield_us)).ok()) return s;
  return ReadDouble("TIMEOUT_SECONDS", 0.0, &o.wait.timeout_seconds);
}

}  // namespace

Status EngineOptions::FromEnvironment(EngineOptions* out) {
  EngineOptions o;
  Status s;
  if (!(s = ReadDouble("CYCLE_TIME", 0.0, &o.cycle_time_ms)).ok()) return s;
  if (!(s = ReadInt("FUSION_THRESHOLD", 0, &o.fusion_threshold_bytes)).ok()) return s;
  if (!(s = ReadInt("DIRECT_THRESHOLD", 0, &o.direct_threshold_bytes)).ok()) return s;
  if (!(s = ReadBool("SHM_ALLREDUCE", &o.shm.allreduce)).ok()) return s;
  if (!(s = ReadInt("SHM_CHUNK_BYTES", 4096, &o.shm.chunk_bytes)).ok()) return s;
  if (!(s = ReadInt("SHM_SLOTS", 2, &o.shm.slots)).ok()) return s;
  if (!(s = ReadChoice("SHM_STREAMING_STORES", &o.shm.streaming_stores)).ok()) return s;
  if (!(s = ReadInt("CACHE_CAPACITY", 0, &o.cache_capacity)).ok()) return s;
  if (!(s = ReadChoice("RING_ALLREDUCE", &o.ring.allreduce)).ok()) return s;
  if (!(s = ReadInt("RING_THRESHOLD", 0, &o.ring.threshold_bytes)).ok()) return s;
  if (!(s = ReadInt("RING_CHUNK_BYTES", 1024, &o.ring.chunk_bytes)).ok()) return s;
  if (!(s = ReadInt("RING_WINDOW", 1, &o.ring.window)).ok()) return s;
  s = ReadNamed<RingWire>("RING_WIRE", {{"mpi", RingWire::kMpi}, {"socket", RingWire::kSocket}}, "mpi or socket",
                          &o.ring.wire);
  if (!s.ok()) return s;
  if (!(s = ReadInterfaces("SOCKET_IFNAME", &o.ring.socket_interfaces)).ok()) return s;
  if (!(s = ReadChoice("HIERARCHICAL_ALLREDUCE", &o.hierarchical.allreduce)).ok()) return s;
  if (!(s = ReadChoice("HIERARCHICAL_ALLGATHER", &o.hierarchical.allgather)).ok()) return s;
  if (!(s = ReadInt("HIERARCHICAL_PIECE_BYTES", 1024, &o.hierarchical.piece_bytes)).ok()) return s;
  std::string name;
  // "DYNAMIC" (Horovod's value) means: no file now, start_timeline() later.
  if (const char* path = Lookup("TIMELINE", &name)) {
    if (std::string(path) != "DYNAMIC") o.timeline_path = path;
  }
  if (!(s = ReadBool("TIMELINE_MARK_CYCLES", &o.timeline_mark_cycles)).ok()) return s;
  bool stall_disabled = false;
  if (!(s = ReadBool("STALL_CHECK_DISABLE", &stall_disabled)).ok()) return s;
  o.stall_check_enabled = !stall_disabled;
  if (!(s = ReadDouble("STALL_CHECK_TIME_SECONDS", 0.0, &o.stall_check_seconds)).ok()) return s;
  if (!(s = ReadDouble("STALL_SHUTDOWN_TIME_SECONDS", 0.0, &o.stall_shutdown_seconds)).ok()) {
    return s;
  }
  if (!(s = ReadWaitPolicy(o)).ok()) return s;
  if (!(s = ReadNamed<EnginePriority>("ENGINE_PRIORITY",
                                      {{"auto", EnginePriority::kAuto}, {"normal", EnginePriority::kNormal},
                                       {"batch", EnginePriority::kBatch}, {"idle", EnginePriority::kIdle}},
                                      "auto, normal, batch or idle", &o.priority))
           .ok()) {
    return s;
  }
  if (!(s = ReadNamed<EngineAffinityMode>("ENGINE_AFFINITY",
                                          {{"auto", EngineAffinityMode::kAuto},
                                           {"follow", EngineAffinityMode::kFollow},
                                           {"none", EngineAffinityMode::kNone}},
                                          "auto, follow or none", &o.affinity))
           .ok()) {
    return s;
  }
  if (!(s = ReadInt("FLIGHT_RECORDER_EVENTS", 0, &o.flight_recorder_events)).ok()) return s;
  if (o.flight_recorder_events > kMaxFlightRecorderEvents) {  // allocated at init, all of it
    const std::string value = std::to_string(o.flight_recorder_events);
    return BadValue("HVDLITE_FLIGHT_RECORDER_EVENTS", value.c_str(), "an integer from 0 to 1048576");
  }
  if (const char* dir = Lookup("FLIGHT_RECORDER_DIR", &name)) o.flight_recorder_dir = dir;
  if (!(s = ReadBool("AUTOTUNE", &o.autotune.enabled)).ok()) return s;
  if (const char* path = Lookup("AUTOTUNE_LOG", &name)) o.autotune.log_path = path;
  if (!(s = ReadInt("AUTOTUNE_WARMUP_SAMPLES", 0, &o.autotune.warmup_samples)).ok()) return s;
  if (!(s = ReadInt("AUTOTUNE_STEPS_PER_SAMPLE", 1, &o.autotune.steps_per_sample)).ok()) return s;
  if (!(s = ReadInt("AUTOTUNE_SAMPLES_PER_SETTING", 1, &o.autotune.samples_per_setting)).ok()) return s;
  o.autotune.tune_fusion = Lookup("FUSION_THRESHOLD", &name) == nullptr;
  o.autotune.tune_cycle = Lookup("CYCLE_TIME", &name) == nullptr;
  *out = o;
  return Status::OK();
}

namespace {

// SharedSettings' fields, in the order of the variables that set them.
constexpr const char* kSharedVariables[] = {
    "HVDLITE_FUSION_THRESHOLD", "HVDLITE_DIRECT_THRESHOLD", "HVDLITE_CACHE_CAPACITY",
    "HVDLITE_SHM_CHUNK_BYTES",  "HVDLITE_SHM_SLOTS",        "HVDLITE_RING_THRESHOLD",
    "HVDLITE_RING_CHUNK_BYTES", "HVDLITE_HIERARCHICAL_PIECE_BYTES",
};

template <typename Options>  // EngineOptions, const or not
std::array<decltype(&std::declval<Options&>().cache_capacity), 8> SharedFields(Options& o) {
  return {&o.fusion_threshold_bytes, &o.direct_threshold_bytes, &o.cache_capacity, &o.shm.chunk_bytes,
          &o.shm.slots,             &o.ring.threshold_bytes,   &o.ring.chunk_bytes, &o.hierarchical.piece_bytes};
}

}  // namespace

std::vector<int64_t> EngineOptions::SharedSettings() const {
  std::vector<int64_t> out;
  for (const int64_t* field : SharedFields(*this)) out.push_back(*field);
  return out;
}

std::vector<std::string> EngineOptions::AdoptSharedSettings(const std::vector<int64_t>& root) {
  std::vector<std::string> changed;
  const auto fields = SharedFields(*this);
  for (size_t i = 0; i < fields.size() && i < root.size(); ++i) {
    if (*fields[i] != root[i]) {
      changed.push_back(kSharedVariables[i]);
      *fields[i] = root[i];
    }
  }
  return changed;
}

Status ShareSettingsOfRoot(MPI_Comm comm, int rank, EngineOptions* options) {
  std::vector<int64_t> values = options->SharedSettings();
  Status shared = ShareRootValues(comm, values.data(), static_cast<int>(values.size()), "the engine settings");
  if (!shared.ok()) return shared;
  const std::vector<std::string> changed = options->AdoptSharedSettings(values);
  if (!changed.empty()) {
    std::string names;
    for (const std::string& n : changed) names += (names.empty() ? "" : ", ") + n;
    std::fprintf(stderr,
                 "hvdlite: rank %d: set differently than on rank 0: %s; using rank 0's values "
                 "(every rank must use the same ones: they decide what goes on the wire)\n",
                 rank, names.c_str());
  }
  return Status::OK();
}

}  // namespace hvdlite
