// The interface every wire implements: the collectives a process set runs,
// and the three small exchanges of negotiation. A process set picks its
// transport once, when it is created (MpiTransport, or ShmTransport when all
// its ranks share a host), and everything above (controller, operations,
// Adasum) talks to this interface only, so a new wire (a pipelined ring
// between hosts, hierarchical, device collectives) is a new Transport, not an
// edit of the callers. PyTorch's c10d ProcessGroup and Gloo's transport are
// the models.
//
// Element types and reductions: the transport reduces `dtype` with `op` when
// Supports(dtype, op) says so (Average is passed as Sum plus a scale: callers
// fold 1/size into `scale`). Reductions of 16-bit floats and of compressors'
// wire forms use the kernels of reduce_kernels.h on every transport, so each
// gives the same bits.
//
// Threading: used from the engine thread only. Every wait follows the engine's
// WaitPolicy and stops on abort (abort_signal.h) or HVDLITE_TIMEOUT_SECONDS
// with an error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "common/common.h"
#include "common/status.h"

namespace hvdlite {

class Transport;

// A collective started by StartAllreduce / StartAllgather; the transport that
// started it completes it.
class TransportWork {
 public:
  virtual ~TransportWork() = default;
  // Completes the collective (and applies the scale given to StartAllreduce).
  virtual Status Wait() = 0;
  // Lets the collective move on while the caller does other work: MPI moves
  // nonblocking collectives only inside MPI calls.
  virtual void Progress() {}
  // Whether the collective already ran inside Start (a synchronous wire);
  // Wait then only reports how it went.
  virtual bool done() const { return false; }
};

// A collective that ran inside its Start (shared memory, a compressed
// allreduce between hosts): Wait only reports how it went.
class DoneWork : public TransportWork {
 public:
  explicit DoneWork(Status status) : status_(std::move(status)) {}
  Status Wait() override { return status_; }
  bool done() const override { return true; }

 private:
  Status status_;
};

// A set spread over several hosts with several ranks on each, as two levels:
// the ranks of this host, and the ranks that hold the same block on every
// host (one per host, in host order). Collectives that treat the link
// between hosts differently from the host's memory (compression between
// hosts only) run on these.
struct HostLevels {
  Transport* host = nullptr;
  Transport* across = nullptr;
};

// Where each rank of such a set sits: rank_at[h * per_host + l] is the set
// rank with local rank l on the h-th host (hosts in the order of HostLevels'
// `across`, local ranks in the order of its `host`).
struct HostGrid {
  int hosts = 0, per_host = 0;
  std::vector<int> rank_at;

  int RankAt(int host, int local) const { return rank_at[static_cast<size_t>(host * per_host + local)]; }
  // Column `local` (every host's rank with that local rank): their `sizes`, by host.
  std::vector<int64_t> Column(const std::vector<int64_t>& sizes, int local) const {
    std::vector<int64_t> out(static_cast<size_t>(hosts));
    for (int h = 0; h < hosts; ++h) out[static_cast<size_t>(h)] = sizes[static_cast<size_t>(RankAt(h, local))];
    return out;
  }
  // Each column's total of `sizes`, by local rank.
  std::vector<int64_t> ColumnTotals(const std::vector<int64_t>& sizes) const {
    std::vector<int64_t> out(static_cast<size_t>(per_host), 0);
    for (int l = 0; l < per_host; ++l) {
      for (int64_t n : Column(sizes, l)) out[static_cast<size_t>(l)] += n;
    }
    return out;
  }
};

// What the autotuner (autotuner.h) may change on a wire between hosts.
struct WireSettings {
  int64_t ring_chunk_bytes = 0;  // 0: the wire has no ring
  int hierarchical = -1;         // -1: not possible on this layout; 0 off (MPI), 1 on
};

class Transport {
 public:
  // `send` argument meaning "the input is already in `recv`".
  static constexpr const void* kInPlace = nullptr;

  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Whether StartAllreduce / Allreduce / ReduceScatter take this pair.
  virtual bool Supports(DataType dtype, ReduceOp op) const = 0;
  // The timeline's name for running `op` (with this element type and
  // reduction, where it reduces) on this wire: "MPI_ALLREDUCE",
  // "SHM_ALLREDUCE", "MPI_BCAST", ... (timeline_names.h).
  virtual const char* Activity(OpType op, DataType dtype = DataType::kUInt8,
                               ReduceOp reduce = ReduceOp::kSum) const = 0;

  // Reduces `count` elements of every rank's `send` into `recv` and
  // multiplies the result by `scale`. `count` must fit one call (INT_MAX).
  virtual Status StartAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                ReduceOp op, double scale,
                                std::unique_ptr<TransportWork>* work) = 0;
  // Every rank sends `bytes` bytes; `recv` gets size() blocks in rank order.
  virtual Status StartAllgather(const void* send, int64_t bytes, void* recv,
                                std::unique_ptr<TransportWork>* work) = 0;

  // Blocking collectives. Allreduce is in place and splits counts beyond
  // one call.
  virtual Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) = 0;
  virtual Status Broadcast(void* data, int64_t bytes, int root) = 0;
  // Ranks contribute byte blocks of different sizes, concatenated in rank order.
  virtual Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                            const std::vector<int64_t>& bytes_per_rank) = 0;
  virtual Status Alltoallv(const void* input, const std::vector<int64_t>& send_bytes, void* output,
                           const std::vector<int64_t>& recv_bytes) = 0;
  // Reduces every rank's `input` and leaves block r (counts[r] elements) on rank r.
  virtual Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                               DataType dtype, ReduceOp op) = 0;
  virtual Status Barrier() = 0;
  // Sends to `peer` while receiving from it (either size may be 0); never
  // matches a collective. Adasum's pairwise exchanges.
  virtual Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                          int peer, int tag) = 0;

  // Negotiation: a bitwise AND of a small vector over the set, in place, and
  // the coordinator's gather of requests and broadcast of responses.
  virtual Status BitwiseAnd(uint64_t* words, int count) = 0;
  virtual Status GatherBytes(const std::vector<uint8_t>& mine, int root,
                             std::vector<std::vector<uint8_t>>* all) = 0;
  virtual Status BroadcastBytes(std::vector<uint8_t>* bytes, int root) = 0;
  // A check negotiation's waits run now and then: where it reports a lost
  // peer and the exchange has not completed within a grace (a peer that
  // finished the last round and closed in order completes it), the wait
  // ends with that error instead of waiting on MPI for a peer whose engine
  // has stopped. Wires that see a peer go (the ring's sockets) set it.
  virtual void WatchDuringNegotiation(std::function<Status()> peer_lost) { (void)peer_lost; }

  // The wire's tunable settings; false when it has none. Tune applies new
  // ones between rounds (nothing in flight), the same on every rank.
  virtual bool GetWireSettings(WireSettings* /*out*/) const { return false; }
  virtual void Tune(const WireSettings& /*settings*/) {}
  // The set's two levels where the wire has them (hierarchical); false otherwise.
  virtual bool GetHostLevels(HostLevels* /*out*/) { return false; }

  // The engine was abandoned on this rank (engine_stop.cc), its thread
  // has stopped: give back what is this process's alone (shared-memory
  // mappings) and call MPI no more, the destructor included (communicators
  // are left to MPI_Finalize: freeing one may wait for a peer that is gone).
  virtual void Abandon() {}
};

}  // namespace hvdlite
