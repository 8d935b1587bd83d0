// Tunes the engine while the job trains (HVDLITE_AUTOTUNE=1, Horovod's
// HOROVOD_AUTOTUNE): the fusion threshold and the cycle time that suit a
// model and a network, and between hosts the ring's chunk size and whether
// the allreduce is hierarchical, are found by measuring, not guessed.
//
// The job's first steps are cut into samples of `steps_per_sample` training
// steps; a step ends where a tensor name repeats. Each sample scores the
// setting it ran with by the bytes allreduced per second of wall time, the
// training's compute included, so the score is what a user feels. The search
// goes one knob at a time (fusion thresholds at the starting cycle time, then
// cycle times at the best threshold, then hierarchical on or off and the
// ring's chunk size where the wire has them): each candidate runs one sample to
// settle, then `samples_per_setting` scored ones, and the best median wins
// if it beats the setting in use by more than the samples' noise (3 %).
// After the search the engine keeps the winner for the rest of the job.
//
// Every rank decides the same: a sample ends in the same round everywhere
// (the rounds' responses are the same on every rank), its time is the
// slowest rank's, and rank 0's resulting settings are broadcast. Rank 0
// writes every sample to `log_path` (CSV) when one is given.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/engine_options.h"
#include "negotiation/message.h"
#include "transport/transport.h"

namespace hvdlite {

struct TunedSettings {
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0.0;
  WireSettings wire;  // of the global set's transport (ring_chunk_bytes 0: none)
};

class Autotuner {
 public:
  // `options.autotune` must already be the same on every rank; `wire`: what
  // the global set's transport lets tune (nullptr: nothing).
  Autotuner(const EngineOptions& options, int rank, const WireSettings* wire);
  ~Autotuner();
  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  bool tuning() const { return tuning_; }
  const TunedSettings& settings() const { return current_; }

  // The responses one round of the global set ran (the same on every rank).
  // True when they end a sample: every rank then calls EndSample at once.
  bool Record(const std::vector<Response>& responses);
  // Agrees on the sample's time (the slowest rank's) over `transport`,
  // scores the sample, logs it, and moves the search on; `*next` gets the
  // settings to run from now on (rank 0's, broadcast).
  Status EndSample(Transport& transport, TunedSettings* next);

 private:
  enum class Knob { kFusion, kCycle, kHierarchical, kChunk };
  struct Candidate {
    TunedSettings settings;
    std::vector<double> scores;
  };

  void StartKnob();
  void Advance(double seconds);  // the sample's time, the slowest rank's
  void Log(const char* note, double seconds, double score);

  EngineOptions::Autotune config_;
  int rank_;
  bool tuning_;
  std::vector<Knob> knobs_;
  size_t knob_ = 0;
  std::vector<Candidate> candidates_;
  size_t candidate_ = 0;
  size_t incumbent_ = 0;           // the candidate that is the setting in use (size(): none)
  int64_t sample_ = 0;             // samples ended so far
  int64_t samples_here_ = 0;       // samples of the current candidate
  TunedSettings current_, best_;
  // The sample in progress.
  std::chrono::steady_clock::time_point started_;
  int64_t steps_ = 0;
  int64_t bytes_ = 0;       // of the steps this sample completed
  int64_t step_bytes_ = 0;  // of the step in progress
  std::unordered_set<std::string> step_names_;
  std::FILE* log_ = nullptr;
};

}  // namespace hvdlite
