#include "operations.h"

#include "scale.h"

namespace hvdlite {

namespace {

bool Is16BitFloat(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

// Average is a Sum whose result is scaled by 1/size after the wire.
double PostFactor(const Request& q, int size) {
  double f = q.postscale;
  if (q.reduce_op == ReduceOp::kAverage) f /= size;
  return f;
}

int64_t RowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

Status OutOfMemory(const TensorEntry& e, size_t bytes) {
  return Status::Error(ErrorKind::kInternal, "could not allocate " + std::to_string(bytes) +
                                                 " bytes for the result of '" +
                                                 e.request.name + "'");
}

}  // namespace

Status OperationRunner::Run(ProcessSet& set, const Response& response) {
  Status fatal;
  for (const auto& name : response.names) {
    TensorEntry entry;
    if (!set.queue().Take(name, &entry)) {
      return Status::Error(ErrorKind::kInternal,
                           "negotiated tensor '" + name + "' is not in this rank's queue");
    }
    if (response.kind == Response::Kind::kError) {
      entry.work->Fail(Status::Error(ErrorKind::kMismatch, response.error));
      continue;
    }
    Status s;
    switch (response.op) {
      case OpType::kAllreduce: s = Allreduce(set, entry); break;
      case OpType::kAllgather: s = Allgather(set, entry, response); break;
      case OpType::kBroadcast: s = Broadcast(set, entry); break;
      case OpType::kAlltoall: s = Alltoall(set, entry, response); break;
      case OpType::kReducescatter: s = Reducescatter(set, entry, response); break;
      case OpType::kBarrier: s = set.mpi().Barrier(); break;
      default:
        s = Status::Error(ErrorKind::kInternal, "unexpected operation in response");
    }
    if (s.ok()) {
      entry.work->Finish();
    } else {
      entry.work->Fail(s);
      if (s.kind() == ErrorKind::kMpi || s.kind() == ErrorKind::kShutdown) fatal = s;
    }
    if (!fatal.ok()) return fatal;
  }
  return fatal;
}

Status OperationRunner::Allreduce(ProcessSet& set, TensorEntry& e) {
  const Request& q = e.request;
  const int64_t count = NumElements(q.shape);
  const double post = PostFactor(q, set.size());
  if (count == 0) return Status::OK();
  if (Is16BitFloat(q.dtype)) {
    // Reduce in float32 so a float16 sum is as exact as summing in float32
    // and rounding once.
    widened_.resize(static_cast<size_t>(count));
    WidenToFloat(e.input, widened_.data(), count, q.dtype, q.prescale);
    Status s = set.mpi().Allreduce(widened_.data(), count, DataType::kFloat32, q.reduce_op);
    if (!s.ok()) return s;
    NarrowFromFloat(widened_.data(), e.output, count, q.dtype, post);
    return s;
  }
  CopyScaled(e.input, e.output, count, q.dtype, q.prescale);
  Status s = set.mpi().Allreduce(e.output, count, q.dtype, q.reduce_op);
  if (s.ok() && post != 1.0) CopyScaled(e.output, e.output, count, q.dtype, post);
  return s;
}

Status OperationRunner::Broadcast(ProcessSet& set, TensorEntry& e) {
  const Request& q = e.request;
  const int64_t bytes = NumElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  if (set.rank() == q.root_rank) CopyScaled(e.input, e.output, bytes, DataType::kUInt8, 1.0);
  return set.mpi().Broadcast(e.output, bytes, q.root_rank);
}

Status OperationRunner::Allgather(ProcessSet& set, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int64_t row_bytes = RowElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  std::vector<int64_t> bytes_per_rank;
  int64_t total_rows = 0;
  for (int64_t rows : response.sizes) {
    bytes_per_rank.push_back(rows * row_bytes);
    total_rows += rows;
  }
  const size_t total_bytes = static_cast<size_t>(total_rows * row_bytes);
  if (!e.work->output.Allocate(total_bytes)) return OutOfMemory(e, total_bytes);
  e.work->output_shape = q.shape.empty() ? std::vector<int64_t>{total_rows} : q.shape;
  e.work->output_shape[0] = total_rows;
  const int me = set.rank();
  return set.mpi().Allgatherv(e.input, bytes_per_rank[me], e.work->output.data(), bytes_per_rank);
}

Status OperationRunner::Alltoall(ProcessSet& set, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int size = set.size();
  const int me = set.rank();
  const int64_t row_bytes = RowElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  std::vector<int64_t> send_bytes(size), recv_bytes(size);
  e.work->received_splits.assign(size, 0);
  int64_t recv_rows = 0;
  for (int r = 0; r < size; ++r) {
    send_bytes[r] = response.sizes[static_cast<size_t>(me) * size + r] * row_bytes;
    const int64_t rows = response.sizes[static_cast<size_t>(r) * size + me];
    e.work->received_splits[r] = rows;
    recv_bytes[r] = rows * row_bytes;
    recv_rows += rows;
  }
  const size_t total_bytes = static_cast<size_t>(recv_rows * row_bytes);
  if (!e.work->output.Allocate(total_bytes)) return OutOfMemory(e, total_bytes);
  e.work->output_shape = q.shape;
  e.work->output_shape[0] = recv_rows;
  return set.mpi().Alltoallv(e.input, send_bytes, e.work->output.data(), recv_bytes);
}

Status OperationRunner::Reducescatter(ProcessSet& set, TensorEntry& e, const Response& response) {
  const Request& q = e.request;
  const int me = set.rank();
  const int64_t row_elems = RowElements(q.shape);
  std::vector<int64_t> counts;
  for (int64_t rows : response.sizes) counts.push_back(rows * row_elems);
  const int64_t my_count = counts[me];
  const size_t elem = DataTypeSize(q.dtype);
  if (!e.work->output.Allocate(static_cast<size_t>(my_count) * elem)) {
    return OutOfMemory(e, static_cast<size_t>(my_count) * elem);
  }
  e.work->output_shape = q.shape;
  e.work->output_shape[0] = response.sizes[me];
  const double post = PostFactor(q, set.size());
  const int64_t count = NumElements(q.shape);
  void* out = e.work->output.data();
  if (Is16BitFloat(q.dtype)) {
    widened_.resize(static_cast<size_t>(count));
    widened_out_.resize(static_cast<size_t>(my_count));
    WidenToFloat(e.input, widened_.data(), count, q.dtype, q.prescale);
    Status s = set.mpi().ReduceScatter(widened_.data(), widened_out_.data(), counts,
                                       DataType::kFloat32, q.reduce_op);
    if (s.ok()) NarrowFromFloat(widened_out_.data(), out, my_count, q.dtype, post);
    return s;
  }
  const void* input = e.input;
  std::vector<uint8_t> scaled;
  if (q.prescale != 1.0) {
    scaled.resize(static_cast<size_t>(count) * elem);
    CopyScaled(e.input, scaled.data(), count, q.dtype, q.prescale);
    input = scaled.data();
  }
  Status s = set.mpi().ReduceScatter(input, out, counts, q.dtype, q.reduce_op);
  if (s.ok() && post != 1.0) CopyScaled(out, out, my_count, q.dtype, post);
  return s;
}

}  // namespace hvdlite
