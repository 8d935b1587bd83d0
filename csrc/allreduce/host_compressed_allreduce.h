// Compression between hosts only. With several ranks on each of several
// hosts, the link between hosts is the slow part and the host's memory is
// not: so the ranks of a host first sum their float32 buffers exactly (a
// reduce-scatter inside the host), each rank compresses its block of the
// host's sum, the blocks cross hosts in their wire form (summed as the wire
// type for fp16, gathered and added for top-k), and the host's ranks gather
// the blocks again. The sum inside a host loses nothing, top-k selects from
// the host's sum rather than from each rank's gradient, and error feedback
// keeps the residual of the host's sum, block by block.
#pragma once

#include <cstdint>
#include <vector>

#include "compressors/compressor.h"
#include "engine/engine_stats.h"
#include "common/status.h"
#include "transport/transport.h"

namespace hvdlite {

class HostCompressedAllreduce {
 public:
  // Sums `count` float32 elements of `data` in place over both levels; the
  // tensors in it are `segs` (names key the compressor's residuals).
  // Adds the bytes this rank sends between hosts to `*wire_bytes`.
  Status Run(const HostLevels& levels, Compressor* compressor, float* data, int64_t count,
             const std::vector<Segment>& segs, int64_t* wire_bytes);

 private:
  // The parts of `segs` inside [lo, hi), renumbered from lo; a tensor cut by
  // a block boundary becomes "name@first", so each slice keeps its residual.
  void BlockSegments(const std::vector<Segment>& segs, int64_t lo, int64_t hi);

  // Scratch reused across rounds.
  std::vector<Segment> block_segs_;
  std::vector<float> block_;
  std::vector<uint8_t> wire_, gathered_;
};

}  // namespace hvdlite
