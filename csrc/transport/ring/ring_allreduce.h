// One pipelined ring allreduce over MPI point-to-point messages: the work
// object behind RingTransport (ring_transport.h), also the middle phase of a
// hierarchical allreduce (hierarchical_allreduce.h).
//
// The buffer is cut into p segments; in p-1 reduce-scatter steps each rank
// passes one segment to its right neighbour and adds the one from its left,
// so each segment ends summed on one rank; in p-1 allgather steps the sums
// travel around. Each rank sends 2(p-1)/p of the buffer, the least any
// allreduce can. Every segment is cut further into chunks, and chunk k of a
// step leaves as soon as chunk k of the step before has arrived and been
// summed, with several chunks in flight: sending, receiving and summing
// overlap instead of taking turns. One rank finishes each segment's sum and
// the allgather copies it, so every rank gets the same bits.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "common/common.h"
#include "common/status.h"
#include "transport/abort_signal.h"
#include "transport/transport.h"
#include "transport/wire_options.h"

namespace hvdlite {

class RingAllreduceWork : public TransportWork {
 public:
  struct Setup {
    MPI_Comm comm;
    int rank, size, tag, window;
    int64_t chunk_elems;
    const WaitPolicy* wait;
    const AbortSignal* abort;
  };

  // Sums `count` elements at `data` in place over setup.comm, then scales
  // them by `scale`.
  RingAllreduceWork(const Setup& setup, void* data, int64_t count, DataType dtype, ReduceOp op,
                    double scale);
  ~RingAllreduceWork() override;

  Status Start() { return status_ = Step(); }
  // Moves every transfer that can move; `*done` once all have.
  Status Advance(bool* done);

  void Progress() override;
  Status Wait() override;

 private:
  // Transfers are numbered t = step * chunks + chunk over the 2(p-1) steps;
  // sends and receives each go out in that order, so MPI's non-overtaking
  // rule matches them with the neighbours' without per-transfer tags.
  bool finished() const { return processed_ == transfers_ && sent_done_ == transfers_; }
  int Mod(int64_t x) const { return static_cast<int>(((x % setup_.size) + setup_.size) % setup_.size); }
  bool Gathering(int64_t t) const { return t / chunks_ >= setup_.size - 1; }
  int Left() const { return Mod(setup_.rank - 1); }
  int Right() const { return Mod(setup_.rank + 1); }
  void Segment(int s, int64_t* begin, int64_t* end) const;
  void Range(int64_t t, bool sending, int64_t* lo, int64_t* n) const;

  Status Step();
  Status PostReceives();
  Status FinishReceives(bool* moved);
  Status PostSends(bool* moved);
  Status FinishSends(bool* moved);

  const Setup setup_;
  uint8_t* data_;
  int64_t count_;
  DataType dtype_;
  ReduceOp op_;
  double scale_;
  int64_t elem_;
  int64_t chunks_ = 1;     // per segment
  int64_t transfers_ = 0;  // each way
  std::vector<std::vector<uint8_t>> slots_;  // receive buffers, one per transfer in flight
  std::vector<MPI_Request> recvs_;           // by slot
  std::deque<MPI_Request> sends_;            // in transfer order
  int64_t posted_ = 0;      // receives posted
  int64_t processed_ = 0;   // receives summed or copied into place
  int64_t next_send_ = 0;   // sends posted
  int64_t sent_done_ = 0;   // sends completed (in order)
  Status status_;
};

}  // namespace hvdlite
