// Allreduce through shared memory, for a process set whose ranks all run on
// one host. MPI's intra-node allreduce moves every byte several times (into
// its shared cells, out into a temporary, reduced, and again for the
// allgather half); on a host whose cores also run training, those copies are
// CPU time taken from the backward pass. Here each rank copies a chunk of its
// input into its own slot once and every rank sums all slots, in rank order,
// straight into its output: the chunks stay in cache, and the result is
// bitwise identical on every rank.
//
// Slots live in one POSIX shared-memory segment that rank 0 of the set creates
// and unlinks as soon as everyone has mapped it, so nothing is left behind
// when a process dies. Ranks hand chunks over with two counters per rank
// (published / consumed), each on its own cache line, double-buffered so a
// rank fills chunk i+1 while slower peers still read chunk i.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../common.h"
#include "../engine_options.h"
#include "../status.h"

namespace hvdlite {

class ShmAllreduce {
 public:
  // Collective over `comm`. Returns nullptr (and MPI stays the wire) when any
  // rank does not `want` it (the set spans hosts, or the path is turned off),
  // there is one rank, or any rank could not map the segment; every rank gets
  // the same answer.
  static std::unique_ptr<ShmAllreduce> Create(MPI_Comm comm, bool want, const EngineOptions& options,
                                              const std::atomic<bool>* abort);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // Whether Allreduce handles this element type and op.
  static bool Supports(DataType dtype, ReduceOp op);
  // `send` may be MPI_IN_PLACE (then `recv` holds the input). Blocks until
  // this rank's result is complete; peers finish the same call at about the
  // same time. Average is a Sum; `scale` multiplies the result on the way out
  // (as CopyScaled would in a pass of its own).
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                   double scale = 1.0);

  int64_t chunk_bytes() const { return chunk_bytes_; }

 private:
  struct Control;  // the per-rank counters, in shared memory

  ShmAllreduce(int rank, int size, void* base, size_t bytes, int64_t chunk_bytes,
               const WaitPolicy& wait, const std::atomic<bool>* abort);
  Control* control(int rank) const;
  uint8_t* slot(int rank, uint64_t seq) const;

  int rank_;
  int size_;
  void* base_;
  size_t bytes_;
  int64_t chunk_bytes_;
  size_t region_bytes_;  // one rank's counters + two slots
  uint64_t seq_ = 0;     // chunks exchanged so far; equal on every rank
  WaitPolicy wait_;
  const std::atomic<bool>* abort_;
  std::vector<const uint8_t*> sources_;  // scratch: every rank's slot for a chunk
};

}  // namespace hvdlite
