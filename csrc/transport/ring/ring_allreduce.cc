#include "transport/ring/ring_allreduce.h"

#include <algorithm>
#include <cstring>

#include "common/keep_until_exit.h"
#include "kernels/reduce_kernels.h"
#include "transport/mpi/mpi_transport.h"
#include "transport/waiter.h"

namespace hvdlite {

RingAllreduceWork::RingAllreduceWork(const Setup& setup, void* data, int64_t count, DataType dtype,
                                     ReduceOp op, double scale)
    : setup_(setup), buffer_(data, count, dtype, op, scale),
      schedule_(setup.rank, setup.size, count, setup.chunk_elems), transfers_(schedule_.transfers()) {
  slots_.assign(static_cast<size_t>(setup_.window),
                std::vector<uint8_t>(static_cast<size_t>(schedule_.longest_chunk() * buffer_.elem)));
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
  if (s.ok()) buffer_.ApplyScale();
  return s;
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
    schedule_.Range(posted_, false, &lo, &n);
    const size_t slot = static_cast<size_t>(posted_ % setup_.window);
    Status s = MpiCheck(MPI_Irecv(slots_[slot].data(), static_cast<int>(n * buffer_.elem), MPI_BYTE, schedule_.left(),
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
    schedule_.Range(processed_, false, &lo, &n);
    if (schedule_.Gathering(processed_)) {
      // MPI forbids writing a buffer a send still reads.
      if (sent_done_ <= schedule_.EarlierSend(processed_)) return Status::OK();
      std::memcpy(buffer_.data + lo * buffer_.elem, slots_[slot].data(), static_cast<size_t>(n * buffer_.elem));
    } else {
      ReduceInto(slots_[slot].data(), buffer_.data + lo * buffer_.elem, n, buffer_.dtype, buffer_.op);
    }
    ++processed_;
    *moved = true;
    if (Status p = PostReceives(); !p.ok()) return p;
  }
  return Status::OK();
}

Status RingAllreduceWork::PostSends(bool* moved) {
  while (next_send_ < transfers_ && static_cast<int64_t>(sends_.size()) < setup_.window &&
         schedule_.CanSend(next_send_, processed_)) {
    int64_t lo, n;
    schedule_.Range(next_send_, true, &lo, &n);
    sends_.push_back(MPI_REQUEST_NULL);
    Status s = MpiCheck(MPI_Isend(buffer_.data + lo * buffer_.elem, static_cast<int>(n * buffer_.elem), MPI_BYTE,
                                  schedule_.right(), setup_.tag, setup_.comm, &sends_.back()),
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
