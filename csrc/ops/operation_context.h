// What the parts that run a round's collectives share (operations.h, the
// allreduce pipeline, Adasum, the other collectives): settings, counters,
// the timeline's per-tensor rows, staging buffers, the compressors kept
// across rounds, and the small rules they all apply.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "compressors/compressor.h"
#include "engine/engine_options.h"
#include "engine/engine_stats.h"
#include "engine/flight_recorder.h"
#include "allreduce/fusion_buffer.h"
#include "negotiation/message.h"
#include "common/status.h"
#include "engine/tensor_queue.h"
#include "timeline/timeline.h"

namespace hvdlite {

struct OperationContext {
  OperationContext(const EngineOptions& opts, EngineStats* engine_stats, Timeline* engine_timeline)
      : options(opts), stats(engine_stats), timeline(engine_timeline) {}

  // Timeline events on the rows of `entries` (names: timeline_names.h).
  void Phase(const std::vector<TensorEntry*>& entries, const char* phase, bool begin,
             const std::string& args = "") const;
  // `run` as one activity on the entry's row.
  Status Timed(TensorEntry& entry, const char* activity, const std::function<Status()>& run) const;
  // Counts the tensors of a finished allreduce bucket, ends their operation
  // spans (with what they were fused with) and completes their handles.
  void CompleteAllreduces(const std::vector<TensorEntry*>& entries, int64_t wire_bytes) const;

  EngineOptions options;
  EngineStats* stats;
  Timeline* timeline;
  FlightRecorder* flight = nullptr;  // the engine's; none in unit tests
  FusionBuffer buffers;
  CompressorCache compressors;
  // Float32 scratch for widened or rescaled copies, reused across rounds.
  std::vector<float> scratch_in;
  std::vector<float> scratch_out;
};

bool Is16BitFloat(DataType dtype);
// Average is a Sum whose result is scaled by 1/size after the wire.
double PostFactor(const Request& q, int set_size);
// Elements per row: all dimensions but the first.
int64_t RowElements(const std::vector<int64_t>& shape);
int64_t BytesIn(const std::vector<TensorEntry*>& entries);
Status OutOfMemory(const std::string& what, size_t bytes);
// float32 tensors are compressed, and 16-bit floats by a compressor that
// takes them (registry.h: widened to float32 around it); other dtypes go as
// they are (validation refuses top-k and PowerSGD on them earlier).
CompressionSpec EffectiveCompression(const Request& q);
// The tensor as the one segment of its own wire form (residuals follow names).
std::vector<Segment> OneSegment(const TensorEntry& e, int64_t count);
// The tensor as a segment of a buffer, at `offset` elements.
Segment SegmentOf(const TensorEntry& e, int64_t offset);

}  // namespace hvdlite
