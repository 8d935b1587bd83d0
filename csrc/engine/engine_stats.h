// Counters the engine keeps for users and tests (hvdlite.engine_stats()).
// Written by the engine thread, read by any thread: relaxed atomics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "common/common.h"

namespace hvdlite {

struct EngineStats {
  std::atomic<int64_t> cycles{0};
  std::atomic<int64_t> negotiations{0};     // rounds that went to the coordinator
  std::atomic<int64_t> cache_hits{0};
  std::atomic<int64_t> cache_misses{0};
  std::atomic<int64_t> tensors{0};          // tensors completed
  std::atomic<int64_t> tensors_fused{0};    // of those, reduced inside a fusion buffer
  std::atomic<int64_t> collectives{0};      // data collectives issued (MPI or shared memory)
  std::atomic<int64_t> shm_collectives{0};  // of those, reduced through shared memory
  std::atomic<int64_t> ring_collectives{0};  // of those, reduced around the ring between hosts
  std::atomic<int64_t> socket_ring_collectives{0};  // of those, over the ring's own sockets
  std::atomic<int64_t> hierarchical_allgathers{0};  // allgathers across hosts by local rank, then in the host
  std::atomic<int64_t> hierarchical_reducescatters{0};  // reducescatters in the host, then across hosts
  std::atomic<int64_t> fused_buffers{0};
  std::atomic<int64_t> bytes_in{0};         // tensor bytes submitted to reductions
  std::atomic<int64_t> stall_warnings{0};
  // Staging memory the engine keeps between rounds (fusion and compression
  // buffers, grown to the largest bucket seen): a high-water mark, not a leak.
  std::atomic<int64_t> buffer_bytes{0};
  // 1 while the engine thread runs at SCHED_IDLE (HVDLITE_ENGINE_PRIORITY,
  // or chosen by its default, auto).
  std::atomic<int64_t> engine_idle_priority{0};
  // 1 while waits pin the engine thread to the waiting thread's core; how
  // often they did, and how often a pinned engine was kept from its core and
  // released (engine_affinity.h).
  std::atomic<int64_t> engine_follows_waiter{0};
  std::atomic<int64_t> engine_affinity_pins{0};
  std::atomic<int64_t> engine_affinity_releases{0};
  // auto: trials that kept the pin, and trials that let the engine roam
  // (affinity_trial.h).
  std::atomic<int64_t> engine_affinity_chose_pinned{0};
  std::atomic<int64_t> engine_affinity_chose_unpinned{0};
  // Bytes the shared-memory allreduce wrote to its slots with streaming
  // stores, and how often a rank changed its preferred stores
  // (transport/shm/slot_store_choice.h).
  std::atomic<int64_t> shm_streamed_bytes{0};
  std::atomic<int64_t> shm_store_switches{0};

  // Bytes this rank put on the wire, per compression code (WireBytes() in
  // compressors/compressor.h; named "wire_bytes_<name>" by the C API).
  std::array<std::atomic<int64_t>, kMaxCompressionKinds> wire_bytes{};

  void Add(std::atomic<int64_t>& counter, int64_t n) { counter.fetch_add(n, std::memory_order_relaxed); }
};

// Order of the values hvd_engine_stats() returns (the wire bytes of each
// registered compressor follow); the binding names them.
#define HVDLITE_STATS_FIELDS(X)                                                             \
  X(cycles) X(negotiations) X(cache_hits) X(cache_misses) X(tensors) X(tensors_fused)      \
  X(collectives) X(shm_collectives) X(ring_collectives) X(hierarchical_allgathers)         \
  X(hierarchical_reducescatters) X(fused_buffers) X(bytes_in) X(stall_warnings) X(buffer_bytes)  \
  X(engine_idle_priority) X(engine_follows_waiter) X(engine_affinity_pins)                  \
  X(engine_affinity_releases) X(engine_affinity_chose_pinned)                              \
  X(engine_affinity_chose_unpinned) X(shm_streamed_bytes) X(shm_store_switches)               \
  X(socket_ring_collectives)

}  // namespace hvdlite
