#include "ops/operation_context.h"

#include "compressors/registry.h"
#include "timeline/timeline_names.h"

namespace hvdlite {

void OperationContext::Phase(const std::vector<TensorEntry*>& entries, const char* phase, bool begin,
                             const std::string& args) const {
  if (timeline == nullptr || !timeline->active()) return;
  for (auto* e : entries) {
    if (begin) {
      timeline->Begin(TimelineRow(e->request), phase, args);
    } else {
      timeline->End(TimelineRow(e->request), phase, args);
    }
  }
}

Status OperationContext::Timed(TensorEntry& e, const char* activity,
                               const std::function<Status()>& run) const {
  Phase({&e}, activity, true);
  Status s = run();
  Phase({&e}, activity, false);
  return s;
}

void OperationContext::CompleteAllreduces(const std::vector<TensorEntry*>& entries,
                                          int64_t wire_bytes) const {
  const int64_t n = static_cast<int64_t>(entries.size());
  stats->Add(stats->tensors, n);
  if (n > 1) {
    stats->Add(stats->tensors_fused, n);
    stats->Add(stats->fused_buffers, 1);
  }
  if (flight && flight->enabled()) {  // before the handles complete: a caller reading the record sees the end
    FlightNote note(FlightEventKind::kCollectiveEnd);
    note.name = &entries[0]->request.name;
    note.op = static_cast<int>(OpType::kAllreduce);
    note.count = static_cast<int32_t>(n);
    note.bytes = wire_bytes;
    flight->Record(note);
  }
  for (auto* e : entries) {
    if (timeline && timeline->active()) {
      timeline->End(TimelineRow(e->request), OperationPhase(e->request),
                    "\"dtype\":\"" + std::string(DataTypeName(e->request.dtype)) + "\",\"shape\":\"" +
                        ShapeString(e->request.shape) + "\",\"fused\":" + std::to_string(n) +
                        ",\"wire_bytes\":" + std::to_string(wire_bytes));
    }
    e->work->Finish();
  }
}

bool Is16BitFloat(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

double PostFactor(const Request& q, int set_size) {
  double f = q.postscale;
  if (q.reduce_op == ReduceOp::kAverage) f /= set_size;
  return f;
}

int64_t RowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t BytesIn(const std::vector<TensorEntry*>& entries) {
  int64_t bytes = 0;
  for (auto* e : entries) {
    bytes += NumElements(e->request.shape) * static_cast<int64_t>(DataTypeSize(e->request.dtype));
  }
  return bytes;
}

Status OutOfMemory(const std::string& what, size_t bytes) {
  return Status::Error(ErrorKind::kInternal,
                       "could not allocate " + std::to_string(bytes) + " bytes for " + what);
}

CompressionSpec EffectiveCompression(const Request& q) {
  if (q.dtype == DataType::kFloat32) return q.compression;
  if (Is16BitFloat(q.dtype)) {
    const CompressorKind* kind = FindCompressorKind(q.compression.type);
    if (kind != nullptr && kind->takes_16bit_floats) return q.compression;
  }
  return CompressionSpec();
}

Segment SegmentOf(const TensorEntry& e, int64_t offset) {
  const auto& shape = e.request.shape;
  return Segment{e.request.name, offset, NumElements(shape), shape.size() >= 2 ? shape[0] : 0};
}

std::vector<Segment> OneSegment(const TensorEntry& e, int64_t count) {
  Segment s = SegmentOf(e, 0);
  s.count = count;
  return {s};
}

}  // namespace hvdlite
