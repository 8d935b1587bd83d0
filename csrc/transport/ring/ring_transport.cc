#include "transport/ring/ring_transport.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "kernels/reduce_kernels.h"
#include "negotiation/rank_agreement.h"
#include "transport/ring/hierarchical_allreduce.h"
#include "transport/mpi/mpi_transport.h"
#include "transport/ring/ring_allreduce.h"
#include "transport/socket/socket_ring_allreduce.h"

namespace hvdlite {

namespace {

// Tags of ring messages cycle below this (MPI guarantees tags up to 32767).
constexpr int kTagCycle = 32768;
// Pieces of a hierarchical allreduce reduced inside the host ahead of the ring.
constexpr int kHierarchicalDepth = 2;

}  // namespace

std::unique_ptr<Transport> RingTransport::Create(std::unique_ptr<Transport> inner, MPI_Comm comm,
                                                 const std::vector<int>& hosts, bool want, const RingSetup& setup) {
  // Every rank must pick the same wire, whatever its environment says: each
  // wish holds only where every rank has it.
  std::vector<int> wishes = {want && inner->size() > 1, setup.hierarchical.allreduce != Choice::kOff,
                             setup.options.allreduce == Choice::kOn, setup.hierarchical.allgather != Choice::kOff,
                             setup.options.wire == RingWire::kSocket};
  if (!AllAgree(comm, &wishes, "the wire's wishes").ok() || !wishes[0]) return inner;
  std::map<int, int> ranks_per_host;
  for (int h : hosts) ++ranks_per_host[h];
  const int per_host = ranks_per_host.begin()->second;
  const bool even = std::all_of(ranks_per_host.begin(), ranks_per_host.end(),
                                [per_host](const auto& kv) { return kv.second == per_host; });
  const bool hierarchical = wishes[1] && ranks_per_host.size() > 1 && per_host > 1 && even;
  // One ring through several ranks per host crosses each host's link more
  // than once: slower than MPI there (2 hosts x 2 ranks: 1.19x), so unless
  // forced the ring runs only with one rank per host or hierarchically.
  if (!wishes[2] && per_host > 1 && !hierarchical) return inner;
  const int me = inner->rank();
  MPI_Comm local = MPI_COMM_NULL, local_gather = MPI_COMM_NULL, ring = MPI_COMM_NULL;
  int ok;
  if (hierarchical) {
    // The host's ranks (twice, see HierarchicalAllreduceWork::Setup), and the
    // ranks holding the same block on every host (ordered by host, so the
    // ring visits hosts in a fixed order).
    ok = MPI_Comm_split(comm, hosts[static_cast<size_t>(me)], me, &local) == MPI_SUCCESS &&
         MPI_Comm_dup(local, &local_gather) == MPI_SUCCESS;
    int local_rank = 0;
    if (ok) MPI_Comm_rank(local, &local_rank);
    ok = ok && MPI_Comm_split(comm, local_rank, hosts[static_cast<size_t>(me)], &ring) == MPI_SUCCESS;
  } else {
    ok = MPI_Comm_dup(comm, &ring) == MPI_SUCCESS;
  }
  if (!ok) {  // MPI errors here are fatal to the communicator anyway
    for (MPI_Comm* c : {&local, &local_gather}) {
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
    return inner;
  }
  for (MPI_Comm c : {local, local_gather, ring}) {
    if (c != MPI_COMM_NULL) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  }
  std::unique_ptr<RingTransport> wire(
      new RingTransport(std::move(inner), ring, local, local_gather, setup));
  // Without the levels (MPI refused a duplicate: fatal to the job soon
  // anyway) compression just applies to every rank's whole buffer.
  if (hierarchical && wire->CreateHostLevels(setup, hosts)) wire->hierarchical_allgather_ = wishes[3] != 0;
  if (!hierarchical && wishes[4]) {
    std::unique_ptr<SocketRingLink> link;
    SocketLinkOptions link_options;
    link_options.timeout_seconds = setup.wait.timeout_seconds;
    link_options.interfaces = setup.options.socket_interfaces;
    Status s = SocketRingLink::Connect(ring, link_options, &link);
    if (s.ok()) {
      wire->socket_ = std::move(link);
      // Between collectives the engine waits in negotiation, on MPI, which
      // does not see a neighbour's engine stop: its closed socket does.
      std::shared_ptr<SocketRingLink> watched = wire->socket_;
      wire->inner().WatchDuringNegotiation([watched] { return watched->ClosedNeighbour(); });
    } else if (me == 0) {  // the same outcome on every rank: MPI carries the ring
      std::fprintf(stderr, "hvdlite: HVDLITE_RING_WIRE=socket: %s; the ring runs over MPI instead\n",
                   s.message().c_str());
    }
  }
  return wire;
}

bool RingTransport::CreateHostLevels(const RingSetup& setup, const std::vector<int>& hosts) {
  if (MPI_Comm_dup(local_, &host_comm_) != MPI_SUCCESS || MPI_Comm_dup(ring_, &across_comm_) != MPI_SUCCESS) {
    return false;
  }
  MPI_Comm_set_errhandler(host_comm_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(across_comm_, MPI_ERRORS_RETURN);
  host_ = std::make_unique<MpiTransport>(host_comm_, wait_, abort_);
  // One rank per host across: the flat ring for large buffers, MPI for small.
  std::vector<int> one_per_host(static_cast<size_t>(ring_size_));
  for (int i = 0; i < ring_size_; ++i) one_per_host[static_cast<size_t>(i)] = i;
  across_ = Create(std::make_unique<MpiTransport>(across_comm_, wait_, abort_), across_comm_, one_per_host,
                   true, setup);
  // Create made the ring between hosts watch its sockets in its own MPI's
  // waits; the engine negotiates on this wire's MPI, so it watches them too.
  auto* across_ring = dynamic_cast<RingTransport*>(across_.get());
  if (across_ring != nullptr && across_ring->socket_) {
    std::shared_ptr<SocketRingLink> watched = across_ring->socket_;
    inner().WatchDuringNegotiation([watched] { return watched->ClosedNeighbour(); });
  }
  // The grid, as the communicators order it: hosts by id (ring_'s key),
  // ranks in a host by set rank (local_'s key).
  std::map<int, std::vector<int>> by_host;
  for (size_t r = 0; r < hosts.size(); ++r) by_host[hosts[r]].push_back(static_cast<int>(r));
  grid_.hosts = static_cast<int>(by_host.size());
  grid_.per_host = static_cast<int>(by_host.begin()->second.size());
  for (const auto& kv : by_host) grid_.rank_at.insert(grid_.rank_at.end(), kv.second.begin(), kv.second.end());
  return true;
}

RingTransport::RingTransport(std::unique_ptr<Transport> inner, MPI_Comm ring, MPI_Comm local,
                             MPI_Comm local_gather, const RingSetup& setup)
    : ForwardingTransport(std::move(inner)),
      ring_(ring),
      local_(local),
      local_gather_(local_gather),
      threshold_bytes_(setup.options.threshold_bytes),
      chunk_bytes_(setup.options.chunk_bytes),
      piece_bytes_(setup.hierarchical.piece_bytes),
      window_(static_cast<int>(setup.options.window)),
      wait_(setup.wait),
      abort_(setup.abort),
      stats_(setup.stats) {
  MPI_Comm_rank(ring_, &ring_rank_);
  MPI_Comm_size(ring_, &ring_size_);
}

RingTransport::~RingTransport() {
  host_.reset();
  across_.reset();
  if (abandoned_) return;
  for (MPI_Comm* c : {&host_comm_, &across_comm_}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
  MPI_Comm_free(&ring_);
  for (MPI_Comm* c : {&local_, &local_gather_}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

void RingTransport::Abandon() {
  abandoned_ = true;
  if (socket_) socket_->Close();  // the neighbours hear of it at once
  for (Transport* level : {host_.get(), across_.get()}) {
    if (level != nullptr) level->Abandon();
  }
  ForwardingTransport::Abandon();
}

bool RingTransport::GetWireSettings(WireSettings* out) const {
  out->ring_chunk_bytes = chunk_bytes_;
  out->hierarchical = local_ == MPI_COMM_NULL ? -1 : hierarchical_on_;
  return true;
}

void RingTransport::Tune(const WireSettings& settings) {
  if (settings.ring_chunk_bytes > 0) chunk_bytes_ = settings.ring_chunk_bytes;
  if (local_ != MPI_COMM_NULL && settings.hierarchical >= 0) hierarchical_on_ = settings.hierarchical != 0;
}

bool RingTransport::GetHostLevels(HostLevels* out) {
  if (!host_ || !across_) return false;
  out->host = host_.get();
  out->across = across_.get();
  return true;
}

bool RingTransport::Takes(int64_t count, DataType dtype, ReduceOp op) const {
  MPI_Datatype type;
  MPI_Op mpi_op;
  if (local_ != MPI_COMM_NULL && !hierarchical_on_) return false;
  return count * static_cast<int64_t>(DataTypeSize(dtype)) >= threshold_bytes_ &&
         ElementwiseReducible(dtype, op) && (local_ == MPI_COMM_NULL || MpiReduction(dtype, op, &type, &mpi_op));
}

const char* RingTransport::Activity(OpType op, DataType dtype, ReduceOp reduce) const {
  // Which wire a given allreduce takes depends on its size; the timeline
  // names the collective, and the span's length shows the wire.
  return inner().Activity(op, dtype, reduce);
}

Status RingTransport::StartAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                     ReduceOp op, double scale, std::unique_ptr<TransportWork>* work) {
  if (!Takes(count, dtype, op)) return inner().StartAllreduce(send, recv, count, dtype, op, scale, work);
  if (send != Transport::kInPlace && send != recv) {
    std::memcpy(recv, send, static_cast<size_t>(count) * DataTypeSize(dtype));
  }
  const int64_t elem = static_cast<int64_t>(DataTypeSize(dtype));
  RingAllreduceWork::Setup setup{ring_, ring_rank_, ring_size_, next_tag_, window_,
                                 std::max<int64_t>(1, std::min<int64_t>(chunk_bytes_, INT_MAX) / elem),
                                 &wait_, abort_};
  next_tag_ = (next_tag_ + 1) % kTagCycle;
  Status s;
  if (local_ != MPI_COMM_NULL) {
    HierarchicalAllreduceWork::Setup hierarchical{local_, local_gather_, setup,
                                                  std::max<int64_t>(1, piece_bytes_ / elem), kHierarchicalDepth,
                                                  &turns_};
    auto w = std::make_unique<HierarchicalAllreduceWork>(hierarchical, recv, count, dtype, op, scale);
    s = w->Start();
    if (s.ok()) *work = std::move(w);
  } else if (socket_) {
    SocketRingAllreduceWork::Setup over_sockets{socket_, window_, setup.chunk_elems, &wait_, abort_};
    auto w = std::make_unique<SocketRingAllreduceWork>(over_sockets, recv, count, dtype, op, scale);
    s = w->Start();
    if (s.ok()) *work = std::move(w);
    if (s.ok()) stats_->Add(stats_->socket_ring_collectives, 1);
  } else {
    auto w = std::make_unique<RingAllreduceWork>(setup, recv, count, dtype, op, scale);
    s = w->Start();
    if (s.ok()) *work = std::move(w);
  }
  if (s.ok()) stats_->Add(stats_->ring_collectives, 1);
  return s;
}

Status RingTransport::Allgatherv(const void* input, int64_t input_bytes, void* output,
                                 const std::vector<int64_t>& bytes_per_rank) {
  int64_t total = 0;
  for (int64_t b : bytes_per_rank) total += b;
  HostLevels levels;
  if (!hierarchical_allgather_ || total < threshold_bytes_ || !GetHostLevels(&levels)) {
    return inner().Allgatherv(input, input_bytes, output, bytes_per_rank);
  }
  Status s = HierarchicalAllgatherv(levels, grid_, input, input_bytes, output, bytes_per_rank, &gather_scratch_);
  if (s.ok()) stats_->Add(stats_->hierarchical_allgathers, 1);
  return s;
}

Status RingTransport::ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                                    DataType dtype, ReduceOp op) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  HostLevels levels;
  if (!hierarchical_on_ || total * static_cast<int64_t>(DataTypeSize(dtype)) < threshold_bytes_ ||
      !GetHostLevels(&levels)) {
    return inner().ReduceScatter(input, output, counts, dtype, op);
  }
  Status s = HierarchicalReduceScatter(levels, grid_, input, output, counts, dtype, op, &gather_scratch_);
  if (s.ok()) stats_->Add(stats_->hierarchical_reducescatters, 1);
  return s;
}

Status RingTransport::Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) {
  if (!Takes(count, dtype, op)) return inner().Allreduce(data, count, dtype, op);
  std::unique_ptr<TransportWork> work;
  Status s = StartAllreduce(Transport::kInPlace, data, count, dtype, op, 1.0, &work);
  return s.ok() ? work->Wait() : s;
}

}  // namespace hvdlite
