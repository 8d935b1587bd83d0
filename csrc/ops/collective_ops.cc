#include "ops/collective_ops.h"

#include <algorithm>
#include <cstring>

#include "kernels/scale.h"
#include "timeline/timeline_names.h"

namespace hvdlite {

namespace {

// The handle's result: `rows` rows of the input's row size, in the engine's
// memory (the front end copies it out).
Status AllocateOutput(TensorEntry& e, int64_t rows, size_t elem_bytes) {
  const Request& q = e.request;
  const size_t bytes = static_cast<size_t>(rows * RowElements(q.shape)) * elem_bytes;
  if (!e.work->output.Allocate(bytes)) return OutOfMemory("the result of '" + q.name + "'", bytes);
  e.work->output_shape = q.shape;
  e.work->output_shape[0] = rows;
  return Status::OK();
}

Status CompressedReducescatter(OperationContext& ctx, ProcessSet& set, TensorEntry& e,
                               const Response& response, const std::vector<int64_t>& counts);

}  // namespace

Status RunAllgather(OperationContext& ctx, ProcessSet& set, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int64_t row_bytes = RowElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  std::vector<int64_t> bytes_per_rank;
  int64_t total_rows = 0;
  for (int64_t rows : response.rows_per_rank) {
    bytes_per_rank.push_back(rows * row_bytes);
    total_rows += rows;
  }
  Status s = AllocateOutput(e, total_rows, DataTypeSize(q.dtype));
  if (!s.ok()) return s;
  ctx.stats->Add(ctx.stats->collectives, 1);
  Transport& wire = set.transport();
  return ctx.Timed(e, wire.Activity(OpType::kAllgather), [&] {
    return wire.Allgatherv(e.input, bytes_per_rank[set.rank()], e.work->output.data(), bytes_per_rank);
  });
}

Status RunBroadcast(OperationContext& ctx, ProcessSet& set, TensorEntry& e) {
  const Request& q = e.request;
  const int64_t bytes = NumElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  if (set.rank() == q.root_rank) CopyScaled(e.input, e.output, bytes, DataType::kUInt8, 1.0);
  ctx.stats->Add(ctx.stats->collectives, 1);
  Transport& wire = set.transport();
  return ctx.Timed(e, wire.Activity(OpType::kBroadcast),
                   [&] { return wire.Broadcast(e.output, bytes, q.root_rank); });
}

Status RunAlltoall(OperationContext& ctx, ProcessSet& set, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int size = set.size();
  const int me = set.rank();
  const int64_t row_bytes = RowElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  std::vector<int64_t> send_bytes(size), recv_bytes(size);
  e.work->received_splits.assign(size, 0);
  int64_t recv_rows = 0;
  for (int r = 0; r < size; ++r) {
    send_bytes[r] = response.splits_matrix[static_cast<size_t>(me) * size + r] * row_bytes;
    const int64_t rows = response.splits_matrix[static_cast<size_t>(r) * size + me];
    e.work->received_splits[r] = rows;
    recv_bytes[r] = rows * row_bytes;
    recv_rows += rows;
  }
  Status s = AllocateOutput(e, recv_rows, DataTypeSize(q.dtype));
  if (!s.ok()) return s;
  ctx.stats->Add(ctx.stats->collectives, 1);
  Transport& wire = set.transport();
  return ctx.Timed(e, wire.Activity(OpType::kAlltoall), [&] {
    return wire.Alltoallv(e.input, send_bytes, e.work->output.data(), recv_bytes);
  });
}

Status RunReducescatter(OperationContext& ctx, ProcessSet& set, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int me = set.rank();
  const int64_t row_elems = RowElements(q.shape);
  std::vector<int64_t> counts;
  for (int64_t rows : response.rows_per_rank) counts.push_back(rows * row_elems);
  ctx.stats->Add(ctx.stats->collectives, 1);
  if (EffectiveCompression(q).type != CompressionType::kNone) {
    return CompressedReducescatter(ctx, set, e, response, counts);
  }
  Status s = AllocateOutput(e, response.rows_per_rank[me], DataTypeSize(q.dtype));
  if (!s.ok()) return s;
  const int64_t my_count = counts[me];
  const double post = PostFactor(q, set.size());
  const int64_t count = NumElements(q.shape);
  void* out = e.work->output.data();
  Transport& wire = set.transport();
  const char* what = wire.Activity(OpType::kReducescatter);
  if (Is16BitFloat(q.dtype)) {
    // Summed in float32, rounded once.
    ctx.scratch_in.resize(static_cast<size_t>(count));
    ctx.scratch_out.resize(static_cast<size_t>(my_count));
    WidenToFloat(e.input, ctx.scratch_in.data(), count, q.dtype, q.prescale);
    s = ctx.Timed(e, what, [&] {
      return wire.ReduceScatter(ctx.scratch_in.data(), ctx.scratch_out.data(), counts, DataType::kFloat32,
                                q.reduce_op);
    });
    if (s.ok()) NarrowFromFloat(ctx.scratch_out.data(), out, my_count, q.dtype, post);
    return s;
  }
  const void* input = e.input;
  std::vector<uint8_t> scaled;
  if (q.prescale != 1.0) {
    scaled.resize(static_cast<size_t>(count) * DataTypeSize(q.dtype));
    CopyScaled(e.input, scaled.data(), count, q.dtype, q.prescale);
    input = scaled.data();
  }
  s = ctx.Timed(e, what, [&] { return wire.ReduceScatter(input, out, counts, q.dtype, q.reduce_op); });
  if (s.ok() && post != 1.0) CopyScaled(out, out, my_count, q.dtype, post);
  return s;
}

namespace {

// float32 only (validation): the compressor's wire form crosses the wire,
// summed as its element type (fp16), or gathered and summed here (top-k).
Status CompressedReducescatter(OperationContext& ctx, ProcessSet& set, TensorEntry& e,
                               const Response& response, const std::vector<int64_t>& counts) {
  const Request& q = e.request;
  const int size = set.size();
  const int me = set.rank();
  Compressor* c = ctx.compressors.For(EffectiveCompression(q));
  const int64_t count = NumElements(q.shape);
  int64_t my_start = 0;
  for (int r = 0; r < me; ++r) my_start += counts[r];
  const int64_t my_count = counts[me];
  Status s = AllocateOutput(e, response.rows_per_rank[me], sizeof(float));
  if (!s.ok()) return s;
  auto* out = static_cast<float*>(e.work->output.data());
  const float* src = static_cast<const float*>(e.input);
  if (q.prescale != 1.0) {
    ctx.scratch_in.resize(static_cast<size_t>(count));
    CopyScaled(src, ctx.scratch_in.data(), count, DataType::kFloat32, q.prescale);
    src = ctx.scratch_in.data();
  }
  const auto segs = OneSegment(e, count);
  c->BeginRound(segs);
  const size_t wire_bytes = c->CompressedBytes(segs);
  uint8_t* staged = ctx.buffers.Get(FusionBuffer::kSend, 0, wire_bytes);
  if (!staged) return OutOfMemory("a compression buffer", wire_bytes);
  c->Compress(src, segs, staged);
  Transport& wire = set.transport();
  if (c->wire() == Compressor::Wire::kAllreduce) {
    ctx.stats->Add(WireBytes(ctx.stats, q.compression.type), static_cast<int64_t>(wire_bytes));
    const size_t unit = wire_bytes / static_cast<size_t>(std::max<int64_t>(count, 1));
    uint8_t* mine = ctx.buffers.Get(FusionBuffer::kGather, 0, static_cast<size_t>(my_count) * unit + 64);
    if (!mine) return OutOfMemory("a compression buffer", static_cast<size_t>(my_count) * unit);
    s = ctx.Timed(e, wire.Activity(OpType::kReducescatter), [&] {
      return wire.ReduceScatter(staged, mine, counts, c->wire_dtype(), ReduceOp::kSum);
    });
    if (s.ok()) c->Decompress(mine, {Segment{q.name, 0, my_count}}, out);
  } else {
    ctx.stats->Add(WireBytes(ctx.stats, q.compression.type), static_cast<int64_t>(wire_bytes));
    uint8_t* gathered = ctx.buffers.Get(FusionBuffer::kGather, 0, wire_bytes * size);
    if (!gathered) return OutOfMemory("a gather buffer", wire_bytes * size);
    s = ctx.Timed(e, wire.Activity(OpType::kAllgather), [&] {
      std::unique_ptr<TransportWork> work;
      Status started = wire.StartAllgather(staged, static_cast<int64_t>(wire_bytes), gathered, &work);
      return started.ok() ? work->Wait() : started;
    });
    if (s.ok()) {
      ctx.scratch_out.assign(static_cast<size_t>(count), 0.0f);
      for (int r = 0; r < size; ++r) {
        c->DecompressAdd(gathered + static_cast<size_t>(r) * wire_bytes, segs, ctx.scratch_out.data());
      }
      std::memcpy(out, ctx.scratch_out.data() + my_start, static_cast<size_t>(my_count) * sizeof(float));
    }
  }
  const double post = PostFactor(q, size);
  if (s.ok() && post != 1.0) CopyScaled(out, out, my_count, DataType::kFloat32, post);
  return s;
}

}  // namespace

}  // namespace hvdlite
