// The wire of a process set whose ranks all run on one host: allreduce and
// negotiation's bitwise AND through shared memory (collectives/
// shm_collectives.h explains why), everything else through MPI on the same
// communicator.
#pragma once

#include <memory>

#include "engine/engine_stats.h"
#include "transport/forwarding_transport.h"
#include "transport/mpi/mpi_transport.h"
#include "transport/shm/shm_collectives.h"

namespace hvdlite {

class ShmTransport : public ForwardingTransport {
 public:
  // Collective over `mpi`'s communicator: returns `mpi` itself when any rank
  // does not `want` shared memory or cannot set it up
  // (ShmCollectives::Create), so every rank picks the same wire.
  static std::unique_ptr<Transport> Create(std::unique_ptr<MpiTransport> mpi, bool want, const ShmSetup& setup);

  const char* Activity(OpType op, DataType dtype, ReduceOp reduce) const override;
  Status StartAllreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                        double scale, std::unique_ptr<TransportWork>* work) override;
  Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) override;
  Status BitwiseAnd(uint64_t* words, int count) override;
  void Abandon() override;

 private:
  ShmTransport(std::unique_ptr<MpiTransport> mpi, std::unique_ptr<ShmCollectives> shm, EngineStats* stats)
      : ForwardingTransport(std::move(mpi)), shm_(std::move(shm)), stats_(stats) {}

  std::unique_ptr<ShmCollectives> shm_;
  EngineStats* stats_;
};

}  // namespace hvdlite
