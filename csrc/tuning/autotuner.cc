#include "tuning/autotuner.h"

#include <algorithm>

#include "common/median.h"

namespace hvdlite {

namespace {

constexpr int64_t kMB = 1024 * 1024;
// Fusion thresholds from one tensor per bucket to few large buckets, and
// cycle times around the default (new work starts a round at once, so the
// cycle time matters only for what arrives while a round runs).
const int64_t kFusionCandidates[] = {1 * kMB, 2 * kMB, 4 * kMB, 8 * kMB, 16 * kMB, 32 * kMB, 64 * kMB};
const double kCycleCandidates[] = {0.5, 1.0, 2.0, 5.0};
const int64_t kChunkCandidates[] = {128 * 1024, 512 * 1024, 2 * kMB};
// Samples on a busy machine differ by a few percent; a candidate must beat
// the setting in use by more than that to replace it.
constexpr double kMargin = 0.03;

const char* KnobName(int knob) {
  static const char* const names[] = {"fusion_threshold", "cycle_time", "hierarchical", "ring_chunk"};
  return names[knob];
}

}  // namespace

Autotuner::Autotuner(const EngineOptions& options, int rank, const WireSettings* wire)
    : config_(options.autotune), rank_(rank), tuning_(options.autotune.enabled) {
  current_.fusion_threshold_bytes = options.fusion_threshold_bytes;
  current_.cycle_time_ms = options.cycle_time_ms;
  if (wire != nullptr) current_.wire = *wire;
  best_ = current_;
  if (!tuning_) return;
  if (config_.tune_fusion) knobs_.push_back(Knob::kFusion);
  if (config_.tune_cycle) knobs_.push_back(Knob::kCycle);
  if (current_.wire.hierarchical >= 0) knobs_.push_back(Knob::kHierarchical);
  if (current_.wire.ring_chunk_bytes > 0) knobs_.push_back(Knob::kChunk);
  tuning_ = !knobs_.empty();
  if (tuning_ && rank_ == 0 && !config_.log_path.empty()) {
    log_ = std::fopen(config_.log_path.c_str(), "w");
    if (log_ != nullptr) {
      std::fprintf(log_, "sample,knob,fusion_threshold_bytes,cycle_time_ms,ring_chunk_bytes,hierarchical,"
                         "steps,bytes,seconds,score_bytes_per_second,note\n");
      std::fflush(log_);
    } else {
      std::fprintf(stderr, "hvdlite: cannot write the autotune log %s; tuning without it\n",
                   config_.log_path.c_str());
    }
  }
  started_ = std::chrono::steady_clock::now();
  if (tuning_ && config_.warmup_samples == 0) StartKnob();
}

Autotuner::~Autotuner() {
  if (log_ != nullptr) std::fclose(log_);
}

void Autotuner::StartKnob() {
  candidates_.clear();
  candidate_ = 0;
  samples_here_ = 0;
  auto add = [this](auto change) {
    Candidate c{best_, {}};
    change(&c.settings);
    candidates_.push_back(c);
  };
  switch (knobs_[knob_]) {
    case Knob::kFusion:
      for (int64_t f : kFusionCandidates) add([f](TunedSettings* t) { t->fusion_threshold_bytes = f; });
      break;
    case Knob::kCycle:
      for (double c : kCycleCandidates) add([c](TunedSettings* t) { t->cycle_time_ms = c; });
      break;
    case Knob::kHierarchical:
      for (int h : {1, 0}) add([h](TunedSettings* t) { t->wire.hierarchical = h; });
      break;
    case Knob::kChunk:
      for (int64_t b : kChunkCandidates) add([b](TunedSettings* t) { t->wire.ring_chunk_bytes = b; });
      break;
  }
  incumbent_ = candidates_.size();
  for (size_t i = 0; i < candidates_.size(); ++i) {
    const TunedSettings& c = candidates_[i].settings;
    if (c.fusion_threshold_bytes == best_.fusion_threshold_bytes && c.cycle_time_ms == best_.cycle_time_ms &&
        c.wire.ring_chunk_bytes == best_.wire.ring_chunk_bytes && c.wire.hierarchical == best_.wire.hierarchical) {
      incumbent_ = i;
    }
  }
  current_ = candidates_[0].settings;
}

bool Autotuner::Record(const std::vector<Response>& responses) {
  if (!tuning_) return false;
  bool ended = false;
  for (const Response& r : responses) {
    if (r.kind != Response::Kind::kCollective || r.op() != OpType::kAllreduce) continue;
    // A name seen again in this step begins the next step. A sample counts
    // the bytes of the steps it completed, so samples of a model weigh alike.
    if (!r.request.auto_named && !step_names_.insert(r.name()).second) {
      step_names_.clear();
      step_names_.insert(r.name());
      bytes_ += step_bytes_;
      step_bytes_ = 0;
      ended = ++steps_ >= config_.steps_per_sample || ended;
    }
    step_bytes_ += NumElements(r.request.shape) * static_cast<int64_t>(DataTypeSize(r.request.dtype));
  }
  return ended;
}

Status Autotuner::EndSample(Transport& transport, TunedSettings* next) {
  const auto now = std::chrono::steady_clock::now();
  double seconds = std::chrono::duration<double>(now - started_).count();
  Status s = transport.Allreduce(&seconds, 1, DataType::kFloat64, ReduceOp::kMax);
  if (!s.ok()) return s;
  Advance(seconds);
  // Rank 0's outcome, so that no difference in a rank's arithmetic can make
  // ranks fuse differently.
  double shared[5] = {static_cast<double>(current_.fusion_threshold_bytes), current_.cycle_time_ms,
                      static_cast<double>(current_.wire.ring_chunk_bytes),
                      static_cast<double>(current_.wire.hierarchical), tuning_ ? 1.0 : 0.0};
  s = transport.Broadcast(shared, sizeof(shared), 0);
  if (!s.ok()) return s;
  current_.fusion_threshold_bytes = static_cast<int64_t>(shared[0]);
  current_.cycle_time_ms = shared[1];
  current_.wire.ring_chunk_bytes = static_cast<int64_t>(shared[2]);
  current_.wire.hierarchical = static_cast<int>(shared[3]);
  tuning_ = shared[4] != 0.0;
  *next = current_;
  started_ = std::chrono::steady_clock::now();
  // Step boundaries carry on across samples: the step in progress is the
  // next sample's first.
  steps_ = 0;
  bytes_ = 0;
  return Status::OK();
}

// Scores the sample that just ended and picks what runs next.
void Autotuner::Advance(double seconds) {
  const double score = seconds > 0 ? static_cast<double>(bytes_) / seconds : 0.0;
  ++sample_;
  if (sample_ <= config_.warmup_samples) {
    Log("warmup", seconds, score);
    if (sample_ == config_.warmup_samples) StartKnob();
    return;
  }
  Candidate& c = candidates_[candidate_];
  if (samples_here_++ == 0) {
    Log("settle", seconds, score);  // the first after a change pays for it
    return;
  }
  c.scores.push_back(score);
  Log("scored", seconds, score);
  if (static_cast<int64_t>(c.scores.size()) < config_.samples_per_setting) return;
  if (++candidate_ < candidates_.size()) {
    samples_here_ = 0;
    current_ = candidates_[candidate_].settings;
    return;
  }
  auto winner = std::max_element(candidates_.begin(), candidates_.end(),
                                 [](const Candidate& a, const Candidate& b) {
                                   return Median(a.scores) < Median(b.scores);
                                 });
  if (incumbent_ < candidates_.size() &&
      Median(winner->scores) < Median(candidates_[incumbent_].scores) * (1.0 + kMargin)) {
    winner = candidates_.begin() + static_cast<std::ptrdiff_t>(incumbent_);
  }
  best_ = winner->settings;
  current_ = best_;
  // The ring's chunks do not matter once MPI does the allreduce.
  if (knob_ + 1 < knobs_.size() && knobs_[knob_ + 1] == Knob::kChunk && best_.wire.hierarchical == 0) ++knob_;
  if (++knob_ < knobs_.size()) {
    StartKnob();
    return;
  }
  tuning_ = false;
  Log("best", 0.0, Median(winner->scores));
}

void Autotuner::Log(const char* note, double seconds, double score) {
  if (log_ == nullptr) return;
  const bool best = std::string(note) == "best";
  const TunedSettings& shown = best ? best_ : candidates_.empty() ? current_ : candidates_[candidate_].settings;
  const char* knob = knob_ >= knobs_.size() || candidates_.empty() ? "" : KnobName(static_cast<int>(knobs_[knob_]));
  std::fprintf(log_, "%lld,%s,%lld,%g,%lld,%d,%lld,%lld,%.6f,%.6g,%s\n", static_cast<long long>(sample_), knob,
               static_cast<long long>(shown.fusion_threshold_bytes), shown.cycle_time_ms,
               static_cast<long long>(shown.wire.ring_chunk_bytes), shown.wire.hierarchical,
               static_cast<long long>(best ? 0 : steps_), static_cast<long long>(best ? 0 : bytes_), seconds,
               score, note);
  std::fflush(log_);
}

}  // namespace hvdlite
