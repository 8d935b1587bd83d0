#include "mpi_collectives.h"

#include <algorithm>
#include <climits>
#include <string>

#include "waiter.h"

namespace hvdlite {

namespace {

// Largest element count passed to one MPI call (MPI counts are int).
constexpr int64_t kMaxChunk = int64_t{1} << 30;

}  // namespace

MPI_Op MpiReduceOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return MPI_SUM;
    case ReduceOp::kAdasum:  // not element-wise: collectives/adasum.h
      return MPI_OP_NULL;
  }
  return MPI_SUM;
}

namespace {

bool FitsInt(const std::vector<int64_t>& v) {
  int64_t total = 0;
  for (int64_t x : v) total += x;
  return total <= INT_MAX;
}

std::vector<int> ToInt(const std::vector<int64_t>& v) { return std::vector<int>(v.begin(), v.end()); }

std::vector<int> Displacements(const std::vector<int64_t>& counts) {
  std::vector<int> displs(counts.size());
  int64_t offset = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    displs[i] = static_cast<int>(offset);
    offset += counts[i];
  }
  return displs;
}

Status TooLarge(const char* what) {
  return Status::InvalidArgument(std::string(what) +
                                 ": the data exceeds 2^31-1 bytes per call, which this MPI "
                                 "library (no MPI-4 large counts) cannot move; split the tensor");
}

}  // namespace

MPI_Datatype MpiReductionType(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUInt16: return MPI_UINT16_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;  // 16-bit floats are widened first
  }
}

MpiCollectives::MpiCollectives(MPI_Comm comm, const WaitPolicy& wait,
                               const std::atomic<bool>* abort)
    : comm_(comm), wait_(wait), abort_(abort) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Status MpiCollectives::Check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::OK();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return Status::Error(ErrorKind::kMpi, std::string(what) + " failed: " + std::string(text, len));
}

Status MpiCollectives::Wait(MPI_Request* request, const char* what) {
  return WaitUntil(wait_, abort_, what, [&](Status* error) {
    int done = 0;
    *error = Check(MPI_Test(request, &done, MPI_STATUS_IGNORE), what);
    return !error->ok() || done != 0;
  });
}

Status MpiCollectives::WaitAll(std::vector<MPI_Request>* requests, const char* what) {
  return WaitUntil(wait_, abort_, what, [&](Status* error) {
    int done = 0;
    *error = Check(MPI_Testall(static_cast<int>(requests->size()), requests->data(), &done,
                               MPI_STATUSES_IGNORE),
                   what);
    return !error->ok() || done != 0;
  });
}

Status MpiCollectives::Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) {
  MPI_Datatype type = MpiReductionType(dtype);
  if (type == MPI_DATATYPE_NULL) {
    return Status::Error(ErrorKind::kInternal,
                         std::string("no MPI reduction for ") + DataTypeName(dtype));
  }
  const size_t elem = DataTypeSize(dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  for (int64_t offset = 0; offset < count; offset += kMaxChunk) {
    int n = static_cast<int>(std::min(kMaxChunk, count - offset));
    MPI_Request req;
    Status s = Check(MPI_Iallreduce(MPI_IN_PLACE, bytes + offset * elem, n, type, MpiReduceOp(op), comm_,
                                    &req),
                     "MPI_Iallreduce");
    if (s.ok()) s = Wait(&req, "MPI_Iallreduce");
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status MpiCollectives::Broadcast(void* data, int64_t bytes, int root) {
  auto* p = static_cast<uint8_t*>(data);
  for (int64_t offset = 0; offset < bytes; offset += kMaxChunk) {
    int n = static_cast<int>(std::min(kMaxChunk, bytes - offset));
    MPI_Request req;
    Status s = Check(MPI_Ibcast(p + offset, n, MPI_BYTE, root, comm_, &req), "MPI_Ibcast");
    if (s.ok()) s = Wait(&req, "MPI_Ibcast");
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status MpiCollectives::Allgatherv(const void* input, int64_t input_bytes, void* output,
                                  const std::vector<int64_t>& bytes_per_rank) {
  MPI_Request req;
  Status s;
  if (FitsInt(bytes_per_rank)) {
    auto counts = ToInt(bytes_per_rank);
    auto displs = Displacements(bytes_per_rank);
    s = Check(MPI_Iallgatherv(input, static_cast<int>(input_bytes), MPI_BYTE, output,
                              counts.data(), displs.data(), MPI_BYTE, comm_, &req),
              "MPI_Iallgatherv");
  } else {
#if MPI_VERSION >= 4
    std::vector<MPI_Count> counts(bytes_per_rank.begin(), bytes_per_rank.end());
    std::vector<MPI_Aint> displs(counts.size());
    MPI_Aint offset = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      displs[i] = offset;
      offset += counts[i];
    }
    s = Check(MPI_Iallgatherv_c(input, input_bytes, MPI_BYTE, output, counts.data(),
                                displs.data(), MPI_BYTE, comm_, &req),
              "MPI_Iallgatherv_c");
#else
    return TooLarge("allgather");
#endif
  }
  if (s.ok()) s = Wait(&req, "MPI_Iallgatherv");
  return s;
}

Status MpiCollectives::Alltoallv(const void* input, const std::vector<int64_t>& send_bytes,
                                 void* output, const std::vector<int64_t>& recv_bytes) {
  MPI_Request req;
  Status s;
  if (FitsInt(send_bytes) && FitsInt(recv_bytes)) {
    auto scounts = ToInt(send_bytes);
    auto sdispls = Displacements(send_bytes);
    auto rcounts = ToInt(recv_bytes);
    auto rdispls = Displacements(recv_bytes);
    s = Check(MPI_Ialltoallv(input, scounts.data(), sdispls.data(), MPI_BYTE, output,
                             rcounts.data(), rdispls.data(), MPI_BYTE, comm_, &req),
              "MPI_Ialltoallv");
  } else {
#if MPI_VERSION >= 4
    auto to_c = [](const std::vector<int64_t>& v, std::vector<MPI_Count>* c,
                   std::vector<MPI_Aint>* d) {
      c->assign(v.begin(), v.end());
      d->resize(v.size());
      MPI_Aint offset = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        (*d)[i] = offset;
        offset += v[i];
      }
    };
    std::vector<MPI_Count> sc, rc;
    std::vector<MPI_Aint> sd, rd;
    to_c(send_bytes, &sc, &sd);
    to_c(recv_bytes, &rc, &rd);
    s = Check(MPI_Ialltoallv_c(input, sc.data(), sd.data(), MPI_BYTE, output, rc.data(),
                               rd.data(), MPI_BYTE, comm_, &req),
              "MPI_Ialltoallv_c");
#else
    return TooLarge("alltoall");
#endif
  }
  if (s.ok()) s = Wait(&req, "MPI_Ialltoallv");
  return s;
}

Status MpiCollectives::ReduceScatter(const void* input, void* output,
                                     const std::vector<int64_t>& counts, DataType dtype,
                                     ReduceOp op) {
  MPI_Datatype type = MpiReductionType(dtype);
  if (type == MPI_DATATYPE_NULL) {
    return Status::Error(ErrorKind::kInternal,
                         std::string("no MPI reduction for ") + DataTypeName(dtype));
  }
  MPI_Request req;
  Status s;
  if (FitsInt(counts)) {
    auto c = ToInt(counts);
    s = Check(MPI_Ireduce_scatter(input, output, c.data(), type, MpiReduceOp(op), comm_, &req),
              "MPI_Ireduce_scatter");
  } else {
#if MPI_VERSION >= 4
    std::vector<MPI_Count> c(counts.begin(), counts.end());
    s = Check(MPI_Ireduce_scatter_c(input, output, c.data(), type, MpiReduceOp(op), comm_, &req),
              "MPI_Ireduce_scatter_c");
#else
    return TooLarge("reducescatter");
#endif
  }
  if (s.ok()) s = Wait(&req, "MPI_Ireduce_scatter");
  return s;
}

Status MpiCollectives::ReduceScatter(const void* input, void* output,
                                     const std::vector<int64_t>& counts, MPI_Datatype type,
                                     MPI_Op op) {
  if (!FitsInt(counts)) return TooLarge("compressed reducescatter");
  auto c = ToInt(counts);
  MPI_Request req;
  Status s = Check(MPI_Ireduce_scatter(input, output, c.data(), type, op, comm_, &req),
                   "MPI_Ireduce_scatter");
  if (s.ok()) s = Wait(&req, "MPI_Ireduce_scatter");
  return s;
}

Status MpiCollectives::Barrier() {
  MPI_Request req;
  Status s = Check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
  if (s.ok()) s = Wait(&req, "MPI_Ibarrier");
  return s;
}

Status MpiCollectives::SendRecv(const void* send, int64_t send_bytes, void* recv,
                                int64_t recv_bytes, int peer, int tag) {
  // Chunks of at most kMaxChunk bytes, all posted at once: the peer posts the
  // same chunks in the same order, which MPI matches in order.
  std::vector<MPI_Request> requests;
  Status s;
  for (int64_t offset = 0; offset < recv_bytes && s.ok(); offset += kMaxChunk) {
    requests.emplace_back();
    s = Check(MPI_Irecv(static_cast<uint8_t*>(recv) + offset,
                        static_cast<int>(std::min(kMaxChunk, recv_bytes - offset)), MPI_BYTE, peer,
                        tag, comm_, &requests.back()),
              "MPI_Irecv");
  }
  for (int64_t offset = 0; offset < send_bytes && s.ok(); offset += kMaxChunk) {
    requests.emplace_back();
    s = Check(MPI_Isend(static_cast<const uint8_t*>(send) + offset,
                        static_cast<int>(std::min(kMaxChunk, send_bytes - offset)), MPI_BYTE, peer,
                        tag, comm_, &requests.back()),
              "MPI_Isend");
  }
  if (!s.ok()) return s;
  const std::string what = "MPI_Isend/MPI_Irecv with rank " + std::to_string(peer);
  return WaitAll(&requests, what.c_str());
}

Status MpiCollectives::StartAllreduce(const void* send, void* recv, int64_t count,
                                      MPI_Datatype type, MPI_Op op, MPI_Request* request) {
  // Callers keep buckets within one call; this guards against a silent
  // truncation of the count should that ever change.
  if (count > INT_MAX) return TooLarge("allreduce bucket");
  return Check(MPI_Iallreduce(send, recv, static_cast<int>(count), type, op, comm_, request),
               "MPI_Iallreduce");
}

Status MpiCollectives::StartAllgather(const void* send, int64_t bytes, void* recv,
                                      MPI_Request* request) {
  if (bytes > INT_MAX) return TooLarge("allgather of a compressed bucket");
  return Check(MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv,
                              static_cast<int>(bytes), MPI_BYTE, comm_, request),
               "MPI_Iallgather");
}

void MpiCollectives::Progress(MPI_Request* request) {
  if (*request == MPI_REQUEST_NULL) return;
  int done = 0;
  MPI_Test(request, &done, MPI_STATUS_IGNORE);
}

Status MpiCollectives::BitwiseAnd(uint64_t* words, int count) {
  MPI_Request req;
  Status s = Check(MPI_Iallreduce(MPI_IN_PLACE, words, count, MPI_UINT64_T, MPI_BAND, comm_, &req),
                   "MPI_Iallreduce(negotiation)");
  if (s.ok()) s = Wait(&req, "MPI_Iallreduce(negotiation)");
  return s;
}

Status MpiCollectives::GatherBytes(const std::vector<uint8_t>& mine, int root,
                                   std::vector<std::vector<uint8_t>>* all) {
  int my_size = static_cast<int>(mine.size());
  std::vector<int> sizes(rank_ == root ? size_ : 0);
  MPI_Request req;
  Status s = Check(MPI_Igather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, comm_, &req),
                   "MPI_Igather(negotiation)");
  if (s.ok()) s = Wait(&req, "MPI_Igather(negotiation)");
  if (!s.ok()) return s;
  std::vector<int> displs;
  std::vector<uint8_t> joined;
  if (rank_ == root) {
    displs.resize(size_);
    int total = 0;
    for (int i = 0; i < size_; ++i) {
      displs[i] = total;
      total += sizes[i];
    }
    joined.resize(static_cast<size_t>(total));
  }
  s = Check(MPI_Igatherv(mine.data(), my_size, MPI_BYTE, joined.data(), sizes.data(),
                         displs.data(), MPI_BYTE, root, comm_, &req),
            "MPI_Igatherv(negotiation)");
  if (s.ok()) s = Wait(&req, "MPI_Igatherv(negotiation)");
  if (!s.ok() || rank_ != root) return s;
  all->assign(size_, {});
  for (int i = 0; i < size_; ++i) {
    (*all)[i].assign(joined.begin() + displs[i], joined.begin() + displs[i] + sizes[i]);
  }
  return s;
}

Status MpiCollectives::BroadcastBytes(std::vector<uint8_t>* bytes, int root) {
  uint64_t n = bytes->size();
  MPI_Request req;
  Status s = Check(MPI_Ibcast(&n, 1, MPI_UINT64_T, root, comm_, &req), "MPI_Ibcast(negotiation)");
  if (s.ok()) s = Wait(&req, "MPI_Ibcast(negotiation)");
  if (!s.ok()) return s;
  bytes->resize(n);
  return Broadcast(bytes->data(), static_cast<int64_t>(n), root);
}

}  // namespace hvdlite
