// How the shared-memory allreduce writes what a peer reads next (its ring
// slots), and its results: plain stores, or streaming stores that bypass the
// cache (streaming_copy.h), chosen from measurement while the job runs.
//
// Neither is best everywhere. Where the ranks' cores share their caches,
// plain stores hand chunks over from cache to cache, and streaming them
// through memory made a 2-rank allreduce of 6 x 16 MB take 18-20 ms instead
// of 10 ms. Where the host has placed the (virtual) cores far apart, for
// seconds at a time on a shared machine, cache-to-cache transfers crawl
// and plain stores took 72 ms where streaming ones took 14 ms
// (bench/results/2026-11-26-streaming-stores). So every 64th chunk is written
// the other way, the time per byte of each step of every 8th chunk (the
// probes among them) is sampled for both kinds, and the preferred kind
// changes when the other's median is clearly lower. A probe
// of the wrong kind is expensive (up to 7x a chunk's work), so while the
// preferred kind keeps winning by far, probes get rarer (every 128th chunk,
// 256th, ... 1024th: a phase change is still seen within about two steps
// of a 100 MB model); a switch or a close result brings them back to every
// 64th. The intervals are powers of two and chunks are numbered alike on
// every rank, so ranks probe the same chunks; what a rank prefers is its own
// choice (the stores only change the speed, never the bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/wire_options.h"

namespace hvdlite {

enum class SlotStores { kCached = 0, kStreaming = 1 };

class SlotStoreChoice {
 public:
  static constexpr uint64_t kProbeEvery = 64;  // the most frequent probing
  static constexpr uint64_t kProbeEveryMax = 1024;
  // Chunks between timed ones; probe intervals are multiples of it.
  static constexpr uint64_t kTimeEvery = 8;
  static_assert(kProbeEvery % kTimeEvery == 0, "every probe chunk must be timed");
  // Samples of the probed kind needed before comparing (three steps per chunk).
  static constexpr size_t kProbeSamples = 6;
  // The other kind must be this much faster (median) to take over.
  static constexpr double kSwitchRatio = 0.75;
  // A probed kind this much slower (median) makes the next probes rarer.
  static constexpr double kFarRatio = 1.5;

  // `fixed`: always these stores, nothing measured (HVDLITE_SHM_STREAMING_STORES=0 or 1).
  SlotStoreChoice();
  explicit SlotStoreChoice(SlotStores fixed);
  // As HVDLITE_SHM_STREAMING_STORES says: kOn and kOff fixed, kAuto measured.
  static SlotStoreChoice For(Choice setting);
  // The stores for chunk `seq` (the shared-memory chunk counter).
  SlotStores For(uint64_t seq) const;
  // Whether chunk `seq`'s steps are to be timed and recorded: every
  // kTimeEvery-th chunk, probes included; none with a fixed setting. Two
  // clock reads per step of every chunk were ~5 % of the allreduce's CPU.
  bool Timed(uint64_t seq) const { return adaptive_ && seq % kTimeEvery == 0; }
  // One step of chunk `seq` (copy in, sum, or copy out) moved `bytes` in `ns`.
  // Callers record the chunks Timed() names; the preferred kind's median
  // then comes from every 8th chunk.
  void Record(uint64_t seq, int64_t ns, int64_t bytes);
  SlotStores preferred() const { return preferred_; }
  // Times the preferred kind changed so far.
  int64_t switches() const { return switches_; }
  // Chunks between probes now.
  uint64_t probe_every() const { return probe_every_; }

 private:
  static constexpr size_t kMaxSamples = 512;

  SlotStores preferred_ = SlotStores::kCached;
  bool adaptive_ = true;
  uint64_t probe_every_ = kProbeEvery;
  int64_t switches_ = 0;
  std::vector<float> samples_[2];  // ns per byte, by SlotStores
  size_t next_[2] = {0, 0};        // where the next sample goes once samples_ is full
};

}  // namespace hvdlite
