#include "transport/mpi/mpi_transport.h"

#include <algorithm>
#include <climits>
#include <mutex>
#include <string>

#include "kernels/reduce_kernels.h"
#include "kernels/scale.h"
#include "timeline/timeline_names.h"
#include "transport/waiter.h"

namespace hvdlite {

namespace {

// Largest element count passed to one MPI call (MPI counts are int).
constexpr int64_t kMaxChunk = int64_t{1} << 30;

}  // namespace

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

Status MpiCheck(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::OK();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return Status::Error(ErrorKind::kMpi, std::string(what) + " failed: " + std::string(text, len));
}

namespace {

MPI_Op BuiltinOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    default: return MPI_SUM;  // Sum and Average (a Sum plus a scale)
  }
}

// MPI user function for 16-bit floats: MPI may hand it any chunk of the
// buffer, possibly as a contiguous type of halves.
template <DataType kType, ReduceOp kOp>
void Reduce16Function(void* in, void* inout, int* len, MPI_Datatype* datatype) {
  int64_t n = *len;
  if (*datatype != MPI_UINT16_T) {
    int bytes = 0;
    MPI_Type_size(*datatype, &bytes);
    n = n * bytes / static_cast<int64_t>(sizeof(uint16_t));
  }
  ReduceInto(in, inout, n, kType, kOp);
}

template <DataType kType>
MPI_User_function* Reduce16For(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return &Reduce16Function<kType, ReduceOp::kMin>;
    case ReduceOp::kMax: return &Reduce16Function<kType, ReduceOp::kMax>;
    case ReduceOp::kProduct: return &Reduce16Function<kType, ReduceOp::kProduct>;
    default: return &Reduce16Function<kType, ReduceOp::kSum>;
  }
}

// User ops are created once (under a lock: several engines may share the
// process in tests) and never freed: MPI_Finalize releases them.
MPI_Op Reduce16Op(DataType dtype, ReduceOp op) {
  static std::mutex mu;
  static MPI_Op ops[2][4] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                             {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
  const int t = dtype == DataType::kFloat16 ? 0 : 1;
  const int o = op == ReduceOp::kMin ? 1 : op == ReduceOp::kMax ? 2 : op == ReduceOp::kProduct ? 3 : 0;
  std::lock_guard<std::mutex> lock(mu);
  if (ops[t][o] != MPI_OP_NULL) return ops[t][o];
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return MPI_OP_NULL;
  MPI_User_function* f = t == 0 ? Reduce16For<DataType::kFloat16>(op) : Reduce16For<DataType::kBFloat16>(op);
  if (MPI_Op_create(f, /*commute=*/1, &ops[t][o]) != MPI_SUCCESS) ops[t][o] = MPI_OP_NULL;
  return ops[t][o];
}

// A started nonblocking call; Wait applies the scale the caller asked for.
class MpiWork : public TransportWork {
 public:
  MpiWork(MpiTransport* transport, const char* activity, void* recv, int64_t count, DataType dtype,
          double scale)
      : transport_(transport), activity_(activity), recv_(recv), count_(count), dtype_(dtype),
        scale_(scale) {}
  MPI_Request* request() { return &request_; }
  Status Wait() override {
    Status s = transport_->Wait(&request_, activity_);
    if (s.ok() && scale_ != 1.0) CopyScaled(recv_, recv_, count_, dtype_, scale_);
    return s;
  }
  void Progress() override {
    if (request_ == MPI_REQUEST_NULL) return;
    int done = 0;
    MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
  }

 private:
  MpiTransport* transport_;
  const char* activity_;
  void* recv_;
  int64_t count_;
  DataType dtype_;
  double scale_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

const void* MpiSend(const void* send) { return send == Transport::kInPlace ? MPI_IN_PLACE : send; }

}  // namespace

bool MpiReduction(DataType dtype, ReduceOp op, MPI_Datatype* type, MPI_Op* mpi_op) {
  if (!ElementwiseReducible(dtype, op)) return false;
  switch (dtype) {
    case DataType::kUInt8: *type = MPI_UINT8_T; break;
    case DataType::kInt8: *type = MPI_INT8_T; break;
    case DataType::kUInt16: *type = MPI_UINT16_T; break;
    case DataType::kInt16: *type = MPI_INT16_T; break;
    case DataType::kInt32: *type = MPI_INT32_T; break;
    case DataType::kInt64: *type = MPI_INT64_T; break;
    case DataType::kFloat32: *type = MPI_FLOAT; break;
    case DataType::kFloat64: *type = MPI_DOUBLE; break;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      *type = MPI_UINT16_T;
      *mpi_op = Reduce16Op(dtype, op);
      return *mpi_op != MPI_OP_NULL;
    default: return false;
  }
  *mpi_op = BuiltinOp(op);
  return true;
}

bool MpiTransport::Supports(DataType dtype, ReduceOp op) const { return ElementwiseReducible(dtype, op); }

const char* MpiTransport::Activity(OpType op, DataType, ReduceOp reduce) const {
  switch (op) {
    case OpType::kAllreduce:
      return reduce == ReduceOp::kAdasum ? activity::kMpiAdasumAllreduce : activity::kMpiAllreduce;
    case OpType::kAllgather: return activity::kMpiAllgather;
    case OpType::kBroadcast: return activity::kMpiBcast;
    case OpType::kAlltoall: return activity::kMpiAlltoall;
    case OpType::kReducescatter: return activity::kMpiReducescatter;
    default: return "MPI";
  }
}

namespace {

Status NoReduction(DataType dtype, ReduceOp op) {
  return Status::Error(ErrorKind::kInternal, std::string("no MPI reduction of ") + DataTypeName(dtype) +
                                                 " with " + ReduceOpName(op));
}

}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm, const WaitPolicy& wait, const WaitPolicy& negotiation_wait,
                           const AbortSignal* abort)
    : comm_(comm), wait_(wait), negotiation_wait_(negotiation_wait), abort_(abort) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Status MpiTransport::WaitUnder(const WaitPolicy& policy, MPI_Request* request, const char* what) {
  return WaitUntil(policy, abort_, what, [&](Status* error) {
    int done = 0;
    *error = MpiCheck(MPI_Test(request, &done, MPI_STATUS_IGNORE), what);
    return !error->ok() || done != 0;
  });
}

Status MpiTransport::WaitAll(std::vector<MPI_Request>* requests, const char* what) {
  return WaitUntil(wait_, abort_, what, [&](Status* error) {
    int done = 0;
    *error = MpiCheck(MPI_Testall(static_cast<int>(requests->size()), requests->data(), &done,
                               MPI_STATUSES_IGNORE),
                   what);
    return !error->ok() || done != 0;
  });
}

Status MpiTransport::Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) {
  MPI_Datatype type;
  MPI_Op mpi_op;
  if (!MpiReduction(dtype, op, &type, &mpi_op)) return NoReduction(dtype, op);
  const size_t elem = DataTypeSize(dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  for (int64_t offset = 0; offset < count; offset += kMaxChunk) {
    int n = static_cast<int>(std::min(kMaxChunk, count - offset));
    MPI_Request req;
    Status s = MpiCheck(MPI_Iallreduce(MPI_IN_PLACE, bytes + offset * elem, n, type, mpi_op, comm_, &req),
                     "MPI_Iallreduce");
    if (s.ok()) s = Wait(&req, "MPI_Iallreduce");
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status MpiTransport::Broadcast(void* data, int64_t bytes, int root) {
  return BroadcastUnder(wait_, data, bytes, root);
}

Status MpiTransport::BroadcastUnder(const WaitPolicy& policy, void* data, int64_t bytes, int root) {
  auto* p = static_cast<uint8_t*>(data);
  for (int64_t offset = 0; offset < bytes; offset += kMaxChunk) {
    int n = static_cast<int>(std::min(kMaxChunk, bytes - offset));
    MPI_Request req;
    Status s = MpiCheck(MPI_Ibcast(p + offset, n, MPI_BYTE, root, comm_, &req), "MPI_Ibcast");
    if (s.ok()) s = WaitUnder(policy, &req, "MPI_Ibcast");
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status MpiTransport::Allgatherv(const void* input, int64_t input_bytes, void* output,
                                  const std::vector<int64_t>& bytes_per_rank) {
  MPI_Request req;
  Status s;
  if (FitsInt(bytes_per_rank)) {
    auto counts = ToInt(bytes_per_rank);
    auto displs = Displacements(bytes_per_rank);
    s = MpiCheck(MPI_Iallgatherv(input, static_cast<int>(input_bytes), MPI_BYTE, output,
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
    s = MpiCheck(MPI_Iallgatherv_c(input, input_bytes, MPI_BYTE, output, counts.data(),
                                displs.data(), MPI_BYTE, comm_, &req),
              "MPI_Iallgatherv_c");
#else
    return TooLarge("allgather");
#endif
  }
  if (s.ok()) s = Wait(&req, "MPI_Iallgatherv");
  return s;
}

Status MpiTransport::Alltoallv(const void* input, const std::vector<int64_t>& send_bytes,
                                 void* output, const std::vector<int64_t>& recv_bytes) {
  MPI_Request req;
  Status s;
  if (FitsInt(send_bytes) && FitsInt(recv_bytes)) {
    auto scounts = ToInt(send_bytes);
    auto sdispls = Displacements(send_bytes);
    auto rcounts = ToInt(recv_bytes);
    auto rdispls = Displacements(recv_bytes);
    s = MpiCheck(MPI_Ialltoallv(input, scounts.data(), sdispls.data(), MPI_BYTE, output,
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
    s = MpiCheck(MPI_Ialltoallv_c(input, sc.data(), sd.data(), MPI_BYTE, output, rc.data(),
                               rd.data(), MPI_BYTE, comm_, &req),
              "MPI_Ialltoallv_c");
#else
    return TooLarge("alltoall");
#endif
  }
  if (s.ok()) s = Wait(&req, "MPI_Ialltoallv");
  return s;
}

Status MpiTransport::ReduceScatter(const void* input, void* output,
                                   const std::vector<int64_t>& counts, DataType dtype, ReduceOp op) {
  MPI_Datatype type;
  MPI_Op mpi_op;
  if (!MpiReduction(dtype, op, &type, &mpi_op)) return NoReduction(dtype, op);
  MPI_Request req;
  Status s;
  if (FitsInt(counts)) {
    auto c = ToInt(counts);
    s = MpiCheck(MPI_Ireduce_scatter(input, output, c.data(), type, mpi_op, comm_, &req),
              "MPI_Ireduce_scatter");
  } else {
#if MPI_VERSION >= 4
    std::vector<MPI_Count> c(counts.begin(), counts.end());
    s = MpiCheck(MPI_Ireduce_scatter_c(input, output, c.data(), type, mpi_op, comm_, &req),
              "MPI_Ireduce_scatter_c");
#else
    return TooLarge("reducescatter");
#endif
  }
  if (s.ok()) s = Wait(&req, "MPI_Ireduce_scatter");
  return s;
}

Status MpiTransport::Barrier() {
  MPI_Request req;
  Status s = MpiCheck(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
  if (s.ok()) s = Wait(&req, "MPI_Ibarrier");
  return s;
}

Status MpiTransport::SendRecv(const void* send, int64_t send_bytes, void* recv,
                                int64_t recv_bytes, int peer, int tag) {
  // Chunks of at most kMaxChunk bytes, all posted at once: the peer posts the
  // same chunks in the same order, which MPI matches in order.
  std::vector<MPI_Request> requests;
  Status s;
  for (int64_t offset = 0; offset < recv_bytes && s.ok(); offset += kMaxChunk) {
    requests.emplace_back();
    s = MpiCheck(MPI_Irecv(static_cast<uint8_t*>(recv) + offset,
                        static_cast<int>(std::min(kMaxChunk, recv_bytes - offset)), MPI_BYTE, peer,
                        tag, comm_, &requests.back()),
              "MPI_Irecv");
  }
  for (int64_t offset = 0; offset < send_bytes && s.ok(); offset += kMaxChunk) {
    requests.emplace_back();
    s = MpiCheck(MPI_Isend(static_cast<const uint8_t*>(send) + offset,
                        static_cast<int>(std::min(kMaxChunk, send_bytes - offset)), MPI_BYTE, peer,
                        tag, comm_, &requests.back()),
              "MPI_Isend");
  }
  if (!s.ok()) return s;
  const std::string what = "MPI_Isend/MPI_Irecv with rank " + std::to_string(peer);
  return WaitAll(&requests, what.c_str());
}

Status MpiTransport::StartAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                    ReduceOp op, double scale, std::unique_ptr<TransportWork>* work) {
  // Callers keep buckets within one call; this guards against a silent
  // truncation of the count should that ever change.
  if (count > INT_MAX) return TooLarge("allreduce bucket");
  MPI_Datatype type;
  MPI_Op mpi_op;
  if (!MpiReduction(dtype, op, &type, &mpi_op)) return NoReduction(dtype, op);
  auto w = std::make_unique<MpiWork>(this, activity::kMpiAllreduce, recv, count, dtype, scale);
  Status s = MpiCheck(MPI_Iallreduce(MpiSend(send), recv, static_cast<int>(count), type, mpi_op, comm_,
                                  w->request()),
                   "MPI_Iallreduce");
  if (s.ok()) *work = std::move(w);
  return s;
}

Status MpiTransport::StartAllgather(const void* send, int64_t bytes, void* recv,
                                    std::unique_ptr<TransportWork>* work) {
  if (bytes > INT_MAX) return TooLarge("allgather of a compressed bucket");
  auto w = std::make_unique<MpiWork>(this, activity::kMpiAllgather, recv, 0, DataType::kUInt8, 1.0);
  Status s = MpiCheck(MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv,
                                  static_cast<int>(bytes), MPI_BYTE, comm_, w->request()),
                   "MPI_Iallgather");
  if (s.ok()) *work = std::move(w);
  return s;
}

}  // namespace hvdlite
