// Where the ranks of the engine's communicator run: ranks on one host share
// a processor name, so local and cross ranks follow from the list of names,
// without extra communicators.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace hvdlite {

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // among the ranks of this host
  int cross_rank = 0, cross_size = 1;  // among the ranks with this local rank, one per host
  std::vector<int> host_of_rank;       // index of each rank's host, in order of first appearance

  // Whether all these ranks run on one host (shared memory can join them).
  bool OneHost(const std::vector<int32_t>& ranks) const;
  // The host index of each of these ranks, in their order.
  std::vector<int> HostsOf(const std::vector<int32_t>& ranks) const;
};

// Collective over `comm`: allgathers every rank's processor name.
Status DiscoverTopology(MPI_Comm comm, Topology* out);

}  // namespace hvdlite
