// Counters the engine keeps for users and tests (hvdlite.engine_stats()).
// Written by the engine thread, read by any thread: relaxed atomics.
#pragma once

#include <atomic>
#include <cstdint>

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
  std::atomic<int64_t> fused_buffers{0};
  std::atomic<int64_t> bytes_in{0};         // tensor bytes submitted to reductions
  std::atomic<int64_t> wire_bytes_none{0};  // bytes this rank put on the wire, per compressor
  std::atomic<int64_t> wire_bytes_fp16{0};
  std::atomic<int64_t> wire_bytes_topk{0};
  std::atomic<int64_t> stall_warnings{0};
  // Staging memory the engine keeps between rounds (fusion and compression
  // buffers, grown to the largest bucket seen): a high-water mark, not a leak.
  std::atomic<int64_t> buffer_bytes{0};

  void Add(std::atomic<int64_t>& counter, int64_t n) { counter.fetch_add(n, std::memory_order_relaxed); }
};

// Order of the values hvd_engine_stats() returns; the binding names them.
#define HVDLITE_STATS_FIELDS(X)                                                             \
  X(cycles) X(negotiations) X(cache_hits) X(cache_misses) X(tensors) X(tensors_fused)      \
  X(collectives) X(shm_collectives) X(fused_buffers) X(bytes_in) X(wire_bytes_none) X(wire_bytes_fp16)       \
  X(wire_bytes_topk) X(stall_warnings) X(buffer_bytes)

}  // namespace hvdlite
