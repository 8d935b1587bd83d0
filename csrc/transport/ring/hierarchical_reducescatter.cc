#include "transport/ring/hierarchical_reducescatter.h"

#include <cstring>

namespace hvdlite {

Status HierarchicalReduceScatter(const HostLevels& levels, const HostGrid& grid, const void* input,
                                 void* output, const std::vector<int64_t>& counts, DataType dtype,
                                 ReduceOp op, std::vector<uint8_t>* scratch) {
  const int64_t elem = static_cast<int64_t>(DataTypeSize(dtype));
  const int me = levels.host->rank();
  std::vector<int64_t> offset(counts.size(), 0);
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    offset[r] = total;
    total += counts[r];
  }
  const std::vector<int64_t> column = grid.ColumnTotals(counts), mine = grid.Column(counts, me);
  // The input regrouped column by column, then this rank's column summed over
  // the host (MPI wants the output apart from the input).
  scratch->resize(static_cast<size_t>((total + column[static_cast<size_t>(me)]) * elem) + 1);
  uint8_t* grouped = scratch->data();
  uint8_t* host_sum = grouped + total * elem;
  int64_t at = 0;
  for (int l = 0; l < grid.per_host; ++l) {
    for (int h = 0; h < grid.hosts; ++h) {
      const size_t r = static_cast<size_t>(grid.RankAt(h, l));
      std::memcpy(grouped + at * elem, static_cast<const uint8_t*>(input) + offset[r] * elem,
                  static_cast<size_t>(counts[r] * elem));
      at += counts[r];
    }
  }
  Status s = levels.host->ReduceScatter(grouped, host_sum, column, dtype, op);
  if (s.ok()) s = levels.across->ReduceScatter(host_sum, output, mine, dtype, op);
  return s;
}

}  // namespace hvdlite
