#include "transport/ring/hierarchical_allgather.h"

#include <cstring>

namespace hvdlite {

Status HierarchicalAllgatherv(const HostLevels& levels, const HostGrid& grid, const void* input,
                              int64_t input_bytes, void* output, const std::vector<int64_t>& bytes_per_rank,
                              std::vector<uint8_t>* scratch) {
  const int me = levels.host->rank();
  // Column l: the blocks of every host's rank with local rank l, hosts in order.
  const std::vector<int64_t> column = grid.ColumnTotals(bytes_per_rank), mine = grid.Column(bytes_per_rank, me);
  int64_t total = 0;
  for (int64_t n : column) total += n;
  const int64_t my_column = column[static_cast<size_t>(me)];
  scratch->resize(static_cast<size_t>(my_column + total) + 1);
  uint8_t* cross = scratch->data();
  uint8_t* gathered = cross + my_column;

  Status s = levels.across->Allgatherv(input, input_bytes, cross, mine);
  if (s.ok()) s = levels.host->Allgatherv(cross, my_column, gathered, column);
  if (!s.ok()) return s;

  std::vector<int64_t> offset(bytes_per_rank.size(), 0);
  for (size_t r = 1; r < offset.size(); ++r) offset[r] = offset[r - 1] + bytes_per_rank[r - 1];
  const uint8_t* from = gathered;
  for (int l = 0; l < grid.per_host; ++l) {
    for (int h = 0; h < grid.hosts; ++h) {
      const int r = grid.RankAt(h, l);
      const int64_t n = bytes_per_rank[static_cast<size_t>(r)];
      if (n > 0) std::memcpy(static_cast<uint8_t*>(output) + offset[static_cast<size_t>(r)], from, static_cast<size_t>(n));
      from += n;
    }
  }
  return Status::OK();
}

}  // namespace hvdlite
