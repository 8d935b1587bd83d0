#include "ops/collective_ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/scale.h"
#include "allreduce/compressed_wire.h"
#include "timeline/timeline_names.h"

namespace hvdlite {

namespace {

// Where the handle's result goes (`*out`): `rows` rows of the input's row
// size, into the caller's output where it holds exactly that many bytes (no
// allocation, no copy out: FSDP2's all-gathers and reduce-scatters), else into
// memory the engine allocates and the front end takes.
Status ResultBuffer(TensorEntry& e, int64_t rows, size_t elem_bytes, void** out) {
  const Request& q = e.request;
  const size_t bytes = static_cast<size_t>(rows * RowElements(q.shape)) * elem_bytes;
  e.work->output_shape = q.shape;
  e.work->output_shape[0] = rows;
  if (e.output_bytes > 0 && static_cast<size_t>(e.output_bytes) == bytes) {
    *out = e.output;
    return Status::OK();
  }
  if (!e.work->output.Allocate(bytes)) return OutOfMemory("the result of '" + q.name + "'", bytes);
  *out = e.work->output.data();
  return Status::OK();
}

// Moves the input out of the result's way: where the caller's output holds
// the input (FSDP2 gathers into the tensor its input is a slice of; MPI
// forbids aliased buffers), the input is copied to a staging buffer first.
Status KeepInputApart(OperationContext& ctx, TensorEntry& e, size_t in_bytes, const void* out, size_t out_bytes) {
  const auto in_lo = reinterpret_cast<uintptr_t>(e.input);
  const auto out_lo = reinterpret_cast<uintptr_t>(out);
  if (in_bytes == 0 || out_bytes == 0 || in_lo >= out_lo + out_bytes || out_lo >= in_lo + in_bytes) {
    return Status::OK();
  }
  // Slot 1 of the send buffers: free outside the allreduces, and apart from
  // what a compressed reducescatter stages in slot 0.
  uint8_t* staged = ctx.buffers.Get(FusionBuffer::kSend, 1, in_bytes);
  if (!staged) return OutOfMemory("a copy of the input of '" + e.request.name + "'", in_bytes);
  std::memcpy(staged, e.input, in_bytes);
  e.input = staged;
  return Status::OK();
}

Status CompressedReducescatter(OperationContext& ctx, Transport& wire, TensorEntry& e,
                               const Response& response, const std::vector<int64_t>& counts, void* result);

}  // namespace

Status RunAllgather(OperationContext& ctx, Transport& wire, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int64_t row_bytes = RowElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  std::vector<int64_t> bytes_per_rank;
  int64_t total_rows = 0;
  for (int64_t rows : response.rows_per_rank) {
    bytes_per_rank.push_back(rows * row_bytes);
    total_rows += rows;
  }
  void* out = nullptr;
  Status s = ResultBuffer(e, total_rows, DataTypeSize(q.dtype), &out);
  if (s.ok()) s = KeepInputApart(ctx, e, bytes_per_rank[wire.rank()], out, total_rows * row_bytes);
  if (!s.ok()) return s;
  ctx.stats->Add(ctx.stats->collectives, 1);
  return ctx.Timed(e, wire.Activity(OpType::kAllgather), [&] {
    return wire.Allgatherv(e.input, bytes_per_rank[wire.rank()], out, bytes_per_rank);
  });
}

Status RunBroadcast(OperationContext& ctx, Transport& wire, TensorEntry& e) {
  const Request& q = e.request;
  const int64_t bytes = NumElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  if (wire.rank() == q.root_rank) CopyScaled(e.input, e.output, bytes, DataType::kUInt8, 1.0);
  ctx.stats->Add(ctx.stats->collectives, 1);
  return ctx.Timed(e, wire.Activity(OpType::kBroadcast),
                   [&] { return wire.Broadcast(e.output, bytes, q.root_rank); });
}

Status RunAlltoall(OperationContext& ctx, Transport& wire, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int size = wire.size();
  const int me = wire.rank();
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
  int64_t sent = 0;
  for (int64_t b : send_bytes) sent += b;
  void* out = nullptr;
  Status s = ResultBuffer(e, recv_rows, DataTypeSize(q.dtype), &out);
  if (s.ok()) s = KeepInputApart(ctx, e, sent, out, recv_rows * row_bytes);
  if (!s.ok()) return s;
  ctx.stats->Add(ctx.stats->collectives, 1);
  return ctx.Timed(e, wire.Activity(OpType::kAlltoall), [&] {
    return wire.Alltoallv(e.input, send_bytes, out, recv_bytes);
  });
}

Status RunReducescatter(OperationContext& ctx, Transport& wire, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int me = wire.rank();
  const int64_t row_elems = RowElements(q.shape);
  std::vector<int64_t> counts;
  for (int64_t rows : response.rows_per_rank) counts.push_back(rows * row_elems);
  ctx.stats->Add(ctx.stats->collectives, 1);
  const int64_t count = NumElements(q.shape);
  void* out = nullptr;
  Status s = ResultBuffer(e, response.rows_per_rank[me], DataTypeSize(q.dtype), &out);
  if (s.ok()) {
    s = KeepInputApart(ctx, e, static_cast<size_t>(count) * DataTypeSize(q.dtype), out,
                       static_cast<size_t>(counts[me]) * DataTypeSize(q.dtype));
  }
  if (!s.ok()) return s;
  if (EffectiveCompression(q).type != CompressionType::kNone) {
    return CompressedReducescatter(ctx, wire, e, response, counts, out);
  }
  const int64_t my_count = counts[me];
  const double post = PostFactor(q, wire.size());
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

// The float32 values a compressor reads: the input, or a 16-bit float input
// widened into ctx.scratch_in with the prescale applied (then *prescale = 1).
const float* CompressorInput(OperationContext& ctx, const TensorEntry& e, int64_t count, double* prescale) {
  if (!Is16BitFloat(e.request.dtype)) return static_cast<const float*>(e.input);
  ctx.scratch_in.resize(static_cast<size_t>(count));
  WidenToFloat(e.input, ctx.scratch_in.data(), count, e.request.dtype, *prescale);
  *prescale = 1.0;
  return ctx.scratch_in.data();
}

// float32, or 16-bit floats for a compressor that takes them (widened, and
// the result narrowed once): the compressor's wire form crosses the wire,
// summed as its element type (fp16), or gathered and summed here (top-k).
// `result`: where this rank's block goes (ResultBuffer).
Status CompressedReducescatter(OperationContext& ctx, Transport& wire, TensorEntry& e,
                               const Response& response, const std::vector<int64_t>& counts, void* result) {
  const Request& q = e.request;
  const int size = wire.size();
  const int me = wire.rank();
  Compressor* c = ctx.compressors.For(EffectiveCompression(q));
  const int64_t count = NumElements(q.shape);
  int64_t my_start = 0;
  for (int r = 0; r < me; ++r) my_start += counts[r];
  const int64_t my_count = counts[me];
  Status s;
  const bool widened = Is16BitFloat(q.dtype);
  std::vector<float> wide_out;  // the float32 result of a widened tensor
  if (widened) wide_out.resize(static_cast<size_t>(my_count));
  auto* out = widened ? wide_out.data() : static_cast<float*>(result);
  double prescale = q.prescale;
  const float* input = CompressorInput(ctx, e, count, &prescale);
  const auto segs = OneSegment(e, count);
  c->BeginRound(segs);
  CompressedForms forms;
  forms.bytes = c->CompressedBytes(segs);
  forms.ranks = size;
  forms.mine = ctx.buffers.Get(FusionBuffer::kSend, 0, forms.bytes);
  if (!forms.mine) return OutOfMemory("a compression buffer", forms.bytes);
  CompressScaled(*c, input, count, prescale, segs, forms.mine, &ctx.scratch_in);
  ctx.stats->Add(WireBytes(ctx.stats, q.compression.type), static_cast<int64_t>(forms.bytes));
  if (!GathersForms(*c)) {
    // Summed as the wire type, each rank keeps its block only.
    const size_t unit = forms.bytes / static_cast<size_t>(std::max<int64_t>(count, 1));
    uint8_t* summed = ctx.buffers.Get(FusionBuffer::kGather, 0, static_cast<size_t>(my_count) * unit + 64);
    if (!summed) return OutOfMemory("a compression buffer", static_cast<size_t>(my_count) * unit);
    s = ctx.Timed(e, wire.Activity(OpType::kReducescatter), [&] {
      return wire.ReduceScatter(forms.mine, summed, counts, c->wire_dtype(), ReduceOp::kSum);
    });
    forms.mine = summed;
    if (s.ok()) DecodeCompressedSum(*c, forms, 0, {Segment{q.name, 0, my_count}}, my_count, out);
  } else {
    forms.gathered = ctx.buffers.Get(FusionBuffer::kGather, 0, forms.bytes * size);
    if (!forms.gathered) return OutOfMemory("a gather buffer", forms.bytes * size);
    s = ctx.Timed(e, CompressedActivity(wire, *c), [&] {
      std::unique_ptr<TransportWork> work;
      Status started = StartCompressedExchange(wire, *c, forms, &work);
      return started.ok() ? work->Wait() : started;
    });
    if (s.ok()) {  // every rank's whole sum, then this rank's block of it
      ctx.scratch_out.resize(static_cast<size_t>(count));
      DecodeCompressedSum(*c, forms, 0, segs, count, ctx.scratch_out.data());
      std::memcpy(out, ctx.scratch_out.data() + my_start, static_cast<size_t>(my_count) * sizeof(float));
    }
  }
  const double post = PostFactor(q, size);
  if (s.ok() && widened) NarrowFromFloat(out, result, my_count, q.dtype, post);
  if (s.ok() && !widened && post != 1.0) CopyScaled(out, out, my_count, DataType::kFloat32, post);
  return s;
}

}  // namespace

}  // namespace hvdlite
