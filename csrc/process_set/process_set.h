// A group of ranks with its own communicator, tensor queue and negotiation.
// Set 0 is every rank of the engine's communicator; others are added and
// removed collectively (negotiated on set 0), so ids agree on every rank.
#pragma once

#include <mpi.h>

#include <array>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/abort_signal.h"
#include "transport/ring/ring_transport.h"
#include "transport/shm/shm_transport.h"
#include "negotiation/controller.h"
#include "engine/tensor_queue.h"

namespace hvdlite {

// The counter in a name ProcessSet::NextAutoName made ("allreduce.noname.3":
// 3); -1 for any other name.
int64_t AutoNameCounter(OpType op, const std::string& name);

class ProcessSet {
 public:
  // `comm` is MPI_COMM_NULL on ranks that are not members; it is owned here.
  // Collective over `comm` (members set up the shared-memory path together).
  // `hosts`: the host of each member, in `ranks` order (Topology::HostsOf).
  ProcessSet(int32_t id, std::vector<int32_t> ranks, MPI_Comm comm, const std::vector<int>& hosts,
             const EngineOptions& options, EngineStats* stats, const AbortSignal* abort);
  ~ProcessSet();
  ProcessSet(const ProcessSet&) = delete;
  ProcessSet& operator=(const ProcessSet&) = delete;

  int32_t id() const { return id_; }
  bool is_member() const { return comm_ != MPI_COMM_NULL; }
  const std::vector<int32_t>& ranks() const { return ranks_; }  // engine ranks, ascending
  int rank() const { return transport_ ? transport_->rank() : -1; }
  int size() const { return static_cast<int>(ranks_.size()); }

  // The set's wire (members only).
  Transport& transport() { return *transport_; }
  Controller& controller() { return *controller_; }
  TensorQueue& queue() { return queue_; }

  // Name for an unnamed tensor; the same on every rank that makes the same
  // sequence of calls.
  std::string NextAutoName(OpType op);
  // A joined rank took part in `name` without submitting it: if it is an
  // automatic name, this rank's counter moves past it, so the ranks' next
  // unnamed calls still match after the others' calls while it was joined.
  void SkipAutoName(OpType op, const std::string& name);

  // The engine was abandoned and its thread has stopped (engine_stop.cc):
  // the wire releases what is local (Transport::Abandon), and from here on,
  // the destructor included, nothing calls MPI: the communicator is left to
  // MPI_Finalize, as freeing it may wait for a lost peer.
  void Abandon();

 private:
  int32_t id_;
  std::vector<int32_t> ranks_;
  MPI_Comm comm_;
  bool abandoned_ = false;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Controller> controller_;
  TensorQueue queue_;
  std::mutex names_mutex_;
  std::array<int64_t, kNumOpTypes> auto_name_counters_{};  // one sequence per OpType
};

// The engine's process sets, shared between the engine thread (which adds and
// removes them) and user threads (which enqueue into them).
class ProcessSetTable {
 public:
  void Add(std::shared_ptr<ProcessSet> set);
  std::shared_ptr<ProcessSet> Get(int32_t id);
  std::shared_ptr<ProcessSet> Remove(int32_t id);
  std::vector<std::shared_ptr<ProcessSet>> All();
  std::vector<int32_t> Ids();
  int32_t NextId();

 private:
  std::mutex mutex_;
  std::vector<std::shared_ptr<ProcessSet>> sets_;
};

}  // namespace hvdlite
