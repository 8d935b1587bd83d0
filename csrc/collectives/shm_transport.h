// The wire of a process set whose ranks all run on one host: allreduce and
// negotiation's bitwise AND through shared memory (collectives/
// shm_collectives.h explains why), everything else through MPI on the same
// communicator.
#pragma once

#include <memory>

#include "../engine_stats.h"
#include "mpi_transport.h"
#include "shm_collectives.h"

namespace hvdlite {

class ShmTransport : public Transport {
 public:
  // Collective over `mpi`'s communicator: returns `mpi` itself when any rank
  // does not `want` shared memory or cannot set it up
  // (ShmCollectives::Create), so every rank picks the same wire.
  static std::unique_ptr<Transport> Create(std::unique_ptr<MpiTransport> mpi, bool want,
                                           const EngineOptions& options, EngineStats* stats,
                                           const std::atomic<bool>* abort);

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  bool Supports(DataType dtype, ReduceOp op) const override { return mpi_->Supports(dtype, op); }
  const char* Activity(OpType op, DataType dtype, ReduceOp reduce) const override;
  Status StartAllreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                        double scale, std::unique_ptr<TransportWork>* work) override;
  Status StartAllgather(const void* send, int64_t bytes, void* recv,
                        std::unique_ptr<TransportWork>* work) override {
    return mpi_->StartAllgather(send, bytes, recv, work);
  }
  Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) override;
  Status Broadcast(void* data, int64_t bytes, int root) override {
    return mpi_->Broadcast(data, bytes, root);
  }
  Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                    const std::vector<int64_t>& bytes_per_rank) override {
    return mpi_->Allgatherv(input, input_bytes, output, bytes_per_rank);
  }
  Status Alltoallv(const void* input, const std::vector<int64_t>& send_bytes, void* output,
                   const std::vector<int64_t>& recv_bytes) override {
    return mpi_->Alltoallv(input, send_bytes, output, recv_bytes);
  }
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op) override {
    return mpi_->ReduceScatter(input, output, counts, dtype, op);
  }
  Status Barrier() override { return mpi_->Barrier(); }
  Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes, int peer,
                  int tag) override {
    return mpi_->SendRecv(send, send_bytes, recv, recv_bytes, peer, tag);
  }
  Status BitwiseAnd(uint64_t* words, int count) override;
  Status GatherBytes(const std::vector<uint8_t>& mine, int root,
                     std::vector<std::vector<uint8_t>>* all) override {
    return mpi_->GatherBytes(mine, root, all);
  }
  Status BroadcastBytes(std::vector<uint8_t>* bytes, int root) override {
    return mpi_->BroadcastBytes(bytes, root);
  }

 private:
  ShmTransport(std::unique_ptr<MpiTransport> mpi, std::unique_ptr<ShmCollectives> shm, EngineStats* stats)
      : mpi_(std::move(mpi)), shm_(std::move(shm)), stats_(stats) {}

  std::unique_ptr<MpiTransport> mpi_;
  std::unique_ptr<ShmCollectives> shm_;
  EngineStats* stats_;
};

}  // namespace hvdlite
