#include "transport/ring/ring_allreduce.h"

#include <algorithm>
#include <cstring>

#include "common/keep_until_exit.h"
#include "kernels/reduce_kernels.h"
#include "kernels/scale.h"
#include "transport/mpi/mpi_transport.h"
#include "transport/waiter.h"

namespace hvdlite {

RingAllreduceWork::RingAllreduceWork(const Setup& setup, void* data, int64_t count, DataType dtype,
                                     ReduceOp op, double scale)
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

RingAllreduceWork::~RingAllreduceWork() {
  if (setup_.abort != nullptr && setup_.abort->raised()) {
    // The engine stops without waiting for its peers: the receives stay
    // pending (freeing a request is an MPI call, which an abandoned engine
    // no longer makes), and MPI may still fill their buffers.
    if (posted_ > processed_) KeepUntilExit(std::move(slots_));
    return;
  }
  // Only after an error: the engine stops using this communicator then,
  // and MPI cannot cancel a send portably.
  for (auto& r : recvs_) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  for (auto& r : sends_) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
}

Status RingAllreduceWork::Advance(bool* done) {
  if (status_.ok() && !finished()) status_ = Step();
  *done = finished();
  return status_;
}

void RingAllreduceWork::Progress() {
  bool done;
  Advance(&done);
}

Status RingAllreduceWork::Wait() {
  Status s = WaitUntil(*setup_.wait, setup_.abort, "ring allreduce", [this](Status* error) {
    bool done;
    *error = Advance(&done);
    return !error->ok() || done;
  });
  if (s.ok() && scale_ != 1.0) CopyScaled(data_, data_, count_, dtype_, scale_);
  return s;
}

// Segment s of p: elements [begin, end).
void RingAllreduceWork::Segment(int s, int64_t* begin, int64_t* end) const {
  const int p = setup_.size;
  const int64_t base = count_ / p, extra = count_ % p;
  *begin = s * base + std::min<int64_t>(s, extra);
  *end = *begin + base + (s < extra);
}

// The elements transfer t sends (`sending`) or receives: chunk t % chunks of
// the segment its step passes on.
void RingAllreduceWork::Range(int64_t t, bool sending, int64_t* lo, int64_t* n) const {
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

Status RingAllreduceWork::Step() {
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

Status RingAllreduceWork::PostReceives() {
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
Status RingAllreduceWork::FinishReceives(bool* moved) {
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
Status RingAllreduceWork::PostSends(bool* moved) {
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

Status RingAllreduceWork::FinishSends(bool* moved) {
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

}  // namespace hvdlite
