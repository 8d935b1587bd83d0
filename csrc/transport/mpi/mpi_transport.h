// The MPI wire: every collective on one communicator, issued as a
// nonblocking MPI call and completed under the engine's WaitPolicy
// (transport/waiter.h), so an abort or HVDLITE_TIMEOUT_SECONDS stops any
// wait. 16-bit floats are reduced by MPI user ops over the kernels of
// reduce_kernels.h (MPI has no half types).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "transport/abort_signal.h"
#include "transport/transport.h"
#include "transport/wire_options.h"

namespace hvdlite {

class MpiTransport : public Transport {
 public:
  // `negotiation_wait`: the policy of the negotiation exchanges
  // (BitwiseAnd, GatherBytes, BroadcastBytes); every other wait follows `wait`.
  MpiTransport(MPI_Comm comm, const WaitPolicy& wait, const AbortSignal* abort)
      : MpiTransport(comm, wait, wait, abort) {}
  MpiTransport(MPI_Comm comm, const WaitPolicy& wait, const WaitPolicy& negotiation_wait,
               const AbortSignal* abort);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

  bool Supports(DataType dtype, ReduceOp op) const override;
  const char* Activity(OpType op, DataType dtype, ReduceOp reduce) const override;
  Status StartAllreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                        double scale, std::unique_ptr<TransportWork>* work) override;
  Status StartAllgather(const void* send, int64_t bytes, void* recv,
                        std::unique_ptr<TransportWork>* work) override;
  Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) override;
  Status Broadcast(void* data, int64_t bytes, int root) override;
  Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                    const std::vector<int64_t>& bytes_per_rank) override;
  Status Alltoallv(const void* input, const std::vector<int64_t>& send_bytes, void* output,
                   const std::vector<int64_t>& recv_bytes) override;
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op) override;
  Status Barrier() override;
  Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes, int peer,
                  int tag) override;
  Status BitwiseAnd(uint64_t* words, int count) override;
  Status GatherBytes(const std::vector<uint8_t>& mine, int root,
                     std::vector<std::vector<uint8_t>>* all) override;
  Status BroadcastBytes(std::vector<uint8_t>* bytes, int root) override;
  void WatchDuringNegotiation(std::function<Status()> peer_lost) override { peer_lost_ = std::move(peer_lost); }

  // Completes a nonblocking call under the wait policy.
  Status Wait(MPI_Request* request, const char* what) { return WaitUnder(wait_, request, what); }

 private:
  Status WaitUnder(const WaitPolicy& policy, MPI_Request* request, const char* what);
  Status WaitAll(std::vector<MPI_Request>* requests, const char* what);
  Status BroadcastUnder(const WaitPolicy& policy, void* data, int64_t bytes, int root);
  // Negotiation's waits (mpi_negotiation.cc): under negotiation_wait_, but
  // napping from the spin's end after a wait that outlasted its yielding
  // (the peers are behind: the next round waits for them too), until one
  // ends within two naps. Inside one host that yielding is
  // HVDLITE_WAIT_YIELD_US (1 s), after which the waits nap anyway.
  Status WaitNegotiation(MPI_Request* request, const char* what);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  WaitPolicy wait_;
  WaitPolicy negotiation_wait_;
  bool negotiation_peers_behind_ = false;  // since a negotiation wait outlasted its yielding
  std::function<Status()> peer_lost_;     // WatchDuringNegotiation; may be empty
  const AbortSignal* abort_;
  // Negotiation's exchanges (mpi_negotiation.cc): an abort leaves their
  // requests pending, so their buffers live as long as the transport, which
  // an abandoned engine keeps.
  struct NegotiationBuffers {
    std::vector<uint64_t> words;   // BitwiseAnd
    std::vector<uint8_t> mine;     // GatherBytes: this rank's part
    std::vector<int> sizes;        // GatherBytes: every rank's part size (root)
    std::vector<uint8_t> joined;   // GatherBytes: every rank's part (root)
    uint64_t count = 0;            // BroadcastBytes: the bytes to come
    std::vector<uint8_t> bytes;    // BroadcastBytes
  } negotiation_;
};

// OK for MPI_SUCCESS, else an MPI error naming `what` and MPI's message.
Status MpiCheck(int rc, const char* what);

// The MPI element type and op that reduce `dtype` with `op` (Average: Sum);
// for 16-bit floats a 16-bit type and a user op, created on first use.
// Returns false when there is none (bool, Adasum, MPI not initialised).
bool MpiReduction(DataType dtype, ReduceOp op, MPI_Datatype* type, MPI_Op* mpi_op);

}  // namespace hvdlite
