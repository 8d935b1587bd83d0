// MpiTransport's three exchanges of negotiation (Controller): the bitwise
// AND of the cache bits, the coordinator's gather of requests and its
// broadcast of responses. Every round runs them, also the round in which a
// peer is lost and the engine is abandoned, which leaves their requests
// pending: so they work in buffers of the transport (NegotiationBuffers),
// never in a frame or a caller's temporary that is freed at once. Their
// waits follow the negotiation's policy (WaitPolicy::ForNegotiation) and
// watch for a lost peer where the wire can see one (WatchDuringNegotiation).
#include <algorithm>
#include <chrono>

#include "transport/mpi/mpi_transport.h"
#include "transport/waiter.h"

namespace hvdlite {

namespace {

// How often a wait asks WatchDuringNegotiation's check, and how long after
// the check first reports a lost peer the exchange may still complete: a
// peer that closed in order (shutdown) had finished the round, so this
// rank's part completes as soon as MPI gets to progress it.
constexpr auto kPeerCheckEvery = std::chrono::milliseconds(10);
constexpr auto kPeerLostGrace = std::chrono::seconds(2);

}  // namespace

Status MpiTransport::WaitNegotiation(MPI_Request* request, const char* what) {
  using std::chrono::microseconds;
  using Clock = std::chrono::steady_clock;
  WaitPolicy policy = negotiation_wait_;
  if (negotiation_peers_behind_) policy.yield_us = 0;
  const auto start = Clock::now();
  auto next_check = start + kPeerCheckEvery;
  Status lost;
  Clock::time_point lost_at;
  Status s = WaitUntil(policy, abort_, what, [&](Status* error) {
    int done = 0;
    *error = MpiCheck(MPI_Test(request, &done, MPI_STATUS_IGNORE), what);
    if (!error->ok() || done != 0) return true;
    if (!peer_lost_) return false;
    const auto now = Clock::now();
    if (now < next_check) return false;
    next_check = now + kPeerCheckEvery;
    if (lost.ok()) {
      lost = peer_lost_();
      lost_at = now;
      return false;
    }
    if (now - lost_at < kPeerLostGrace) return false;
    *error = Status::Error(lost.kind(), lost.message() + " (seen in " + what + ")");
    return true;
  });
  const auto waited = Clock::now() - start;
  // Behind: a wait that outlasted its yielding. Caught up: one that ended
  // within two naps (the peers were there; the round's own latency).
  if (waited > microseconds(policy.spin_us + negotiation_wait_.yield_us)) {
    negotiation_peers_behind_ = true;
  } else if (waited <= microseconds(policy.spin_us + 2 * policy.sleep_us)) {
    negotiation_peers_behind_ = false;
  }
  return s;
}

Status MpiTransport::BitwiseAnd(uint64_t* words, int count) {
  std::vector<uint64_t>& mine = negotiation_.words;
  mine.assign(words, words + count);
  MPI_Request req;
  Status s = MpiCheck(MPI_Iallreduce(MPI_IN_PLACE, mine.data(), count, MPI_UINT64_T, MPI_BAND, comm_, &req),
                   "MPI_Iallreduce(negotiation)");
  if (s.ok()) s = WaitNegotiation(&req, "MPI_Iallreduce(negotiation)");
  if (s.ok()) std::copy(mine.begin(), mine.end(), words);
  return s;
}

Status MpiTransport::GatherBytes(const std::vector<uint8_t>& mine, int root,
                                   std::vector<std::vector<uint8_t>>* all) {
  NegotiationBuffers& b = negotiation_;
  b.mine = mine;
  b.sizes.assign(static_cast<size_t>(size_) + 1, 0);  // [size_]: this rank's, sent
  b.sizes[static_cast<size_t>(size_)] = static_cast<int>(mine.size());
  MPI_Request req;
  Status s = MpiCheck(MPI_Igather(&b.sizes[static_cast<size_t>(size_)], 1, MPI_INT, b.sizes.data(), 1, MPI_INT,
                               root, comm_, &req),
                   "MPI_Igather(negotiation)");
  if (s.ok()) s = WaitNegotiation(&req, "MPI_Igather(negotiation)");
  if (!s.ok()) return s;
  std::vector<int> displs(rank_ == root ? size_ : 0);
  int total = 0;
  for (size_t i = 0; i < displs.size(); ++i) {
    displs[i] = total;
    total += b.sizes[i];
  }
  b.joined.resize(static_cast<size_t>(total));
  s = MpiCheck(MPI_Igatherv(b.mine.data(), static_cast<int>(b.mine.size()), MPI_BYTE, b.joined.data(),
                         b.sizes.data(), displs.data(), MPI_BYTE, root, comm_, &req),
            "MPI_Igatherv(negotiation)");
  if (s.ok()) s = WaitNegotiation(&req, "MPI_Igatherv(negotiation)");
  if (!s.ok() || rank_ != root) return s;
  all->assign(size_, {});
  for (int i = 0; i < size_; ++i) {
    (*all)[i].assign(b.joined.begin() + displs[i], b.joined.begin() + displs[i] + b.sizes[i]);
  }
  return s;
}

Status MpiTransport::BroadcastBytes(std::vector<uint8_t>* bytes, int root) {
  NegotiationBuffers& b = negotiation_;
  b.count = bytes->size();
  MPI_Request req;
  Status s = MpiCheck(MPI_Ibcast(&b.count, 1, MPI_UINT64_T, root, comm_, &req), "MPI_Ibcast(negotiation)");
  if (s.ok()) s = WaitNegotiation(&req, "MPI_Ibcast(negotiation)");
  if (!s.ok()) return s;
  if (rank_ == root) {
    b.bytes = *bytes;
  } else {
    b.bytes.resize(b.count);
  }
  s = BroadcastUnder(negotiation_wait_, b.bytes.data(), static_cast<int64_t>(b.count), root);
  if (s.ok() && rank_ != root) bytes->swap(b.bytes);
  return s;
}

}  // namespace hvdlite
