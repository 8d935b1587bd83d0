#include "ring_transport.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "../reduce_kernels.h"
#include "../scale.h"
#include "../timeline_names.h"
#include "mpi_transport.h"
#include "waiter.h"

namespace hvdlite {

namespace {

// Tags of ring messages cycle below this (MPI guarantees tags up to 32767).
constexpr int kTagCycle = 32768;

// One ring allreduce, advanced by Progress() and Wait(). Transfers are
// numbered t = step * chunks + chunk over the 2(p-1) steps; sends and
// receives each go out in that order, so MPI's non-overtaking rule matches
// them with the neighbours' without per-transfer tags.
class RingAllreduceWork : public TransportWork {
 public:
  struct Setup {
    MPI_Comm comm;
    int rank, size, tag, window;
    int64_t chunk_elems;
    const WaitPolicy* wait;
    const std::atomic<bool>* abort;
  };

  RingAllreduceWork(const Setup& setup, void* data, int64_t count, DataType dtype, ReduceOp op,
                    double scale)
      : setup_(setup), data_(static_cast<uint8_t*>(data)), count_(count), dtype_(dtype), op_(op),
        scale_(scale), elem_(static_cast<int64_t>(DataTypeSize(dtype))) {
    const int p = setup_.size;
    const int64_t longest = count / p + (count % p != 0);
    chunks_ = std::max<int64_t>(1, (longest + setup_.chunk_elems - 1) / setup_.chunk_elems);
    transfers_ = 2 * (p - 1) * chunks_;
    slots_.assign(static_cast<size_t>(setup_.window),
                  std::vector<uint8_t>(static_cast<size_t>(std::min(longest, setup_.chunk_elems) * elem_)));
    recvs_.assign(static_cast<size_t>(setup_.window), MPI_REQUEST_NULL);
  }

  ~RingAllreduceWork() override {
    // Only after an error or an abort: the engine stops using this
    // communicator then, and MPI cannot cancel a send portably.
    for (auto& r : recvs_) {
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
    for (auto& r : sends_) {
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
  }

  Status Start() { return status_ = Step(); }

  // Moves every transfer that can move; `*done` once all have.
  Status Advance(bool* done) {
    if (status_.ok() && !finished()) status_ = Step();
    *done = finished();
    return status_;
  }

  void Progress() override {
    bool done;
    Advance(&done);
  }

  Status Wait() override {
    Status s = WaitUntil(*setup_.wait, setup_.abort, "ring allreduce", [this](Status* error) {
      bool done;
      *error = Advance(&done);
      return !error->ok() || done;
    });
    if (s.ok() && scale_ != 1.0) CopyScaled(data_, data_, count_, dtype_, scale_);
    return s;
  }

 private:
  bool finished() const { return processed_ == transfers_ && sent_done_ == transfers_; }
  int Mod(int64_t x) const { return static_cast<int>(((x % setup_.size) + setup_.size) % setup_.size); }
  bool Gathering(int64_t t) const { return t / chunks_ >= setup_.size - 1; }

  // Segment s of p: elements [begin, end).
  void Segment(int s, int64_t* begin, int64_t* end) const {
    const int p = setup_.size;
    const int64_t base = count_ / p, extra = count_ % p;
    *begin = s * base + std::min<int64_t>(s, extra);
    *end = *begin + base + (s < extra);
  }
  // The elements transfer t sends (`sending`) or receives: chunk t % chunks
  // of the segment its step passes on.
  void Range(int64_t t, bool sending, int64_t* lo, int64_t* n) const {
    const int64_t step = t / chunks_, chunk = t % chunks_;
    const int r = setup_.rank, p = setup_.size;
    int segment;
    if (step < p - 1) {  // reduce-scatter
      segment = Mod(sending ? r - step : r - step - 1);
    } else {             // allgather
      const int64_t a = step - (p - 1);
      segment = Mod(sending ? r + 1 - a : r - a);
    }
    int64_t begin, end;
    Segment(segment, &begin, &end);
    *lo = std::min(end, begin + chunk * setup_.chunk_elems);
    *n = std::min(end, *lo + setup_.chunk_elems) - *lo;
  }
  int Left() const { return Mod(setup_.rank - 1); }
  int Right() const { return Mod(setup_.rank + 1); }

  Status Step() {
    for (bool moved = true; moved;) {
      moved = false;
      Status s = PostReceives();
      if (s.ok()) s = FinishReceives(&moved);
      if (s.ok()) s = PostSends(&moved);
      if (s.ok()) s = FinishSends(&moved);
      if (!s.ok()) return s;
    }
    return Status::OK();
  }

  Status PostReceives() {
    while (posted_ < transfers_ && posted_ - processed_ < setup_.window) {
      int64_t lo, n;
      Range(posted_, false, &lo, &n);
      const size_t slot = static_cast<size_t>(posted_ % setup_.window);
      Status s = MpiCheck(MPI_Irecv(slots_[slot].data(), static_cast<int>(n * elem_), MPI_BYTE, Left(),
                                    setup_.tag, setup_.comm, &recvs_[slot]),
                          "MPI_Irecv(ring)");
      if (!s.ok()) return s;
      ++posted_;
    }
    return Status::OK();
  }

  // Receives are used in order: summed into (reduce-scatter) or copied to
  // (allgather) their place in the buffer.
  Status FinishReceives(bool* moved) {
    while (processed_ < posted_) {
      const size_t slot = static_cast<size_t>(processed_ % setup_.window);
      int done = 0;
      Status s = MpiCheck(MPI_Test(&recvs_[slot], &done, MPI_STATUS_IGNORE), "MPI_Test(ring receive)");
      if (!s.ok()) return s;
      if (!done) return Status::OK();
      int64_t lo, n;
      Range(processed_, false, &lo, &n);
      if (Gathering(processed_)) {
        // The place was sent in the reduce-scatter step of the same number;
        // MPI forbids writing a buffer a send still reads.
        const int64_t earlier = processed_ - (setup_.size - 1) * chunks_;
        if (sent_done_ <= earlier) return Status::OK();
        std::memcpy(data_ + lo * elem_, slots_[slot].data(), static_cast<size_t>(n * elem_));
      } else {
        ReduceInto(slots_[slot].data(), data_ + lo * elem_, n, dtype_, op_);
      }
      ++processed_;
      *moved = true;
      if (Status p = PostReceives(); !p.ok()) return p;
    }
    return Status::OK();
  }

  // Transfer t carries what transfer t - chunks brought (the first step: this
  // rank's own data).
  Status PostSends(bool* moved) {
    while (next_send_ < transfers_ && static_cast<int64_t>(sends_.size()) < setup_.window &&
           (next_send_ < chunks_ || processed_ > next_send_ - chunks_)) {
      int64_t lo, n;
      Range(next_send_, true, &lo, &n);
      sends_.push_back(MPI_REQUEST_NULL);
      Status s = MpiCheck(MPI_Isend(data_ + lo * elem_, static_cast<int>(n * elem_), MPI_BYTE, Right(),
                                    setup_.tag, setup_.comm, &sends_.back()),
                          "MPI_Isend(ring)");
      if (!s.ok()) return s;
      ++next_send_;
      *moved = true;
    }
    return Status::OK();
  }

  Status FinishSends(bool* moved) {
    while (!sends_.empty()) {
      int done = 0;
      Status s = MpiCheck(MPI_Test(&sends_.front(), &done, MPI_STATUS_IGNORE), "MPI_Test(ring send)");
      if (!s.ok()) return s;
      if (!done) return Status::OK();
      sends_.pop_front();
      ++sent_done_;
      *moved = true;
    }
    return Status::OK();
  }

  const Setup setup_;
  uint8_t* data_;
  int64_t count_;
  DataType dtype_;
  ReduceOp op_;
  double scale_;
  int64_t elem_;
  int64_t chunks_ = 1;     // per segment
  int64_t transfers_ = 0;  // each way
  std::vector<std::vector<uint8_t>> slots_;  // receive buffers, one per transfer in flight
  std::vector<MPI_Request> recvs_;           // by slot
  std::deque<MPI_Request> sends_;            // in transfer order
  int64_t posted_ = 0;      // receives posted
  int64_t processed_ = 0;   // receives summed or copied into place
  int64_t next_send_ = 0;   // sends posted
  int64_t sent_done_ = 0;   // sends completed (in order)
  Status status_;
};

// Several ranks on each of several hosts: the ranks of a host first reduce
// the buffer to one block each (MPI's reduce-scatter, over shared memory
// inside the host), the ranks with the same block on every host sum it
// around the ring between hosts, and the host's ranks gather the blocks
// again. Each host's link then carries 2(H-1)/H of the buffer once, split
// across its ranks, where a ring through every rank sends it over the link
// as often as the ring crosses hosts.
class HierarchicalAllreduceWork : public TransportWork {
 public:
  HierarchicalAllreduceWork(MPI_Comm local, const RingAllreduceWork::Setup& cross, void* data,
                            int64_t count, DataType dtype, ReduceOp op, double scale)
      : local_(local), cross_(cross), data_(data), count_(count), dtype_(dtype), op_(op), scale_(scale) {
    MPI_Comm_rank(local_, &local_rank_);
    MPI_Comm_size(local_, &local_size_);
    for (int i = 0, offset = 0; i < local_size_; ++i) {
      counts_.push_back(static_cast<int>(count / local_size_ + (i < count % local_size_)));
      displs_.push_back(offset);
      offset += counts_.back();
    }
    block_.resize(static_cast<size_t>(counts_[local_rank_]) * DataTypeSize(dtype));
  }

  ~HierarchicalAllreduceWork() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Request_free(&request_);
  }

  Status Start() {
    if (!MpiReduction(dtype_, op_, &type_, &mpi_op_)) {
      return Status::Error(ErrorKind::kInternal, "hierarchical allreduce: no MPI reduction for this type");
    }
    return MpiCheck(MPI_Ireduce_scatter(data_, block_.data(), counts_.data(), type_, mpi_op_, local_,
                                        &request_),
                    "MPI_Ireduce_scatter(host)");
  }

  void Progress() override {
    bool done;
    if (status_.ok()) status_ = Advance(&done);
  }

  Status Wait() override {
    Status s = WaitUntil(*cross_.wait, cross_.abort, "hierarchical allreduce", [this](Status* error) {
      bool done = false;
      if (status_.ok()) status_ = Advance(&done);
      *error = status_;
      return !status_.ok() || done;
    });
    if (s.ok() && scale_ != 1.0) CopyScaled(data_, data_, count_, dtype_, scale_);
    return s;
  }

 private:
  Status Advance(bool* done) {
    *done = false;
    if (phase_ == 0 || phase_ == 2) {
      int finished = 0;
      Status s = MpiCheck(MPI_Test(&request_, &finished, MPI_STATUS_IGNORE), "MPI_Test(host)");
      if (!s.ok() || !finished) return s;
      if (phase_ == 2) {
        phase_ = 3;
        *done = true;
        return Status::OK();
      }
      ring_ = std::make_unique<RingAllreduceWork>(cross_, block_.data(), counts_[local_rank_], dtype_, op_,
                                                  1.0);
      phase_ = 1;
    }
    if (phase_ == 1) {
      bool ring_done = false;
      Status s = ring_->Advance(&ring_done);
      if (!s.ok() || !ring_done) return s;
      phase_ = 2;
      return MpiCheck(MPI_Iallgatherv(block_.data(), counts_[local_rank_], type_, data_, counts_.data(),
                                      displs_.data(), type_, local_, &request_),
                      "MPI_Iallgatherv(host)");
    }
    *done = phase_ == 3;
    return Status::OK();
  }

  MPI_Comm local_;
  RingAllreduceWork::Setup cross_;
  void* data_;
  int64_t count_;
  DataType dtype_;
  ReduceOp op_;
  double scale_;
  int local_rank_ = 0, local_size_ = 1;
  std::vector<int> counts_, displs_;  // of the blocks, in elements
  std::vector<uint8_t> block_;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op mpi_op_ = MPI_OP_NULL;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::unique_ptr<RingAllreduceWork> ring_;
  int phase_ = 0;  // 0 reduce-scatter in the host, 1 ring between hosts, 2 allgather in the host, 3 done
  Status status_;
};

}  // namespace

std::unique_ptr<Transport> RingTransport::Create(std::unique_ptr<Transport> inner, MPI_Comm comm,
                                                 const std::vector<int>& hosts, bool want,
                                                 const EngineOptions& options, EngineStats* stats,
                                                 const std::atomic<bool>* abort) {
  int all_want = want && inner->size() > 1 ? 1 : 0;
  // Every rank must pick the same wire, whatever its environment says.
  if (MPI_Allreduce(MPI_IN_PLACE, &all_want, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS || !all_want) {
    return inner;
  }
  std::map<int, int> ranks_per_host;
  for (int h : hosts) ++ranks_per_host[h];
  const int per_host = ranks_per_host.begin()->second;
  const bool even = std::all_of(ranks_per_host.begin(), ranks_per_host.end(),
                                [per_host](const auto& kv) { return kv.second == per_host; });
  const bool hierarchical =
      options.hierarchical_allreduce && ranks_per_host.size() > 1 && per_host > 1 && even;
  // One ring through several ranks per host crosses each host's link more
  // than once: slower than MPI there (2 hosts x 2 ranks: 1.19x), so by
  // default the ring runs only with one rank per host or hierarchically.
  if (options.ring != EngineOptions::Ring::kOn && per_host > 1 && !hierarchical) return inner;
  const int me = inner->rank();
  MPI_Comm local = MPI_COMM_NULL, ring = MPI_COMM_NULL;
  int ok;
  if (hierarchical) {
    // The host's ranks, and the ranks holding the same block on every host
    // (ordered by host, so the ring visits hosts in a fixed order).
    ok = MPI_Comm_split(comm, hosts[static_cast<size_t>(me)], me, &local) == MPI_SUCCESS;
    int local_rank = 0;
    if (ok) MPI_Comm_rank(local, &local_rank);
    ok = ok && MPI_Comm_split(comm, local_rank, hosts[static_cast<size_t>(me)], &ring) == MPI_SUCCESS;
  } else {
    ok = MPI_Comm_dup(comm, &ring) == MPI_SUCCESS;
  }
  if (!ok) {  // MPI errors here are fatal to the communicator anyway
    if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
    return inner;
  }
  for (MPI_Comm c : {local, ring}) {
    if (c != MPI_COMM_NULL) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  }
  return std::unique_ptr<Transport>(new RingTransport(std::move(inner), ring, local, options, stats, abort));
}

RingTransport::RingTransport(std::unique_ptr<Transport> inner, MPI_Comm ring, MPI_Comm local,
                             const EngineOptions& options, EngineStats* stats,
                             const std::atomic<bool>* abort)
    : ForwardingTransport(std::move(inner)),
      ring_(ring),
      local_(local),
      threshold_bytes_(options.ring_threshold_bytes),
      chunk_bytes_(options.ring_chunk_bytes),
      window_(static_cast<int>(options.ring_window)),
      wait_(options.wait),
      abort_(abort),
      stats_(stats) {
  MPI_Comm_rank(ring_, &ring_rank_);
  MPI_Comm_size(ring_, &ring_size_);
}

RingTransport::~RingTransport() {
  MPI_Comm_free(&ring_);
  if (local_ != MPI_COMM_NULL) MPI_Comm_free(&local_);
}

bool RingTransport::Takes(int64_t count, DataType dtype, ReduceOp op) const {
  MPI_Datatype type;
  MPI_Op mpi_op;
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
    auto w = std::make_unique<HierarchicalAllreduceWork>(local_, setup, recv, count, dtype, op, scale);
    s = w->Start();
    if (s.ok()) *work = std::move(w);
  } else {
    auto w = std::make_unique<RingAllreduceWork>(setup, recv, count, dtype, op, scale);
    s = w->Start();
    if (s.ok()) *work = std::move(w);
  }
  if (s.ok()) stats_->Add(stats_->ring_collectives, 1);
  return s;
}

Status RingTransport::Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) {
  if (!Takes(count, dtype, op)) return inner().Allreduce(data, count, dtype, op);
  std::unique_ptr<TransportWork> work;
  Status s = StartAllreduce(Transport::kInPlace, data, count, dtype, op, 1.0, &work);
  return s.ok() ? work->Wait() : s;
}

}  // namespace hvdlite
