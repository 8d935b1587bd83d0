// Allgather with several ranks on each of several hosts (Horovod's
// HOROVOD_HIERARCHICAL_ALLGATHER). A flat allgather through every rank sends
// blocks over a host's link more often than needed: a ring through 2 hosts x
// 2 ranks carries 3 blocks each way where 2 must cross. Here each rank first
// gathers, across hosts, the blocks of the ranks with its own local rank (one
// per host), so each block crosses each link once; then the host's ranks
// gather those columns through the host's memory, and the blocks are put
// back in the set's rank order.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace hvdlite {

// Allgatherv over `levels` with the result in set rank order; `scratch` is
// reused across calls.
Status HierarchicalAllgatherv(const HostLevels& levels, const HostGrid& grid, const void* input,
                              int64_t input_bytes, void* output, const std::vector<int64_t>& bytes_per_rank,
                              std::vector<uint8_t>* scratch);

}  // namespace hvdlite
