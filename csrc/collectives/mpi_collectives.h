// The wire: every MPI call the engine makes, on one communicator, issued as
// nonblocking operations and completed by Wait() under the engine's
// WaitPolicy (collectives/waiter.h).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "../common.h"
#include "../engine_options.h"
#include "../status.h"

namespace hvdlite {

class MpiCollectives {
 public:
  MpiCollectives(MPI_Comm comm, const WaitPolicy& wait, const std::atomic<bool>* abort);

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }

  // In place. `op` is Sum, Min, Max or Product (Average is Sum + a scale).
  // Counts beyond INT_MAX are split into several calls.
  Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op);
  Status Broadcast(void* data, int64_t bytes, int root);
  // Ranks contribute byte blocks of different sizes, concatenated in rank order.
  Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                    const std::vector<int64_t>& bytes_per_rank);
  Status Alltoallv(const void* input, const std::vector<int64_t>& send_bytes, void* output,
                   const std::vector<int64_t>& recv_bytes);
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op);
  // With a custom wire type and sum (compressed reductions).
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                       MPI_Datatype type, MPI_Op op);
  Status Barrier();
  // Sends `send_bytes` to `peer` while receiving `recv_bytes` from it, both
  // nonblocking and completed together (either may be 0). Point-to-point, so
  // it never matches a collective on the same communicator.
  Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes, int peer,
                  int tag);

  // Nonblocking starts for pipelined, fused reductions (count <= INT_MAX);
  // complete them with WaitRequest and nudge them along with Progress.
  Status StartAllreduce(const void* send, void* recv, int64_t count, MPI_Datatype type, MPI_Op op,
                        MPI_Request* request);
  Status StartAllgather(const void* send, int64_t bytes, void* recv, MPI_Request* request);
  Status WaitRequest(MPI_Request* request, const char* what) { return Wait(request, what); }
  // One MPI_Test: MPI moves nonblocking collectives forward only inside MPI
  // calls, so long copies call this between chunks.
  void Progress(MPI_Request* request);

  // Negotiation helpers.
  Status BitwiseAnd(uint64_t* words, int count);
  Status GatherBytes(const std::vector<uint8_t>& mine, int root,
                     std::vector<std::vector<uint8_t>>* all);
  Status BroadcastBytes(std::vector<uint8_t>* bytes, int root);

 private:
  Status Wait(MPI_Request* request, const char* what);
  Status WaitAll(std::vector<MPI_Request>* requests, const char* what);
  Status Check(int rc, const char* what);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  WaitPolicy wait_;
  const std::atomic<bool>* abort_;
};

MPI_Datatype MpiReductionType(DataType dtype);
MPI_Op MpiReduceOp(ReduceOp op);

}  // namespace hvdlite
