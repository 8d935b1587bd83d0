// The ring's own TCP connections between hosts: one to the right neighbour,
// one from the left, set up over MPI once per process set and then used
// without it, as Gloo's pairs are.
//
// Why a wire of its own: MPI (MPICH over UCX's TCP) moves a message only
// while a rank tests it, so the engine thread must keep polling for the
// whole transfer, and on hosts where training has every core that polling
// is CPU taken from training (650 ms per rank and step at 4 hosts x 1 rank,
// 1 Gbit/s, against Gloo's 120). The kernel moves a socket's bytes while the
// thread sleeps in poll(2), so this wire waits without burning a core.
//
// The streams carry the transfers of one collective after another, in the
// order the collectives start (every rank starts them in the same order):
// a work runs on the wire only once the works before it have finished
// (SocketRingAllreduceWork, socket_ring_allreduce.h).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace hvdlite {

class SocketRingAllreduceWork;

// The error of a neighbour lost on the streams: `side` is "left" or "right".
Status NeighbourLost(const char* side, int neighbour, const std::string& how);

struct SocketLinkOptions {
  double timeout_seconds = 0.0;  // bounds the setup; 0: 60 s
  // The interfaces whose IPv4 addresses are offered, in this order; empty:
  // every interface that is up but loopback (RingOptions::socket_interfaces).
  std::vector<std::string> interfaces;
};

class SocketRingLink {
 public:
  // Collective over `comm`, whose ranks are the ring in order. Where every
  // rank shares this process's network (one machine, one network
  // namespace) the sockets listen on loopback only; otherwise on every
  // address, and a neighbour proves itself with a token that rank 0 sent
  // over MPI. Every rank gets the same outcome: a link, or the first rank's
  // error.
  static Status Connect(MPI_Comm comm, const SocketLinkOptions& options, std::unique_ptr<SocketRingLink>* out);
  ~SocketRingLink();
  SocketRingLink(const SocketRingLink&) = delete;
  SocketRingLink& operator=(const SocketRingLink&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int to_right() const { return right_fd_; }
  int from_left() const { return left_fd_; }

  // The works using the streams, in start order.
  void Join(SocketRingAllreduceWork* work) { queue_.push_back(work); }
  // A work leaving before it finished (an error, an abort) leaves the
  // streams mid-transfer: every later work fails with `why`.
  void Leave(SocketRingAllreduceWork* work, const Status& why);
  // Moves every work that can move, the first in line first.
  void Advance();
  // Sleeps until the first work in line can move bytes, or `timeout_ms`.
  void Poll(int timeout_ms);
  // Closes both connections: the neighbours' next read or write fails.
  void Close();
  // The chunks the first work in line reads ahead of its sums: one set for
  // the link, since the streams serve one work at a time.
  uint8_t* ReadAhead(size_t bytes) {
    if (read_ahead_.size() < bytes) read_ahead_.resize(bytes);
    return read_ahead_.data();
  }

  // Whether a neighbour has closed its end (or the connection failed):
  // the error a work on the streams would meet, or OK. Between collectives,
  // where the engine waits in negotiation on MPI, this is how it hears of a
  // neighbour whose engine stopped (RingTransport::Create).
  Status ClosedNeighbour() const;

  // Set once the streams are unusable; every work fails with it.
  const Status& broken() const { return broken_; }
  void Break(const Status& why);

 private:
  SocketRingLink(int rank, int size, int right_fd, int left_fd)
      : rank_(rank), size_(size), right_fd_(right_fd), left_fd_(left_fd) {}

  int rank_, size_;
  int right_fd_, left_fd_;
  std::deque<SocketRingAllreduceWork*> queue_;
  std::vector<uint8_t> read_ahead_;  // grown to the largest window of chunks seen
  Status broken_;
};

}  // namespace hvdlite
