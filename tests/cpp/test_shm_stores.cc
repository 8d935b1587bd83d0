// Checks of how the shared-memory allreduce writes its slots:
// StreamingCopy (streaming_copy.h) against memcpy for every head alignment,
// size and tail, touching nothing outside the target; and SlotStoreChoice
// (transport/shm/slot_store_choice.h): which chunks probe the other stores, a
// switch only when the other kind's median is clearly lower, outliers that
// do not decide, probes that get rarer while one kind wins by far and a
// change of the host still seen, and fixed settings that never probe.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "transport/shm/slot_store_choice.h"
#include "kernels/streaming_copy.h"

using namespace hvdlite;

namespace {

void TestStreamingCopy() {
  std::mt19937 rng(7);
  std::vector<uint8_t> src(1024), dst(1024 + 128);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (size_t dst_off : {0, 1, 3, 8, 15, 16, 17, 63, 64}) {
    for (size_t src_off : {0, 1, 5, 16}) {
      for (size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 200, 512, 700}) {
        std::memset(dst.data(), 0xAB, dst.size());
        StreamingCopy(dst.data() + dst_off, src.data() + src_off, n);
        CHECK(std::memcmp(dst.data() + dst_off, src.data() + src_off, n) == 0,
              "bytes differ (dst offset %zu, src offset %zu, %zu bytes)", dst_off, src_off, n);
        bool untouched = true;
        for (size_t i = 0; i < dst.size(); ++i) {
          if ((i < dst_off || i >= dst_off + n) && dst[i] != 0xAB) untouched = false;
        }
        CHECK(untouched, "wrote outside the target (dst offset %zu, %zu bytes)", dst_off, n);
      }
    }
  }
}

// Feeds `chunks` chunks (three steps each) with the time per byte of each
// kind, recording the chunks it is to time, as the allreduce does.
void Feed(SlotStoreChoice& choice, uint64_t first, uint64_t chunks, float cached_ns, float streaming_ns) {
  for (uint64_t seq = first; seq < first + chunks; ++seq) {
    if (!choice.Timed(seq)) continue;
    const float per_byte = choice.For(seq) == SlotStores::kCached ? cached_ns : streaming_ns;
    for (int step = 0; step < 3; ++step) choice.Record(seq, static_cast<int64_t>(per_byte * 1000), 1000);
  }
}

void TestProbes() {
  SlotStoreChoice choice;
  CHECK(choice.preferred() == SlotStores::kCached, "starts with plain stores");
  int probes = 0;
  for (uint64_t seq = 1; seq <= 4 * SlotStoreChoice::kProbeEvery; ++seq) {
    if (choice.For(seq) == SlotStores::kStreaming) ++probes;
  }
  CHECK(probes == 4, "one chunk in %d probes the other stores, got %d in %d",
        static_cast<int>(SlotStoreChoice::kProbeEvery), probes, static_cast<int>(4 * SlotStoreChoice::kProbeEvery));
}

void TestSwitches() {
  SlotStoreChoice choice;
  const uint64_t enough = 4 * SlotStoreChoice::kProbeEvery;
  Feed(choice, 1, enough, 1.0f, 0.9f);  // streaming 10 % faster: not enough to switch
  CHECK(choice.preferred() == SlotStores::kCached && choice.switches() == 0, "no switch for 10 %%");
  Feed(choice, 1 + enough, enough, 5.0f, 1.0f);  // cache-to-cache transfers crawl
  CHECK(choice.preferred() == SlotStores::kStreaming && choice.switches() == 1,
        "switched to streaming stores (switches %lld)", static_cast<long long>(choice.switches()));
  // Now plain stores are probed, and win back when the cores share caches again.
  Feed(choice, 1 + 2 * enough, enough, 1.0f, 2.0f);
  CHECK(choice.preferred() == SlotStores::kCached && choice.switches() == 2, "switched back");
}

void TestOutliers() {
  // Plain stores are faster; a few probe steps of the preferred kind that the
  // scheduler interrupted (milliseconds) must not make the other kind win.
  SlotStoreChoice choice;
  uint64_t seq = 1;
  int interrupted = 0;
  for (; seq <= 8 * SlotStoreChoice::kProbeEvery; ++seq) {
    const bool probe = choice.For(seq) == SlotStores::kStreaming;
    for (int step = 0; step < 3; ++step) {
      float per_byte = probe ? 2.0f : 1.0f;
      if (!probe && seq % 7 == 0 && interrupted < 20) {
        per_byte = 3000.0f;
        ++interrupted;
      }
      choice.Record(seq, static_cast<int64_t>(per_byte * 1000), 1000);
    }
  }
  CHECK(choice.preferred() == SlotStores::kCached && choice.switches() == 0,
        "interrupted steps decided (switches %lld)", static_cast<long long>(choice.switches()));
}

void TestBackoff() {
  // Streaming stores twice as slow: probes get rarer, up to the limit.
  SlotStoreChoice choice;
  uint64_t seq = 1;
  for (int i = 0; i < 12; ++i) {
    Feed(choice, seq, 4 * choice.probe_every(), 1.0f, 2.0f);
    seq += 4 * choice.probe_every();
  }
  CHECK(choice.preferred() == SlotStores::kCached && choice.probe_every() == SlotStoreChoice::kProbeEveryMax,
        "probes every %llu chunks", static_cast<unsigned long long>(choice.probe_every()));
  // The host changes: plain stores become 7x slower. Seen within three of
  // the rarest probe intervals, though the plain stores' samples of the
  // long quiet stretch came before.
  const uint64_t changed = seq;
  while (choice.preferred() == SlotStores::kCached && seq < changed + 3 * SlotStoreChoice::kProbeEveryMax) {
    Feed(choice, seq, 1, 7.0f, 1.0f);
    ++seq;
  }
  CHECK(choice.preferred() == SlotStores::kStreaming, "no switch %llu chunks after the change",
        static_cast<unsigned long long>(seq - changed));
  CHECK(choice.probe_every() == SlotStoreChoice::kProbeEvery, "a switch probes often again");
}

void TestTimed() {
  SlotStoreChoice choice;
  int timed = 0;
  bool probes_timed = true;
  for (uint64_t seq = 1; seq <= 4 * SlotStoreChoice::kProbeEvery; ++seq) {
    if (choice.Timed(seq)) ++timed;
    if (choice.For(seq) != choice.preferred()) probes_timed = probes_timed && choice.Timed(seq);
  }
  CHECK(timed == static_cast<int>(4 * SlotStoreChoice::kProbeEvery / SlotStoreChoice::kTimeEvery),
        "one chunk in %d is timed, got %d", static_cast<int>(SlotStoreChoice::kTimeEvery), timed);
  CHECK(probes_timed, "a probe chunk went untimed");
  // After the probes back off, every probe is still among the timed chunks.
  Feed(choice, 1, 64 * SlotStoreChoice::kProbeEveryMax, 1.0f, 5.0f);
  CHECK(choice.probe_every() == SlotStoreChoice::kProbeEveryMax, "probes backed off to every %llu",
        static_cast<unsigned long long>(choice.probe_every()));
  for (uint64_t seq = 1; seq <= 4 * SlotStoreChoice::kProbeEveryMax; ++seq) {
    if (choice.For(seq) != choice.preferred()) probes_timed = probes_timed && choice.Timed(seq);
  }
  CHECK(probes_timed, "a probe chunk went untimed after the back-off");
  for (SlotStores fixed : {SlotStores::kCached, SlotStores::kStreaming}) {
    SlotStoreChoice still(fixed);
    bool any = false;
    for (uint64_t seq = 1; seq <= 4 * SlotStoreChoice::kProbeEvery; ++seq) any = any || still.Timed(seq);
    CHECK(!any, "a fixed setting timed a chunk");
  }
}

void TestFixed() {
  for (SlotStores fixed : {SlotStores::kCached, SlotStores::kStreaming}) {
    SlotStoreChoice choice(fixed);
    bool same = true;
    for (uint64_t seq = 1; seq <= 4 * SlotStoreChoice::kProbeEvery; ++seq) {
      same = same && choice.For(seq) == fixed;
      choice.Record(seq, fixed == SlotStores::kCached ? 100000 : 1, 1000);
    }
    CHECK(same && choice.preferred() == fixed && choice.switches() == 0, "a fixed setting probed or switched");
  }
}

}  // namespace

int main() {
  return hvdlite_test::RunTests({{"streaming_copy", TestStreamingCopy},
                                 {"probes", TestProbes},
                                 {"switches", TestSwitches},
                                 {"outliers", TestOutliers},
                                 {"backoff", TestBackoff},
                                 {"timed", TestTimed},
                                 {"fixed", TestFixed}});
}
