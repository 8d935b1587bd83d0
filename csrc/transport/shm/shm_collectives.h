// Collectives through shared memory, for a process set whose ranks all run on
// one host: the allreduce of gradients, and the bitwise AND of negotiation.
//
// Allreduce. MPI's intra-node allreduce moves every byte several times (into
// its shared cells, out into a temporary, reduced, and again for the
// allgather half); on a host whose cores also run training, those copies are
// CPU time taken from the backward pass. Here each chunk is reduce-scattered
// and allgathered through the segment: rank p owns part p of the chunk; every
// rank copies the parts others own into its slot, each owner sums its part in
// rank order (its own share straight from its input) into a result slot, and
// every rank copies the results back. The chunks stay in cache, each element
// is summed by one rank (the same bits everywhere), and each rank makes four
// passes over its bytes.
//
// Slots live in one POSIX shared-memory segment that rank 0 of the set creates
// and unlinks as soon as everyone has mapped it, so nothing is left behind
// when a process dies. Each rank has a ring of slots and two counters
// (published / consumed), each on its own cache line. A rank copies ahead
// into its ring while a peer has not published yet, so ranks are not held in
// lockstep chunk by chunk: on a host whose cores also run backward, a peer's
// engine thread is often not scheduled, and a lockstep exchange then waited
// for every chunk. Waits spin briefly, then sleep on a futex in the segment
// that every publish and consume wakes, so a waiting rank gives its core to
// the training thread and is scheduled again the moment a peer moves. The
// spin adapts: it shrinks while waits outlast it (the peer's engine is not
// running) and grows back while peers answer within it. Slots are written
// with plain or streaming stores, whichever measures faster on this host
// right now (slot_store_choice.h). Where streaming stores win (the host has
// placed the cores far apart, so lines another core last held move slowly),
// the results are streamed into the caller's buffer too: the gradients the
// training thread wrote and reads next.
//
// Bitwise AND. Every negotiation round ANDs a small bit vector over the set.
// Through MPI, a rank whose peer is behind (a slower backward) polls for the
// whole wait: polling with sched_yield takes a share of a core from the
// training threads, and napping makes every round late. Here each rank writes
// its vector to its row of a board and sleeps on the same futex until every
// row holds this round.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/common.h"
#include "common/status.h"
#include "engine/engine_stats.h"
#include "transport/abort_signal.h"
#include "transport/wire_options.h"
#include "transport/shm/slot_store_choice.h"

namespace hvdlite {

// What the shared-memory wire is set up with.
struct ShmSetup {
  ShmOptions options;
  WaitPolicy wait;
  int64_t cache_capacity = 0;  // the response cache's slots: the negotiation board's bits
  EngineStats* stats = nullptr;
  const AbortSignal* abort = nullptr;
};

class ShmCollectives {
 public:
  // Collective over `comm`. Returns nullptr (and MPI stays the wire) when any
  // rank does not `want` it (the set spans hosts, or the path is turned off),
  // there is one rank, or any rank could not map the segment; every rank gets
  // the same answer.
  // `stats` counts what the stores do (shm_streamed_bytes, shm_store_switches).
  static std::unique_ptr<ShmCollectives> Create(MPI_Comm comm, bool want, const ShmSetup& setup);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // Whether Allreduce handles this element type and op (the kernels of
  // reduce_kernels.h: every numeric type with Sum, Min, Max, Product).
  static bool Supports(DataType dtype, ReduceOp op);
  // `send` may be Transport::kInPlace (then `recv` holds the input). Blocks until
  // this rank's result is complete; peers finish the same call at about the
  // same time. Average is a Sum; `scale` multiplies the result on the way out
  // (as CopyScaled would in a pass of its own).
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                   double scale = 1.0);

  // In place over `count` words, like MPI_Allreduce with MPI_BAND. Needs
  // FitsBoard(count), which is the same on every rank for the same count.
  bool FitsBoard(int count) const { return count <= board_words_; }
  Status BitwiseAnd(uint64_t* words, int count);

  // Unmaps the segment now, without a word to the peers (the engine was
  // abandoned: engine_stop.cc). Nothing else may be called afterwards.
  void Unmap();

 private:
  struct Header;   // the segment's wake-up word, in shared memory
  struct Control;  // the per-rank counters, in shared memory
  struct BoardRow;  // a rank's negotiation vectors, in shared memory

  ShmCollectives(int rank, int size, void* base, size_t bytes, int64_t chunk_bytes, int64_t slots,
                 int board_words, const ShmSetup& setup);
  Header* header() const;
  Control* control(int rank) const;
  BoardRow* board_row(int rank) const;
  // Elements [lo, hi) of an `n`-element chunk are rank p's to sum.
  void PartOfChunk(int64_t n, int64_t elem, int p, int64_t* lo, int64_t* hi) const;
  // A ring position holds a chunk's input (the parts other ranks sum) and,
  // after it, the part this rank summed.
  uint8_t* slot(int rank, uint64_t seq) const;
  uint8_t* result_slot(int rank, uint64_t seq) const;
  // Whether every other rank has published inputs / results of chunk seq.
  bool AllPublished(uint64_t seq) const;
  bool AllReduced(uint64_t seq) const;
  // Whether every peer has read the chunk that last used seq's slot.
  bool SlotFree(uint64_t seq) const;
  // Tells sleeping peers that a counter moved.
  void Signal();
  // Spins, then sleeps on the futex until `ready()`; fails on abort/timeout.
  template <typename Ready>
  Status Wait(const char* what, Ready ready);
  // Shortens the spin while waits outlast it, lengthens it while they do not.
  void AdaptSpin(int64_t waited_ns);
  // One Allreduce call's chunks as they move through the three steps
  // (shm_collectives.cc).
  class AllreduceCall;

  int rank_;
  int size_;
  void* base_;
  size_t bytes_;
  int64_t chunk_bytes_;
  int64_t slots_;        // chunks in each rank's ring
  size_t region_bytes_;  // one rank's counters + its ring
  uint64_t seq_ = 0;     // chunks exchanged so far; equal on every rank
  int board_words_;      // words per board row
  uint64_t and_round_ = 0;  // bitwise ANDs so far; equal on every rank
  WaitPolicy wait_;
  int64_t spin_ns_;  // the current spin before sleeping, at most wait_.spin_us
  const AbortSignal* abort_;
  EngineStats* stats_;
  std::vector<const uint8_t*> sources_;  // scratch: every rank's slot for a chunk
  // This rank's summed part before it is streamed out, for sums that
  // ReduceSourcesStreaming does not make in one pass (other types and ops,
  // an output aligned apart from the result slot).
  std::vector<uint8_t> scratch_;
  SlotStoreChoice store_choice_;         // plain or streaming stores, slots and output
};

}  // namespace hvdlite
