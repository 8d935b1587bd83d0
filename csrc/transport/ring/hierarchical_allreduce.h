// Allreduce with several ranks on each of several hosts: the host's ranks
// reduce-scatter among themselves (MPI over shared memory inside the host),
// the ranks holding the same block on every host sum it around a ring
// between hosts (RingAllreduceWork), and the host's ranks gather the blocks
// again. Each host's link then carries 2(H-1)/H of the buffer once, split
// across its ranks, where a ring through every rank sends it over the link
// as often as the ring crosses hosts.
//
// The three phases pipeline over pieces of the buffer: while piece j goes
// around the ring between hosts, piece j+1 is reduced and piece j-1 gathered
// inside the host, so the link does not wait for the in-host phases.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "transport/in_place_reduction.h"
#include "transport/ring/ring_allreduce.h"

namespace hvdlite {

// Several allreduces can be in flight at once (the allreduce pipeline starts
// the next bucket before the last one finishes), and MPI wants nonblocking
// collectives on one communicator started in the same order on every rank.
// So the works take turns, in the order they were created (the same on every
// rank): a work starts its host reduce-scatters only once the one before has
// started all of its own, and likewise its allgathers.
struct HostPhaseTurns {
  int64_t created = 0;  // works created so far: the next one's number
  int64_t scatter = 0;  // the work whose reduce-scatters may start
  int64_t gather = 0;   // the work whose allgathers may start
};

class HierarchicalAllreduceWork : public TransportWork {
 public:
  struct Setup {
    // The host's ranks, twice: reduce-scatters and allgathers of different
    // pieces interleave differently on each rank, and MPI wants nonblocking
    // collectives on one communicator started in the same order everywhere.
    MPI_Comm scatter, gather;
    RingAllreduceWork::Setup cross;  // the ring between hosts
    int64_t piece_elems;             // elements per piece
    int depth;                       // pieces reduced in the host ahead of the ring
    HostPhaseTurns* turns;           // shared by the works of one transport
  };

  HierarchicalAllreduceWork(const Setup& setup, void* data, int64_t count, DataType dtype, ReduceOp op,
                            double scale);
  ~HierarchicalAllreduceWork() override;

  Status Start();
  void Progress() override;
  Status Wait() override;

 private:
  struct Piece {
    std::vector<int> counts, displs;  // the host's blocks of this piece, in elements
    int64_t offset = 0;               // of the piece in the buffer, in elements
    int64_t block_offset = 0;         // of this rank's block in block_, in elements
    MPI_Request request = MPI_REQUEST_NULL;  // its reduce-scatter, later its allgather
  };

  Status Advance(bool* done);
  Status StartScatters();
  Status StartGathers();
  Status TestRequest(Piece* piece, bool* finished);
  Status MoveRing();

  const Setup setup_;
  const InPlaceReduction buffer_;
  int local_rank_ = 0, local_size_ = 1;
  std::vector<Piece> pieces_;
  std::vector<uint8_t> block_;  // this rank's block of every piece, one after another
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op mpi_op_ = MPI_OP_NULL;
  std::unique_ptr<RingAllreduceWork> ring_;  // of piece `ringed_`
  int64_t turn_;          // this work's number (HostPhaseTurns)
  size_t scattered_ = 0;  // reduce-scatters started
  size_t reduced_ = 0;    // reduce-scatters finished
  size_t ringed_ = 0;     // pieces through the ring
  size_t gathering_ = 0;  // allgathers started
  size_t gathered_ = 0;   // allgathers finished
  Status status_;
};

}  // namespace hvdlite
