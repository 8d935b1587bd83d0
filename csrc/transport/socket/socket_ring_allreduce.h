// One pipelined ring allreduce over the ring's own sockets (socket_link.h):
// RingSchedule's transfers (ring_schedule.h), each written to the right
// neighbour's stream and read from the left one's, with up to `window`
// chunks read ahead of the sums. Between two moves the engine thread sleeps
// in poll(2) while the kernel moves the bytes.
#pragma once

#include <cstdint>
#include <memory>

#include "common/common.h"
#include "common/status.h"
#include "transport/abort_signal.h"
#include "transport/in_place_reduction.h"
#include "transport/ring/ring_schedule.h"
#include "transport/socket/socket_link.h"
#include "transport/transport.h"
#include "transport/wire_options.h"

namespace hvdlite {

class SocketRingAllreduceWork : public TransportWork {
 public:
  struct Setup {
    std::shared_ptr<SocketRingLink> link;
    int window;
    int64_t chunk_elems;
    const WaitPolicy* wait;
    const AbortSignal* abort;
  };

  // Sums `count` elements at `data` in place around the ring, then scales
  // them by `scale`.
  SocketRingAllreduceWork(const Setup& setup, void* data, int64_t count, DataType dtype, ReduceOp op,
                          double scale);
  ~SocketRingAllreduceWork() override;

  // Takes its place in the link's line and moves what it can.
  Status Start();
  void Progress() override;
  Status Wait() override;

  // For the link, once this work is first in line: moves every byte that
  // can move without blocking; true once finished or failed.
  bool Step();
  bool WantsSend() const;
  bool WantsReceive() const;

 private:
  bool finished() const { return processed_ == transfers_ && sent_ == transfers_; }
  int64_t Bytes(int64_t t, bool sending, int64_t* lo) const;
  bool Fail(const Status& why);
  Status Receive(bool* moved);
  void Process(bool* moved);
  Status Send(bool* moved);

  const Setup setup_;
  const InPlaceReduction buffer_;
  RingSchedule schedule_;
  int64_t transfers_;
  bool in_line_ = false;
  int64_t slot_bytes_;         // one chunk read ahead, `window` of them
  uint8_t* slots_ = nullptr;   // the link's, while this work is first in line
  int64_t received_ = 0;       // receives complete in their slots
  int64_t received_bytes_ = 0; // of receive `received_`
  int64_t processed_ = 0;      // receives summed or copied into place
  int64_t sent_ = 0;           // sends complete
  int64_t sent_bytes_ = 0;     // of send `sent_`
  Status status_;
};

}  // namespace hvdlite
