// The wire between hosts: a bandwidth-optimal allreduce over MPI
// point-to-point messages, as NCCL, Gloo's allreduce_ring_chunked and
// Horovod's hierarchical paths do it, where MPI's own collective sends each
// byte more often or leaves the link idle while it sums. The pipelined ring
// itself is RingAllreduceWork (ring_allreduce.h).
//
// Where several ranks share each host, the host's ranks first reduce-scatter
// among themselves and the ring joins one rank per host
// (HierarchicalAllreduceWork, hierarchical_allreduce.h).
//
// Large allreduces (at least RingOptions::threshold_bytes) of element-wise
// reductions take the ring; everything else goes to the inner transport.
// With one rank per host the ring's chunks may travel on its own sockets
// instead of MPI (RingOptions::wire, socket/socket_link.h).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "engine/engine_stats.h"
#include "transport/abort_signal.h"
#include "transport/forwarding_transport.h"
#include "transport/ring/hierarchical_allgather.h"
#include "transport/ring/hierarchical_allreduce.h"
#include "transport/ring/hierarchical_reducescatter.h"
#include "transport/socket/socket_link.h"
#include "transport/wire_options.h"

namespace hvdlite {

// What the ring wire is set up with.
struct RingSetup {
  RingOptions options;
  HierarchicalOptions hierarchical;
  WaitPolicy wait;
  EngineStats* stats = nullptr;
  const AbortSignal* abort = nullptr;
};

class RingTransport : public ForwardingTransport {
 public:
  // Collective over `comm` (the set's communicator, which `inner` uses):
  // returns `inner` itself unless every rank wants the ring; otherwise the
  // ring gets a duplicate of `comm` so its messages never match anyone else's.
  // `hosts`: the host of each rank of `comm`. With several ranks on each of
  // several hosts (the same number on each) the allreduce is hierarchical.
  static std::unique_ptr<Transport> Create(std::unique_ptr<Transport> inner, MPI_Comm comm,
                                           const std::vector<int>& hosts, bool want, const RingSetup& setup);
  ~RingTransport() override;

  const char* Activity(OpType op, DataType dtype, ReduceOp reduce) const override;
  Status StartAllreduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                        double scale, std::unique_ptr<TransportWork>* work) override;
  Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) override;
  // Hierarchical layouts: large allgathers and reducescatters in two levels
  // (hierarchical_allgather.h, hierarchical_reducescatter.h).
  Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                    const std::vector<int64_t>& bytes_per_rank) override;
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts, DataType dtype,
                       ReduceOp op) override;
  bool GetWireSettings(WireSettings* out) const override;
  void Tune(const WireSettings& settings) override;
  bool GetHostLevels(HostLevels* out) override;
  void Abandon() override;

 private:
  RingTransport(std::unique_ptr<Transport> inner, MPI_Comm ring, MPI_Comm local, MPI_Comm local_gather,
                const RingSetup& setup);
  bool Takes(int64_t count, DataType dtype, ReduceOp op) const;
  // Hierarchical: the two levels as transports of their own, on duplicates
  // of local_ and ring_ (collective over the set, like Create); false if MPI
  // refused a duplicate.
  bool CreateHostLevels(const RingSetup& setup, const std::vector<int>& hosts);

  MPI_Comm ring_;   // the ranks around the ring (hierarchical: one per host)
  MPI_Comm local_;  // hierarchical: this host's ranks; else MPI_COMM_NULL
  MPI_Comm local_gather_;  // hierarchical: the same ranks, for the allgathers
  int ring_rank_ = 0, ring_size_ = 1;
  int64_t threshold_bytes_;
  int64_t chunk_bytes_;
  int64_t piece_bytes_;
  HostPhaseTurns turns_;         // hierarchical works in flight take turns on local_, local_gather_
  bool hierarchical_on_ = true;  // with local_: off sends large allreduces to MPI (autotune)
  int window_;
  WaitPolicy wait_;
  const AbortSignal* abort_;
  EngineStats* stats_;
  bool abandoned_ = false;  // Abandon(): the communicators are left to MPI_Finalize
  int next_tag_ = 0;  // one tag per collective: several may be in flight
  std::shared_ptr<SocketRingLink> socket_;  // the flat ring on its own sockets; else null
  // Hierarchical: GetHostLevels' transports and their communicators.
  MPI_Comm host_comm_ = MPI_COMM_NULL, across_comm_ = MPI_COMM_NULL;
  std::unique_ptr<Transport> host_, across_;
  HostGrid grid_;                        // where each rank of the set sits
  bool hierarchical_allgather_ = false;  // every rank wants it (HIERARCHICAL_ALLGATHER)
  std::vector<uint8_t> gather_scratch_;  // two-level allgathers and reducescatters
};

}  // namespace hvdlite
