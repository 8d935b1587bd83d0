// One pipelined ring allreduce over MPI point-to-point messages: the work
// object behind RingTransport (ring_transport.h), also the middle phase of a
// hierarchical allreduce (hierarchical_allreduce.h).
//
// The schedule (which chunk each step passes on) is RingSchedule
// (ring_schedule.h). Each rank sends 2(p-1)/p of the buffer, the least any
// allreduce can. Chunk k of a step leaves as soon as chunk k of the step
// before has arrived and been summed, with several chunks in flight:
// sending, receiving and summing overlap instead of taking turns. One rank
// finishes each segment's sum and the allgather copies it, so every rank
// gets the same bits.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "common/common.h"
#include "common/status.h"
#include "transport/abort_signal.h"
#include "transport/in_place_reduction.h"
#include "transport/ring/ring_schedule.h"
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
  // Sends and receives each go out in transfer order, so MPI's
  // non-overtaking rule matches them with the neighbours' without
  // per-transfer tags.
  bool finished() const { return processed_ == transfers_ && sent_done_ == transfers_; }

  Status Step();
  Status PostReceives();
  Status FinishReceives(bool* moved);
  Status PostSends(bool* moved);
  Status FinishSends(bool* moved);

  const Setup setup_;
  const InPlaceReduction buffer_;
  RingSchedule schedule_;
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
