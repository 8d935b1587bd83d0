#include "transport/ring/hierarchical_allreduce.h"

#include <algorithm>

#include "common/keep_until_exit.h"
#include "transport/mpi/mpi_transport.h"
#include "transport/waiter.h"

namespace hvdlite {

HierarchicalAllreduceWork::HierarchicalAllreduceWork(const Setup& setup, void* data, int64_t count,
                                                     DataType dtype, ReduceOp op, double scale)
    : setup_(setup), buffer_(data, count, dtype, op, scale), turn_(setup.turns->created++) {
  MPI_Comm_rank(setup_.scatter, &local_rank_);
  MPI_Comm_size(setup_.scatter, &local_size_);
  const int64_t piece_elems = std::max<int64_t>(setup_.piece_elems, local_size_);
  int64_t block_elems = 0;
  for (int64_t offset = 0; offset < count; offset += piece_elems) {
    Piece piece;
    piece.offset = offset;
    piece.block_offset = block_elems;
    const int64_t n = std::min(piece_elems, count - offset);
    for (int i = 0, displ = 0; i < local_size_; ++i) {
      piece.counts.push_back(static_cast<int>(n / local_size_ + (i < n % local_size_)));
      piece.displs.push_back(displ);
      displ += piece.counts.back();
    }
    block_elems += piece.counts[static_cast<size_t>(local_rank_)];
    pieces_.push_back(std::move(piece));
  }
  block_.resize(static_cast<size_t>(block_elems * buffer_.elem));
}

HierarchicalAllreduceWork::~HierarchicalAllreduceWork() {
  const bool pending = std::any_of(pieces_.begin(), pieces_.end(),
                                   [](const Piece& p) { return p.request != MPI_REQUEST_NULL; });
  if (pending && setup_.cross.abort != nullptr && setup_.cross.abort->raised()) {
    // Abandoned without waiting for the peers (as RingAllreduceWork): the
    // host phases stay pending, and MPI may still use their counts and
    // fill this rank's blocks.
    struct Pending {
      std::vector<Piece> pieces;
      std::vector<uint8_t> block;
    };
    KeepUntilExit(Pending{std::move(pieces_), std::move(block_)});
  }
  for (Piece& piece : pieces_) {
    if (piece.request != MPI_REQUEST_NULL) MPI_Request_free(&piece.request);
  }
  // Only after an error (the engine then stops using these communicators):
  // the works after this one must not wait for turns it never passed on.
  setup_.turns->scatter = std::max(setup_.turns->scatter, turn_ + 1);
  setup_.turns->gather = std::max(setup_.turns->gather, turn_ + 1);
}

Status HierarchicalAllreduceWork::Start() {
  if (!MpiReduction(buffer_.dtype, buffer_.op, &type_, &mpi_op_)) {
    return status_ = Status::Error(ErrorKind::kInternal, "hierarchical allreduce: no MPI reduction for this type");
  }
  return status_ = StartScatters();
}

void HierarchicalAllreduceWork::Progress() {
  bool done;
  if (status_.ok()) status_ = Advance(&done);
}

Status HierarchicalAllreduceWork::Wait() {
  Status s = WaitUntil(*setup_.cross.wait, setup_.cross.abort, "hierarchical allreduce", [this](Status* error) {
    bool done = false;
    if (status_.ok()) status_ = Advance(&done);
    *error = status_;
    return !status_.ok() || done;
  });
  if (s.ok()) buffer_.ApplyScale();
  return s;
}

// In piece order, at most `depth` pieces reduced or reducing ahead of the ring.
Status HierarchicalAllreduceWork::StartScatters() {
  if (setup_.turns->scatter != turn_) return Status::OK();
  while (scattered_ < pieces_.size() && scattered_ < ringed_ + static_cast<size_t>(setup_.depth)) {
    Piece& piece = pieces_[scattered_];
    Status s = MpiCheck(MPI_Ireduce_scatter(buffer_.data + piece.offset * buffer_.elem,
                                            block_.data() + piece.block_offset * buffer_.elem, piece.counts.data(),
                                            type_, mpi_op_, setup_.scatter, &piece.request),
                        "MPI_Ireduce_scatter(host)");
    if (!s.ok()) return s;
    ++scattered_;
  }
  if (scattered_ == pieces_.size()) setup_.turns->scatter = turn_ + 1;
  return Status::OK();
}

// The pieces through the ring, in order, once it is this work's turn.
Status HierarchicalAllreduceWork::StartGathers() {
  if (setup_.turns->gather != turn_) return Status::OK();
  for (; gathering_ < ringed_; ++gathering_) {
    Piece& piece = pieces_[gathering_];
    const int mine = piece.counts[static_cast<size_t>(local_rank_)];
    Status s = MpiCheck(MPI_Iallgatherv(block_.data() + piece.block_offset * buffer_.elem, mine, type_,
                                        buffer_.data + piece.offset * buffer_.elem, piece.counts.data(),
                                        piece.displs.data(), type_, setup_.gather, &piece.request),
                        "MPI_Iallgatherv(host)");
    if (!s.ok()) return s;
  }
  if (gathering_ == pieces_.size()) setup_.turns->gather = turn_ + 1;
  return Status::OK();
}

Status HierarchicalAllreduceWork::TestRequest(Piece* piece, bool* finished) {
  int flag = 0;
  Status s = MpiCheck(MPI_Test(&piece->request, &flag, MPI_STATUS_IGNORE), "MPI_Test(host)");
  *finished = s.ok() && flag;
  return s;
}

// The ring takes one piece at a time, in order, once its reduce-scatter is
// done; a finished piece waits for its allgather inside the host.
Status HierarchicalAllreduceWork::MoveRing() {
  while (ringed_ < reduced_) {
    Piece& piece = pieces_[ringed_];
    if (ring_ == nullptr) {
      ring_ = std::make_unique<RingAllreduceWork>(setup_.cross, block_.data() + piece.block_offset * buffer_.elem,
                                                  piece.counts[static_cast<size_t>(local_rank_)], buffer_.dtype,
                                                  buffer_.op, 1.0);
      if (Status s = ring_->Start(); !s.ok()) return s;
    }
    bool ring_done = false;
    if (Status s = ring_->Advance(&ring_done); !s.ok() || !ring_done) return s;
    ring_.reset();
    ++ringed_;
  }
  return Status::OK();
}

Status HierarchicalAllreduceWork::Advance(bool* done) {
  bool finished = true;
  while (finished && reduced_ < scattered_) {
    if (Status s = TestRequest(&pieces_[reduced_], &finished); !s.ok()) return s;
    if (finished) ++reduced_;
  }
  if (Status s = MoveRing(); !s.ok()) return s;
  if (Status s = StartScatters(); !s.ok()) return s;
  if (Status s = StartGathers(); !s.ok()) return s;
  finished = true;
  while (finished && gathered_ < gathering_) {
    if (Status s = TestRequest(&pieces_[gathered_], &finished); !s.ok()) return s;
    if (finished) ++gathered_;
  }
  // An empty buffer is done once it has passed its turns on.
  *done = gathered_ == pieces_.size() && setup_.turns->scatter > turn_ && setup_.turns->gather > turn_;
  return Status::OK();
}

}  // namespace hvdlite
