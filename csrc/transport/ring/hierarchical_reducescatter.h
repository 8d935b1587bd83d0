// Reducescatter with several ranks on each of several hosts, the mirror of
// hierarchical_allgather.h: the host's ranks first reduce-scatter through
// the host's memory so that local rank l holds the host's sum of column l
// (the blocks of every host's rank with local rank l), then the ranks with
// local rank l reduce-scatter that column across hosts. Each host's link
// carries (H-1)/H of the buffer once, where a flat reduce-scatter through
// every rank crosses it more often.
#pragma once

#include <cstdint>
#include <vector>

#include "common/common.h"
#include "common/status.h"
#include "transport/transport.h"

namespace hvdlite {

// Leaves block r (counts[r] elements, set rank order) of the sum over the
// set on rank r. `scratch` is reused across calls.
Status HierarchicalReduceScatter(const HostLevels& levels, const HostGrid& grid, const void* input,
                                 void* output, const std::vector<int64_t>& counts, DataType dtype,
                                 ReduceOp op, std::vector<uint8_t>* scratch);

}  // namespace hvdlite
